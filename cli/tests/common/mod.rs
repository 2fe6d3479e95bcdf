//! Running the `attn-policy` binary from the integration tests and reading what it printed.
// Each test binary compiles this module on its own and uses only part of it.
#![allow(dead_code)]

use std::process::{Command, Output};

use serde_json::Value as Json;

/// The binary under test: `$ATTN_POLICY_BIN` when set (on the GPU machine the test executable
/// and the binary are carried together, without Cargo), else the one Cargo built.
pub fn bin() -> String {
    std::env::var("ATTN_POLICY_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_attn-policy").into())
}

/// Runs the binary with `args`, capturing its output.
pub fn run(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .output()
        .expect("binary runs")
}

/// Standard output and standard error, in that order.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The JSON document on standard output of the run with `args`; panics, naming the command
/// and showing everything it printed, when there is none.
pub fn json_of(args: &[&str], o: &Output) -> Json {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("`{}` printed no JSON ({e}): {}", args.join(" "), text(o)))
}

/// Runs `args`, which must print a JSON document: the exit code and the document.
pub fn run_json(args: &[&str]) -> (i32, Json) {
    let o = run(args);
    (o.status.code().unwrap_or(-1), json_of(args, &o))
}

/// The words of a command line, split at white space: `words("run --pack te")` for
/// `["run", "--pack", "te"]` (only for arguments that contain no white space).
pub fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// What a run printed, as text, and its exit code (`None`: killed by a signal).
pub struct Out {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs a prepared command (its environment set by the caller) and keeps what it printed.
pub fn run_with(c: &mut assert_cmd::Command) -> Out {
    let o = c.output().expect("runs");
    Out {
        code: o.status.code(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// Exit 2, nothing on stdout, no panic, and stderr holds every one of `words`.
pub fn refused(o: &Out, words: &[&str]) {
    assert_eq!(
        o.code,
        Some(2),
        "stdout: {}\nstderr: {}",
        o.stdout,
        o.stderr
    );
    assert!(
        o.stdout.is_empty(),
        "nothing is printed on stdout: {}",
        o.stdout
    );
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    for w in words {
        assert!(o.stderr.contains(w), "expected `{w}` in: {}", o.stderr);
    }
}
