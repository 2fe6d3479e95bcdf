//! `attn-policy coverage CORPUS`: how often each rule fired on a corpus.

use std::path::PathBuf;

use clap::Args;

use super::args::PackArgs;
use attn_policy::analysis::coverage::coverage;
use attn_policy::corpus::read_corpus;

#[derive(Args, Debug)]
#[command(after_help = "\
Like `opa test --coverage`: every rule with the number of records where it fired, then the rules
no record exercised. Unanswered probes count as \"supported\".

Examples:
  attn-policy coverage corpus.jsonl.gz
  attn-policy coverage corpus.jsonl --rules rules/te --json

Exit codes: 0 every rule exercised, 1 some rule never fired, 2 bad input.")]
pub struct CoverageArgs {
    /// Conformance corpus (.jsonl or .jsonl.gz, one {"id", "config"} record per line).
    pub corpus: PathBuf,
    #[command(flatten)]
    pub pack: PackArgs,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: CoverageArgs) -> i32 {
    let policy = match a.pack.load(false) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let records = match read_corpus(&a.corpus) {
        Ok(r) => r,
        Err(e) => return super::fail(e),
    };
    let r = coverage(&policy, &records);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&r).expect("serialisable")
        );
    } else {
        println!("{} record(s), {} invalid", r.records, r.invalid.len());
        for c in &r.rules {
            println!("{:>8}  {:<12} {}", c.fired, c.rule, c.backend);
        }
        println!(
            "\nrule coverage {:.1}% ({} of {} rules never fired{}{})",
            r.ratio * 100.0,
            r.never_fired.len(),
            r.rules.len(),
            if r.never_fired.is_empty() { "" } else { ": " },
            r.never_fired.join(", ")
        );
        for e in &r.invalid {
            eprintln!("invalid record: {e}");
        }
    }
    if r.never_fired.is_empty() { 0 } else { 1 }
}
