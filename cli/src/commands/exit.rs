//! The exit codes every command returns (`--help` prints them, docs/cli.md has the same table)
//! and the helpers that pick one. The commands and `mod.rs` name this file; it names none of
//! them (no circle of files).

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
