//! Subcommands of `attn-policy`. Every command exits with a code of [`exit`] (printed by
//! `--help` and in docs/cli.md).

pub mod args;
mod bench;
mod check;
mod conformance;
mod coverage;
mod diff;
mod diff_md;
mod executors;
mod exit;
mod explain;
mod gaps;
mod info;
mod matrix;
mod progress;
mod run;
mod why_not;

use clap::{CommandFactory, Parser, Subcommand};

pub use exit::{
    EXIT_BAD_INPUT, EXIT_FOUND, EXIT_NOT_RUN, EXIT_OK, EXIT_VERIFY_FAILED, analysis_exit, fail,
};

/// Decide which attention backend may run an attention call, and say why.
#[derive(Parser, Debug)]
#[command(name = "attn-policy", version, long_version = info::LONG_VERSION.as_str(), about, long_about = None, after_help = concat!("\
Examples:
  attn-policy explain --preset gemma4-global-cp-p2p
  attn-policy explain --preset gemma4-global-cp-p2p --sm 90 --format te
  attn-policy explain examples/gemma4-global.json --json
  echo '{\"head_dim_qk\": 512, \"head_dim_v\": 512}' | attn-policy explain - --sm 100
  attn-policy presets --show gemma4-global

Environment: explain, why-not and run read NVTE_* variables from the shell as TransformerEngine
does (--env NAME=VALUE overrides one, --no-env ignores them); conformance, coverage, gaps, diff
and bench never read the shell environment.

", crate::exit_codes!()))]
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
    /// List the named presets usable with --preset; --show NAME prints one resolved.
    Presets(info::PresetsArgs),
    /// List every fact (input field) of a pack's family with its type, domain and default.
    Facts(info::FactsArgs),
    /// Load, type-check and lint a pack (never/always-firing, subsumed, capabilities, ...).
    Check(check::CheckArgs),
    /// Every region of the configuration space where no backend is selected (exact).
    Gaps(gaps::GapsArgs),
    /// Regions where two packs select different backends (exact).
    Diff(diff::DiffArgs),
    /// A support matrix: the backend per combination of two facts (Markdown, HTML, SVG, JSON).
    Matrix(matrix::MatrixArgs),
    /// How to get BACKEND: the switch that selects it, or the smallest verified input changes.
    WhyNot(why_not::WhyNotArgs),
    /// How often each rule fired on a corpus; rules never exercised.
    Coverage(coverage::CoverageArgs),
    /// Decide every record of a TE corpus and compare with TE's decisions (agreement, classes).
    Conformance(conformance::ConformanceArgs),
    /// Print the long description of a diagnostic code (E-TYPE, W-SUBSUMED, ...).
    ExplainCode(info::ExplainCodeArgs),
    /// Print shell completions (bash, zsh, fish, elvish, powershell) to stdout.
    Completions(info::CompletionsArgs),
    /// Print the man page (roff) to stdout.
    #[command(after_help = "\
Examples:
  attn-policy man > attn-policy.1 && man ./attn-policy.1

Exit codes: 0 printed.")]
    Man,
}

pub fn main() -> i32 {
    restore_sigpipe();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() {
                EXIT_BAD_INPUT
            } else {
                EXIT_OK
            };
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
        Command::Presets(a) => info::presets(a),
        Command::Facts(a) => info::facts(a),
        Command::ExplainCode(a) => info::explain_code(a),
        Command::Completions(a) => info::completions(a, Cli::command()),
        Command::Man => info::man(Cli::command()),
    }
}

/// A closed pipe (`attn-policy gaps | head -1`) ends the process quietly, as it ends `cat`:
/// Rust ignores SIGPIPE, so every print would fail and `println!` would panic (exit 101).
fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: called first in main, before any thread exists; SIG_DFL is a valid disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
