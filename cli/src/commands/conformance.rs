//! `attn-policy conformance`: decide every record of a TE conformance corpus and compare.

use std::path::PathBuf;

use clap::Args;

use super::args::PackArgs;
use attn_policy::conformance;
use attn_policy::corpus::read_corpus;

#[derive(Args, Debug)]
#[command(after_help = "\
Examples:
  attn-policy conformance ../shared/conformance/te-2.20.2-corpus-a.jsonl.gz --parity
  attn-policy conformance corpus.jsonl --json --top 20
  attn-policy conformance corpus.jsonl.gz --parity --min-rate 1.0")]
pub struct ConformanceArgs {
    /// Corpus: JSON lines (`.jsonl`) or gzip-compressed (`.jsonl.gz`), one record per line.
    pub file: PathBuf,
    #[command(flatten)]
    pub pack: PackArgs,
    /// Print the report as a JSON object (total, agree, disagree, rate, per_backend, classes).
    #[arg(long)]
    pub json: bool,
    /// How many classes of disagreement to list.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub top: usize,
    /// Exit with status 1 when the agreement rate is below this fraction (e.g. 1.0).
    #[arg(long, value_name = "RATE")]
    pub min_rate: Option<f64>,
}

pub fn run(a: ConformanceArgs) -> i32 {
    let policy = match a.pack.load(false) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let records = match read_corpus(&a.file) {
        Ok(r) => r,
        Err(e) => return super::fail(e.to_string()),
    };
    let report = conformance::run(&policy, &records);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report.to_json(a.top)).expect("json")
        );
    } else {
        print!("{}", report.to_text(a.top));
    }
    match a.min_rate {
        Some(min) if report.rate() < min => 1,
        _ => 0,
    }
}
