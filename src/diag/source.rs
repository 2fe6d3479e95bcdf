//! Source files of a pack and `file:line:col` locations (what diagnostics and explanations
//! point at). The YAML-specific mapping from a node's span to a location is in
//! `pack::source`.

use serde::Serialize;

/// Where a diagnostic points: a byte range in one source file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Default)]
pub struct Loc {
    pub file: u16,
    pub start: usize,
    pub end: usize,
}

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
