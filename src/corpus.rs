//! Reading conformance corpora: JSON lines, optionally gzip-compressed (`.gz`), one record per
//! line with at least `id` and `config` (see ../shared/conformance/README.md).

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use serde_json::Value as Json;

/// One record; `decision` is TE's answer (null when TE raised).
#[derive(Clone, Debug)]
pub struct Record {
    pub id: String,
    pub line: usize,
    pub config: Json,
    pub decision: Json,
    pub raw: Json,
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
}

/// Reads every record of a `.jsonl` or `.jsonl.gz` file.
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
    for (i, line) in BufReader::new(reader).lines().enumerate() {
        let line = line.map_err(io)?;
        if line.trim().is_empty() {
            continue;
        }
        let rec_err = |message: String| CorpusError::Record {
            path: path.display().to_string(),
            line: i + 1,
            message,
        };
        let raw: Json = serde_json::from_str(&line).map_err(|e| rec_err(e.to_string()))?;
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
            config,
            decision,
            raw,
        });
    }
    Ok(out)
}
