//! Reading conformance corpora: JSON lines, optionally gzip-compressed (`.gz`), one record per
//! line with at least a `config` and usually an `id` (see tests/corpora/README.md).

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use serde_json::Value as Json;

use crate::facts::{ConfigText, Facts, InputError, InputErrorKind};

/// One record; `decision` is TE's answer (null when TE raised).
#[derive(Clone, Debug)]
pub struct Record {
    pub id: String,
    pub line: usize,
    /// `file:line`, for messages.
    pub location: String,
    pub config: Json,
    pub decision: Json,
    pub raw: Json,
    /// The record's text is JSON but not a valid record (a key given twice): an input error
    /// of this record, reported by the commands that read the corpus like any invalid config.
    pub error: Option<InputError>,
}

impl Record {
    /// Where an error in this record's config is (`file:line`).
    pub fn locate_config_error(&self) -> Option<String> {
        Some(self.location.clone())
    }

    /// The record's facts (te family): its own reading error, else the config's.
    pub fn facts(&self) -> Result<Facts, InputError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        Facts::from_json(&self.config).map_err(|e| e.at(self.locate_config_error()))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Record {
        path: String,
        line: usize,
        message: String,
    },
    /// No record at all: a rate or a median over nothing would claim what was not measured.
    #[error("{path}: no records (the corpus is empty: one JSON object per line expected)")]
    Empty { path: String },
}

/// Reads every record of a `.jsonl` or `.jsonl.gz` file; a file without any is an error.
pub fn read_corpus(path: &Path) -> Result<Vec<Record>, CorpusError> {
    let io = |source| CorpusError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let reader: Box<dyn Read> = if path.extension().is_some_and(|e| e == "gz") {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let mut out = Vec::new();
    // Lines as bytes: a read error or a line that is not UTF-8 is reported with its line number
    // (a truncated `.gz` fails part-way; `lines()` would say neither where nor why).
    for (i, line) in BufReader::new(reader).split(b'\n').enumerate() {
        let rec_err = |message: String| CorpusError::Record {
            path: path.display().to_string(),
            line: i + 1,
            message,
        };
        let mut line = line.map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                " (the file ends early: is it truncated?)"
            } else {
                ""
            };
            rec_err(format!("cannot read it: {e}{hint}"))
        })?;
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        let line = String::from_utf8(line).map_err(|e| {
            let col = e.utf8_error().valid_up_to() + 1;
            rec_err(format!("not UTF-8 text (an invalid byte at column {col})"))
        })?;
        if line.trim().is_empty() {
            continue;
        }
        // Parsed with key positions: a duplicate key makes this record an input error (the
        // corpus stays readable); text that is not JSON makes the corpus unreadable.
        let file = path.display().to_string();
        let location = format!("{file}:{}", i + 1);
        let (raw, error) = match ConfigText::json(&file, &line) {
            Ok(text) => (text.value, None),
            Err(mut e) if e.kind == InputErrorKind::DuplicateKey => {
                // The text is one line: its line 1 is the corpus' line i + 1.
                e.location = e
                    .location
                    .as_deref()
                    .and_then(|l| l.strip_prefix(&format!("{file}:1:")))
                    .map(|col| format!("{location}:{col}"));
                let raw = serde_json::from_str(&line).map_err(|e| rec_err(e.to_string()))?;
                (raw, Some(e))
            }
            Err(mut e) => {
                // The location names the one-line text (`file:1:col`); the line is the corpus'.
                let col = e
                    .location
                    .take()
                    .and_then(|l| l.strip_prefix(&format!("{file}:1:")).map(str::to_string));
                let at = col.map(|c| format!(" (column {c})")).unwrap_or_default();
                return Err(rec_err(format!("{e}{at}")));
            }
        };
        let config = raw
            .get("config")
            .cloned()
            .ok_or_else(|| rec_err("record has no `config`".into()))?;
        let id = raw
            .get("id")
            .and_then(Json::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("line-{}", i + 1));
        let decision = raw.get("decision").cloned().unwrap_or(Json::Null);
        out.push(Record {
            id,
            line: i + 1,
            location,
            config,
            decision,
            raw,
            error,
        });
    }
    if out.is_empty() {
        return Err(CorpusError::Empty {
            path: path.display().to_string(),
        });
    }
    Ok(out)
}
