//! `attn-policy coverage CORPUS`: how often each rule fired on a corpus.

use std::path::PathBuf;

use clap::Args;

use super::args::PackArgs;
use super::progress::Progress;
use attn_policy::read_corpus;
use attn_policy_analysis::coverage::coverage;

#[derive(Args, Debug)]
#[command(after_help = "\
Like `opa test --coverage`: every rule id with the number of records where it fired (a rule that
declines several backends counts once per record), then the rule ids no record exercised.
Unanswered probes count as \"supported\". Records whose config is structurally invalid are input
errors (listed with their line, not decided). The shell environment is never read.

Examples:
  attn-policy coverage corpus.jsonl.gz
  attn-policy coverage corpus.jsonl --rules rules/te --json

Exit codes: 0 every rule exercised (and at least --min-ratio), 1 some rule never fired (or the
ratio is below --min-ratio), 2 bad input.")]
pub struct CoverageArgs {
    /// Conformance corpus (.jsonl or .jsonl.gz, one {"id", "config"} record per line).
    pub corpus: PathBuf,
    #[command(flatten)]
    pub pack: PackArgs,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Exit 0 when at least this fraction of rule ids fired (default: every rule must fire).
    #[arg(long, value_name = "RATIO", value_parser = super::conformance::rate)]
    pub min_ratio: Option<f64>,
}

pub fn run(a: CoverageArgs) -> i32 {
    let policy = match a.pack.load(false) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let progress = Progress::start(format!("coverage: reading {}", a.corpus.display()));
    let records = match read_corpus(&a.corpus) {
        Ok(r) => r,
        Err(e) => return progress.fail(e),
    };
    progress.stage(format!(
        "coverage: deciding {} records with pack `{}`",
        records.len(),
        policy.name
    ));
    let r = coverage(&policy, &records);
    progress.finish();
    if let Some(e) = super::conformance::nothing_valid(&policy, &r.input_errors, r.records) {
        return super::fail(e);
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&r).expect("serialisable")
        );
    } else {
        println!(
            "{} record(s), {} input error(s) (not decided)",
            r.records,
            r.input_errors.len()
        );
        for c in &r.rules {
            println!("{:>8}  {:<12} {}", c.fired, c.rule, c.backends.join(", "));
        }
        println!(
            "\nrule coverage {:.1}% ({} of {} rule ids never fired{}{})",
            r.ratio * 100.0,
            r.never_fired.len(),
            r.rules.len(),
            if r.never_fired.is_empty() { "" } else { ": " },
            r.never_fired.join(", ")
        );
        if let Some(e) = r.input_errors.first() {
            println!(
                "input errors: {}, e.g. line {} ({}): {}",
                r.input_errors.len(),
                e.line,
                e.id,
                e.error
            );
        }
    }
    let enough = match a.min_ratio {
        Some(min) => r.ratio >= min,
        None => r.never_fired.is_empty(),
    };
    if enough {
        super::EXIT_OK
    } else {
        if let Some(min) = a.min_ratio {
            eprintln!(
                "error: --min-ratio {min}: rule coverage {:.4} is below it ({} rule ids never fired)",
                r.ratio,
                r.never_fired.len()
            );
        }
        super::EXIT_FOUND
    }
}
