//! Subcommands of `attn-policy`. Every command exits with a code of [`EXIT_CODES`] (printed
//! by `--help` and in docs/cli.md).

pub mod args;
mod bench;
mod check;
mod conformance;
mod coverage;
mod diff;
mod executors;
mod explain;
mod gaps;
mod info;
mod matrix;
mod run;
mod why_not;

use clap::{Parser, Subcommand};

/// 0: a backend was selected, or the command found nothing wrong.
pub const EXIT_OK: i32 = 0;
/// 1: no backend can serve the input, a search found gaps or differences, a check found
/// problems, a rate or coverage fell short.
pub const EXIT_FOUND: i32 = 1;
/// 2: bad input (arguments, config, corpus) or bad rules (the pack does not load).
pub const EXIT_BAD_INPUT: i32 = 2;
/// 3: a search ran out of budget with nothing found (no claim either way).
pub const EXIT_INCOMPLETE: i32 = 3;
/// 4: `run`: no entry of the selected backend's executor chain ran, or `--no-substitute`
/// refused a substitute.
pub const EXIT_NOT_RUN: i32 = 4;
/// 5: `run`: the executor ran but verification against the float64 reference failed.
pub const EXIT_VERIFY_FAILED: i32 = 5;

/// The exit-code table, as `--help` prints it (docs/cli.md has the same table; a test keeps
/// them equal). A macro so that help texts can `concat!` it.
#[macro_export]
macro_rules! exit_codes {
    () => {
        "Exit codes (every command):
  0  ok: a backend was selected, or nothing was found wrong
  1  no backend can serve the input; gaps, differences or check findings found; a rate or
     coverage below what was asked
  2  bad input (arguments, config file, corpus) or bad rules (the pack does not load)
  3  a search ran out of budget with nothing found (INCOMPLETE: no claim either way)
  4  run: no entry of the selected backend's executor chain ran (unavailable, refused or
     failed), or --no-substitute refused a substitute
  5  run: verification against the float64 reference failed"
    };
}

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

", exit_codes!()))]
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
        Command::Completions(a) => info::completions(a),
        Command::Man => info::man(),
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

/// Exit code of a search (`gaps`, `diff`): 1 when it found regions, 0 when it found none and
/// finished, 3 when it found none but ran out of budget (no claim either way).
pub fn analysis_exit(found: bool, complete: bool) -> i32 {
    match (found, complete) {
        (true, _) => EXIT_FOUND,
        (false, true) => EXIT_OK,
        (false, false) => EXIT_INCOMPLETE,
    }
}

/// Prints an error to stderr and returns exit code 2.
pub fn fail(message: impl std::fmt::Display) -> i32 {
    eprintln!("error: {message}");
    EXIT_BAD_INPUT
}
