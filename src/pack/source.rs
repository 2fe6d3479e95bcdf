//! Source files of a pack and the mapping from YAML scalar spans to file positions.

use serde_saphyr::Spanned;

use crate::diag::Loc;
use crate::lang::Span;

#[derive(Clone, Debug)]
pub struct SourceFile {
    /// Display name, e.g. `rules/te/frost_attention.yaml`.
    pub name: String,
    pub text: String,
    line_starts: Vec<usize>,
}

impl SourceFile {
    pub fn new(name: String, text: String) -> SourceFile {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        SourceFile {
            name,
            text,
            line_starts,
        }
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let line = self.line_starts.partition_point(|&s| s <= offset) - 1;
        let start = self.line_starts[line];
        let col = self
            .text
            .get(start..offset)
            .map_or(offset - start, |s| s.chars().count());
        (line + 1, col + 1)
    }

    /// Byte offset of a 1-based line and column, as serde-saphyr reports them.
    pub fn offset_of(&self, line: u64, col: u64) -> usize {
        let Some(&start) = self.line_starts.get((line as usize).saturating_sub(1)) else {
            return self.text.len();
        };
        let rest = &self.text[start..];
        rest.char_indices()
            .nth((col as usize).saturating_sub(1))
            .map_or(self.text.len(), |(i, _)| start + i)
    }
}

#[derive(Clone, Debug, Default)]
pub struct SourceMap {
    pub files: Vec<SourceFile>,
}

impl SourceMap {
    pub fn add(&mut self, name: String, text: String) -> u16 {
        self.files.push(SourceFile::new(name, text));
        (self.files.len() - 1) as u16
    }

    pub fn get(&self, id: u16) -> Option<&SourceFile> {
        self.files.get(id as usize)
    }

    /// `file:line:col` of a location.
    pub fn describe(&self, loc: Loc) -> String {
        match self.get(loc.file) {
            Some(f) => {
                let (l, c) = f.line_col(loc.start);
                format!("{}:{l}:{c}", f.name)
            }
            None => "<unknown>".into(),
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_is_one_based() {
        let f = SourceFile::new("x".into(), "ab\ncd\n".into());
        assert_eq!(f.line_col(0), (1, 1));
        assert_eq!(f.line_col(4), (2, 2));
        assert_eq!(f.offset_of(2, 2), 4);
    }
}
