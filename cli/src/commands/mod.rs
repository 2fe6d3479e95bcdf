//! Subcommands of `attn-policy`. Exit codes: 0 a backend was selected (or the command
//! succeeded), 1 no backend can serve the input (or a check found problems), 2 bad input or bad
//! rules.

pub mod args;
mod bench;
mod check;
mod conformance;
mod coverage;
mod diff;
mod executors;
mod explain;
mod gaps;
mod matrix;
mod run;
mod why_not;

use clap::{Parser, Subcommand};

/// Decide which attention backend may run an attention call, and say why.
#[derive(Parser, Debug)]
#[command(name = "attn-policy", version, about, long_about = None, after_help = "\
Examples:
  attn-policy explain --preset gemma4-global-cp-p2p
  attn-policy explain --preset gemma4-global-cp-p2p --sm 90 --format te
  attn-policy explain config.json --json
  echo '{\"head_dim_qk\": 512, \"head_dim_v\": 512}' | attn-policy explain - --sm 100
  attn-policy presets

Exit codes: 0 selected, 1 no backend can serve the input, 2 bad input or bad rules.")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Decide for one configuration and explain every backend's status.
    Explain(explain::ExplainArgs),
    /// Select an executor with a pack (default `native`), run it on random inputs, verify, report.
    Run(run::RunArgs),
    /// List every executor with its manifest and whether it can run here (and why not).
    Executors(executors::ExecutorsArgs),
    /// Median time per decision (uncached, full explanation) over a corpus or the presets.
    Bench(bench::BenchArgs),
    /// List the named presets usable with --preset.
    Presets,
    /// List every fact (input field) of a pack's family with its type and default.
    Facts(FactsArgs),
    /// Load, type-check and lint a pack (never/always-firing, subsumed, capabilities, ...).
    Check(check::CheckArgs),
    /// Every region of the configuration space where no backend is selected (exact).
    Gaps(gaps::GapsArgs),
    /// Regions where two packs select different backends (exact).
    Diff(diff::DiffArgs),
    /// A support matrix: the backend per combination of two facts (Markdown, HTML, SVG, JSON).
    Matrix(matrix::MatrixArgs),
    /// Smallest verified input changes that would make BACKEND eligible.
    WhyNot(why_not::WhyNotArgs),
    /// How often each rule fired on a corpus; rules never exercised.
    Coverage(coverage::CoverageArgs),
    /// Decide every record of a TE corpus and compare with TE's decisions (agreement, classes).
    Conformance(conformance::ConformanceArgs),
}

pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    match cli.command {
        Command::Explain(a) => explain::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Check(a) => check::run(a),
        Command::Gaps(a) => gaps::run(a),
        Command::Diff(a) => diff::run(a),
        Command::Matrix(a) => matrix::run(a),
        Command::WhyNot(a) => why_not::run(a),
        Command::Coverage(a) => coverage::run(a),
        Command::Conformance(a) => conformance::run(a),
        Command::Run(a) => run::run(a),
        Command::Executors(a) => executors::run(a),
        Command::Presets => {
            for p in attn_policy::facts::presets::PRESETS {
                println!("{:<30} {}", p.name, p.about);
            }
            0
        }
        Command::Facts(a) => match a.pack.load(false) {
            Ok(policy) => {
                print!("{}", policy.schema.markdown_table());
                0
            }
            Err(code) => code,
        },
    }
}

/// `attn-policy facts`: the facts of a pack's family (`--pack torch`: PyTorch SDPA's).
#[derive(clap::Args, Debug)]
pub struct FactsArgs {
    #[command(flatten)]
    pub pack: args::PackArgs,
}

/// Prints an error to stderr and returns exit code 2.
/// Exit code of a search (`gaps`, `diff`): 1 when it found regions, 0 when it found none and
/// finished, 3 when it found none but ran out of budget (no claim either way).
pub fn analysis_exit(found: bool, complete: bool) -> i32 {
    match (found, complete) {
        (true, _) => 1,
        (false, true) => 0,
        (false, false) => 3,
    }
}

pub fn fail(message: impl std::fmt::Display) -> i32 {
    eprintln!("error: {message}");
    2
}
