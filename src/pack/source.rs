//! The mapping from YAML node spans (serde-saphyr) and expression spans to `file:line:col`
//! locations in a pack's [`SourceMap`].

use serde_saphyr::Spanned;

use crate::diag::Loc;
pub use crate::diag::source::SourceMap;
use crate::lang::Span;

impl SourceMap {
    /// Location of a YAML node (its first character).
    pub fn node_loc<T>(&self, file: u16, node: &Spanned<T>) -> Loc {
        let f = &self.files[file as usize];
        let start = f.offset_of(node.referenced.line(), node.referenced.column());
        Loc {
            file,
            start,
            end: start,
        }
    }

    /// Maps a span inside an expression string to the file. Exact for plain and simple quoted
    /// scalars and for `|` blocks; otherwise the whole scalar's start (the value is then shown
    /// in the diagnostic's label).
    pub fn expr_loc(&self, file: u16, node: &Spanned<String>, span: Span) -> Loc {
        let f = &self.files[file as usize];
        let base = self.node_loc(file, node).start;
        let value = node.value.as_str();
        let text = &f.text[base..];
        let exact = |off: usize| Loc {
            file,
            start: off + span.start,
            end: off + span.end.max(span.start),
        };
        if text.starts_with(value) && !value.is_empty() {
            return exact(base);
        }
        if (text.starts_with('"') || text.starts_with('\'')) && text[1..].starts_with(value) {
            return exact(base + 1);
        }
        // Multi-line (block or folded) scalar: find each value line in the file, in order.
        let mut cursor = base;
        let mut consumed = 0;
        for line in value.split_inclusive('\n') {
            let content = line.trim_end_matches('\n');
            let line_end = consumed + line.len();
            let found = if content.is_empty() {
                None
            } else {
                f.text[cursor..].find(content)
            };
            if let Some(found) = found {
                let at = cursor + found;
                if span.start >= consumed && span.start <= consumed + content.len() {
                    let start = at + (span.start - consumed);
                    let end = start
                        + (span
                            .end
                            .min(consumed + content.len())
                            .saturating_sub(span.start));
                    return Loc { file, start, end };
                }
                cursor = at + content.len();
            }
            consumed = line_end;
        }
        Loc {
            file,
            start: base,
            end: base,
        }
    }
}
