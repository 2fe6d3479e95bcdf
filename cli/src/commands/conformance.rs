//! `attn-policy conformance`: decide every record of a TE conformance corpus and compare.

use std::path::PathBuf;

use clap::Args;

use super::args::PackArgs;
use super::progress::Progress;
use attn_policy::conformance;
use attn_policy::read_corpus;

#[derive(Args, Debug)]
#[command(after_help = concat!("\
Records whose config is structurally invalid (docs/facts.md: KV heads that do not divide the query
heads, a dropout above 1, a word for a version) are input errors: listed with their line, not
decided, and not in the agreement rate, with or without --parity. The shell environment is
never read: each record's `env` is its environment.

Examples:
  attn-policy conformance tests/corpora/te-2.20.2-corpus-a.jsonl.gz --parity
  attn-policy conformance corpus.jsonl --json --top 20
  attn-policy conformance corpus.jsonl.gz --parity --min-rate 1.0

", crate::exit_codes!()))]
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
    /// Exit with status 1 when the agreement rate (over valid records) is below this fraction
    /// (e.g. 1.0).
    #[arg(long, value_name = "RATE", value_parser = rate)]
    pub min_rate: Option<f64>,
}

pub fn run(a: ConformanceArgs) -> i32 {
    let policy = match a.pack.load(false) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let progress = Progress::start(format!("conformance: reading {}", a.file.display()));
    let records = match read_corpus(&a.file) {
        Ok(r) => r,
        Err(e) => return progress.fail(e),
    };
    progress.stage(format!(
        "conformance: deciding {} records with pack `{}`",
        records.len(),
        policy.name
    ));
    let report = conformance::run(&policy, &records);
    progress.finish();
    if let Some(e) = nothing_valid(&policy, &report.input_errors, report.total) {
        return super::fail(e);
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report.to_json(a.top)).expect("json")
        );
    } else {
        print!("{}", report.to_text(a.top));
    }
    match a.min_rate {
        Some(min) if report.rate() < min => {
            eprintln!(
                "error: --min-rate {min}: agreement {}/{} valid records = {:.4} is below it ({} \
                 disagree; largest class: {})",
                report.agree,
                report.valid(),
                report.rate(),
                report.disagree(),
                report
                    .largest_classes()
                    .first()
                    .map(|(k, c)| format!("{} x {}, e.g. {}", c.count, k.0, c.example))
                    .unwrap_or_else(|| "-".into())
            );
            super::EXIT_FOUND
        }
        _ => super::EXIT_OK,
    }
}

/// The error when no record of a corpus is a valid configuration for the pack: a rate or a
/// coverage over nothing claims what was not measured (often a corpus of another fact family).
pub fn nothing_valid(
    policy: &attn_policy::Policy,
    errors: &[attn_policy::conformance::RecordError],
    total: usize,
) -> Option<String> {
    let first = errors.first().filter(|_| errors.len() == total)?;
    Some(no_valid_record(policy, total, &first.error))
}

/// What `conformance`, `coverage` and `bench` say when none of a corpus's `total` records is a
/// valid configuration for the pack, with the first record's error.
pub fn no_valid_record(
    policy: &attn_policy::Policy,
    total: usize,
    first: &dyn std::fmt::Display,
) -> String {
    format!(
        "none of the {total} records is a valid configuration for pack `{}` (fact family `{}`: \
         is the corpus of another family?); the first: {first}",
        policy.name, policy.schema.family
    )
}

/// A fraction in [0, 1].
pub fn rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
        _ => Err(format!("expected a fraction in [0, 1], got `{s}`")),
    }
}
