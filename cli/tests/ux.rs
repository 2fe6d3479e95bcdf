//! A new user's pass over the command line: `--help` that says what every flag does, bad input
//! refused with what is wrong and where (exit 2, never a panic, never a misleading word), and
//! a status line for long work on stderr, only on a terminal.

use std::io::Write;
use std::path::PathBuf;

use assert_cmd::Command;

mod common;
use common::{Out, refused, run_with};

fn cmd() -> Command {
    let mut c = Command::cargo_bin("attn-policy").expect("binary");
    // Tests run without a terminal; the progress override must not leak in from the shell.
    c.env_remove("ATTN_POLICY_PROGRESS");
    c.env("NO_COLOR", "1");
    c
}

fn run(args: &[&str]) -> Out {
    run_with(cmd().args(args).arg("--no-env"))
}

/// Runs without adding `--no-env` (for commands that do not take it).
fn run_plain(args: &[&str]) -> Out {
    run_with(cmd().args(args))
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("attn-policy-ux-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn repo(path: &str) -> String {
    format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"))
}

// ---- --help ----

/// The subcommands `attn-policy --help` lists (without `help`).
fn subcommands() -> Vec<String> {
    let help = run_plain(&["--help"]).stdout;
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn every_option_of_every_command_says_what_it_does() {
    let commands = subcommands();
    assert!(
        commands.len() >= 15 && commands.iter().any(|c| c == "explain"),
        "{commands:?}"
    );
    let mut bare = Vec::new();
    for c in &commands {
        let help = run_plain(&[c, "-h"]).stdout;
        // The Options section: from `Options:` to the first empty line.
        let lines: Vec<&str> = help
            .lines()
            .skip_while(|l| *l != "Options:")
            .skip(1)
            .take_while(|l| !l.trim().is_empty())
            .collect();
        assert!(!lines.is_empty(), "{c}: no Options section in:\n{help}");
        for (i, line) in lines.iter().enumerate() {
            let text = line.trim();
            // An option's own line is indented by at most 6 (`  -h, --help`, `      --json`);
            // deeper lines continue a description.
            let indent = line.len() - line.trim_start().len();
            if !text.starts_with('-') || indent > 6 {
                continue;
            }
            // `--flag <V>  What it does`: two spaces separate the description; a description
            // can also start on the next line, indented.
            let inline = text.contains("  ");
            let next = lines.get(i + 1).copied().unwrap_or("");
            let below =
                next.starts_with("   ") && !next.trim().is_empty() && !next.trim().starts_with('-');
            if !inline && !below {
                bare.push(format!("{c}: {text}"));
            }
        }
    }
    assert!(
        bare.is_empty(),
        "options without a description:\n{}",
        bare.join("\n")
    );
}

// ---- bad values ----

#[test]
fn non_finite_numbers_are_named_not_called_null() {
    for (args, flag) in [
        (&["explain", "--softcap", "nan"][..], "--softcap"),
        (&["explain", "--softcap", "inf"][..], "--softcap"),
        (
            &["explain", "--pack", "torch", "--dropout", "NaN"][..],
            "--dropout",
        ),
    ] {
        let o = run(args);
        refused(&o, &[flag, "must be a finite number"]);
        assert!(!o.stderr.contains("null"), "{}", o.stderr);
    }
}

#[test]
fn a_dropout_above_one_is_refused_in_the_torch_family_too() {
    // README: "a dropout of 2 ... is refused"; the te family always did (attention_dropout).
    refused(
        &run(&["explain", "--pack", "torch", "--dropout", "2"]),
        &["--dropout", "dropout_p", "in [0, 1]"],
    );
    refused(
        &run(&["explain", "--pack", "torch", "--set", "dropout_p=-0.5"]),
        &["--set dropout_p", "in [0, 1]"],
    );
    // Still decided inside the domain.
    assert_eq!(
        run(&["explain", "--pack", "torch", "--dropout", "0.1"]).code,
        Some(0)
    );
}

#[test]
fn set_env_and_probe_without_a_name_are_refused_at_the_flag() {
    for (args, flag) in [
        (
            &["explain", "--set", "=5"][..],
            "error: --set: expects PATH=JSON",
        ),
        (
            &["explain", "--set", "a..b=5"][..],
            "error: --set: expects PATH=JSON",
        ),
        (
            &["explain", "--env", "=1"][..],
            "error: --env: expects NAME=VALUE",
        ),
        (
            &["explain", "--probe", "=true"][..],
            "error: --probe: expects NAME=true|false",
        ),
    ] {
        let o = run(args);
        refused(&o, &[flag]);
        // No suggestion for a name that is not there (the empty word was "close" to `id`).
        assert!(!o.stderr.contains("did you mean"), "{}", o.stderr);
    }
}

#[test]
fn sm_that_is_not_a_number_is_named_without_a_misleading_tip() {
    for v in ["-1", "ninety", "1000", "4294967296"] {
        let o = run(&["explain", "--sm", v]);
        assert_eq!(o.code, Some(2), "{}", o.stderr);
        assert!(
            o.stderr.contains("--sm") && o.stderr.contains("expected an sm number"),
            "{}",
            o.stderr
        );
        // clap's own message for `-1` was "unexpected argument" with a tip to write `-- -1`.
        assert!(
            !o.stderr.contains("-- -1") && !o.stderr.contains("unexpected argument"),
            "{}",
            o.stderr
        );
    }
}

#[test]
fn an_empty_or_unreadable_config_says_what_it_is() {
    let d = dir("config");
    let empty = d.join("empty.json");
    std::fs::write(&empty, "  \n").unwrap();
    let e = empty.to_str().unwrap();
    let o = run(&["explain", e]);
    refused(&o, &[e, "is empty; expected a config object"]);
    assert!(!o.stderr.contains("found null"), "{}", o.stderr);

    let mut c = cmd();
    c.args(["explain", "-", "--no-env"]).write_stdin("");
    refused(&run_with(&mut c), &["<stdin>: is empty"]);

    let text = d.join("text.json");
    std::fs::write(&text, "head_dim_qk 128\n").unwrap();
    let t = text.to_str().unwrap();
    refused(
        &run(&["explain", t]),
        &[
            t,
            "found a string",
            "neither a JSON object nor a YAML mapping",
        ],
    );
}

// ---- corpora ----

#[test]
fn an_empty_corpus_is_bad_input_not_a_perfect_score() {
    let d = dir("empty-corpus");
    let f = d.join("empty.jsonl");
    std::fs::write(&f, "\n\n").unwrap();
    let p = f.to_str().unwrap();
    for args in [
        vec!["conformance", p],
        vec!["conformance", p, "--min-rate", "1.0"],
        vec!["coverage", p],
        vec!["bench", "--corpus", p],
        vec!["diff", "te", "te", "--corpus", p],
    ] {
        let o = run_plain(&args);
        refused(&o, &[p, "no records"]);
    }
}

#[test]
fn a_corpus_line_that_is_not_json_names_file_and_line_once() {
    let d = dir("bad-corpus");
    let f = d.join("c.jsonl");
    let mut file = std::fs::File::create(&f).unwrap();
    writeln!(file, "{{\"id\": \"a\", \"config\": {{}}}}").unwrap();
    writeln!(file, "not json").unwrap();
    drop(file);
    let p = f.to_str().unwrap();
    let o = run_plain(&["conformance", p]);
    refused(&o, &[&format!("{p}:2: not JSON"), "(column 2)"]);
    assert_eq!(o.stderr.matches(p).count(), 1, "{}", o.stderr);
}

#[test]
fn why_not_suggests_the_backend_name() {
    refused(
        &run(&["why-not", "flashattention", "--preset", "gemma4-global"]),
        &[
            "no backend `flashattention`",
            "did you mean `FlashAttention`?",
        ],
    );
}

// ---- progress ----

#[test]
fn progress_is_a_stderr_status_line_only_on_a_terminal() {
    let corpus = head_of_corpus("tests/corpora/torch-2.11-sdpa-corpus-a.jsonl.gz", 300);
    for (args, what) in [
        (
            vec!["gaps", "--pack", "torch"],
            "gaps: searching pack `torch`",
        ),
        (
            vec!["diff", "torch", "torch", "--corpus", corpus.as_str()],
            "diff: comparing `torch` and `torch`",
        ),
        (
            vec!["conformance", corpus.as_str(), "--pack", "torch"],
            "conformance: ",
        ),
        (
            vec!["matrix", "--rows", "head_dim=64,128", "--cols", "sm=90,100"],
            "matrix: pack `te` (1 of 1)",
        ),
    ] {
        // Piped (as here): no status line at all, so stderr is empty.
        let piped = run_plain(&args);
        assert!(matches!(piped.code, Some(0 | 1)), "{}", piped.stderr);
        assert!(piped.stderr.is_empty(), "{}", piped.stderr);
        let never = run_with(cmd().args(&args).env("ATTN_POLICY_PROGRESS", "never"));
        assert!(never.stderr.is_empty(), "{}", never.stderr);
        // Forced (as on a terminal): the line is drawn on stderr and erased; stdout unchanged.
        let shown = run_with(
            cmd()
                .args(&args)
                .env("ATTN_POLICY_PROGRESS", "always")
                .env_remove("COLUMNS"),
        );
        assert_eq!(shown.code, piped.code);
        // The same stdout, but for the elapsed time `gaps` and `diff` report.
        let timeless = |s: &str| {
            s.lines()
                .filter(|l| !l.contains("equivalence classes examined"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(
            timeless(&shown.stdout),
            timeless(&piped.stdout),
            "no progress on stdout"
        );
        assert!(shown.stderr.starts_with("\r\x1b[K"), "{:?}", shown.stderr);
        assert!(shown.stderr.contains(what), "{:?}", shown.stderr);
        assert!(
            shown.stderr.ends_with("\r\x1b[K"),
            "erased at the end: {:?}",
            shown.stderr
        );
        // Every frame fits an 80-column terminal (a wrapped line cannot be redrawn in place).
        for frame in shown.stderr.split("\r\x1b[K") {
            assert!(frame.chars().count() < 80, "{frame:?}");
        }
    }
}

#[test]
fn a_truncated_or_non_utf8_corpus_names_the_line() {
    let d = dir("broken-corpus");
    // The first 4 KiB of a gzipped corpus: the stream ends part-way.
    let gz = std::fs::read(repo("tests/corpora/te-2.20.2-corpus-a.jsonl.gz")).unwrap();
    let cut = d.join("cut.jsonl.gz");
    std::fs::write(&cut, &gz[..4096]).unwrap();
    let c = cut.to_str().unwrap();
    for args in [vec!["conformance", c], vec!["coverage", c]] {
        let o = run_plain(&args);
        refused(&o, &[&format!("{c}:"), "is it truncated?"]);
    }
    // A record holding a byte that is not UTF-8: file, line and column.
    let bad = d.join("latin1.jsonl");
    let mut bytes =
        b"{\"id\": \"a\", \"config\": {}}\n{\"id\": \"b\", \"config\": {\"qkv_dtype\": \"".to_vec();
    bytes.extend_from_slice(b"\xe9\"}}\n");
    std::fs::write(&bad, bytes).unwrap();
    let b = bad.to_str().unwrap();
    refused(
        &run_plain(&["conformance", b]),
        &[&format!("{b}:2: not UTF-8 text"), "column 38"],
    );
}

#[test]
fn with_json_an_error_is_text_on_stderr_and_stdout_stays_empty() {
    // docs/cli.md, "Exit codes": a consumer checks the exit code before parsing stdout.
    for args in [
        vec!["explain", "--json", "--head-dim", "0", "--no-env"],
        vec!["explain", "--format", "te", "--preset", "nope", "--no-env"],
        vec!["gaps", "--json", "--where", "bogus == 1"],
        vec!["presets", "--json", "--show", "nope"],
        vec!["why-not", "Nope", "--no-env"],
    ] {
        let o = run_plain(&args);
        refused(&o, &["error: "]);
    }
}

/// The first `n` records of a shipped corpus, as a `.jsonl` file of their own.
fn head_of_corpus(corpus: &str, n: usize) -> String {
    let records = attn_policy::read_corpus(std::path::Path::new(&repo(corpus))).expect("corpus");
    let name = corpus.rsplit('/').next().unwrap().replace(".gz", "");
    let path = dir("head").join(format!("{n}-{name}"));
    let lines: Vec<String> = records.iter().take(n).map(|r| r.raw.to_string()).collect();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn bench_reads_a_corpus_for_the_packs_family() {
    // A torch corpus for the torch pack: every record decided (they were all read as te facts
    // and refused, "no inputs to decide").
    let torch = head_of_corpus("tests/corpora/torch-2.11-sdpa-corpus-a.jsonl.gz", 300);
    let o = run_plain(&[
        "bench", "--pack", "torch", "--corpus", &torch, "--passes", "1",
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(
        o.stdout.contains("inputs               300 (1 passes)\n"),
        "{}",
        o.stdout
    );
    // TransformerEngine's selector time is no yardstick for PyTorch's.
    assert!(!o.stdout.contains("vs TE selector"), "{}", o.stdout);
    // A te corpus for the torch pack: refused, saying why (its facts were decided against the
    // torch schema).
    let te = head_of_corpus("tests/corpora/te-2.20.2-corpus-a.jsonl.gz", 300);
    refused(
        &run_plain(&["bench", "--pack", "torch", "--corpus", &te, "--passes", "1"]),
        &[
            "no inputs to decide",
            "fact family `torch`",
            "another family",
        ],
    );
}

#[test]
fn every_command_help_has_examples_and_exit_codes() {
    // docs/cli.md: "`attn-policy COMMAND --help` gives each one's flags, examples and the
    // exit-code table".
    for c in subcommands() {
        let help = run_plain(&[&c, "--help"]).stdout;
        assert!(
            help.contains("\nExamples:\n"),
            "{c} --help has no examples:\n{help}"
        );
        assert!(
            help.contains("\nExit codes"),
            "{c} --help has no exit codes:\n{help}"
        );
    }
}

#[test]
fn a_corpus_without_one_valid_record_is_no_perfect_score() {
    // A corpus of the other fact family: every record an input error. The agreement was
    // "0/0 valid records (100.00%)", exit 0, and `--min-rate 1.0` passed.
    let te = head_of_corpus("tests/corpora/te-2.20.2-corpus-a.jsonl.gz", 300);
    let torch = head_of_corpus("tests/corpora/torch-2.11-sdpa-corpus-a.jsonl.gz", 300);
    for args in [
        vec!["conformance", torch.as_str(), "--min-rate", "1.0"],
        vec!["conformance", te.as_str(), "--pack", "torch", "--json"],
        vec!["coverage", torch.as_str(), "--min-ratio", "0"],
    ] {
        refused(
            &run_plain(&args),
            &[
                "none of the 300 records is a valid configuration",
                "another family",
            ],
        );
    }
}

/// The exit codes a README usage line's comment allows: `exit N` (N), `exit N where ...` (0
/// where it can run, N where not: a build or a machine without that executor), else 0.
fn documented_exit(comment: &str) -> Vec<i32> {
    match comment.split_once("exit ") {
        Some((_, rest)) => {
            let n: i32 = rest
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .expect("exit N");
            if rest.contains(" where ") {
                vec![0, n]
            } else {
                vec![n]
            }
        }
        None => vec![0],
    }
}

#[test]
fn every_readme_usage_line_runs_as_documented() {
    let readme = std::fs::read_to_string(repo("README.md")).unwrap();
    let usage = readme
        .split("## Usage")
        .nth(1)
        .and_then(|u| u.split("```").nth(1))
        .expect("README has a Usage block");
    let mut ran = 0;
    for line in usage.lines().filter(|l| l.starts_with("attn-policy ")) {
        let (command, comment) = line.split_once(" # ").unwrap_or((line, ""));
        assert!(!command.contains(['\'', '"']), "quote-free: {command}");
        let args: Vec<&str> = command.split_whitespace().skip(1).collect();
        let o = run_with(cmd().current_dir(repo("")).args(&args));
        let expected = documented_exit(comment);
        assert!(
            o.code.is_some_and(|c| expected.contains(&c)),
            "`{command}` exited {:?}, the README says {expected:?}\nstdout: {}\nstderr: {}",
            o.code,
            o.stdout,
            o.stderr
        );
        assert!(!o.stdout.is_empty(), "`{command}` printed nothing");
        ran += 1;
    }
    assert!(ran >= 15, "{ran} usage lines");
}

#[test]
fn version_lists_the_embedded_releases() {
    // `--pack te@2.18.0` is embedded; `--version` named only `te` (TransformerEngine 2.20.2).
    let v = run_plain(&["--version"]).stdout;
    let te = v
        .lines()
        .find(|l| l.split_whitespace().next() == Some("te"))
        .unwrap_or_else(|| panic!("{v}"));
    for r in ["te@2.18.0", "te@2.19.0", "te@2.20.2", "te@auto"] {
        assert!(te.contains(r), "{r} in {te}");
    }
    // Each release is a pack `explain` takes.
    for r in ["te@2.18.0", "te@2.19.0", "te@2.20.2"] {
        let o = run(&["explain", "--pack", r, "--preset", "gemma4-global"]);
        assert!(matches!(o.code, Some(0 | 1)), "{r}: {}", o.stderr);
    }
}

#[test]
fn a_yaml_alias_bomb_is_refused_in_words() {
    // Each level repeats the previous ten times: 10^12 nodes once expanded.
    let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let prev = vec![format!("*a{}", i - 1); 10].join(", ");
        text.push_str(&format!("a{i}: &a{i} [{prev}]\n"));
    }
    let f = dir("bomb").join("bomb.yaml");
    std::fs::write(&f, text).unwrap();
    let p = f.to_str().unwrap();
    let o = run(&["explain", p]);
    refused(&o, &[p, "not YAML", "too large once its aliases"]);
    // The parser's own words name its internals.
    assert!(!o.stderr.contains("Nodes {"), "{}", o.stderr);
}

#[test]
fn an_unknown_matrix_axis_names_its_flag() {
    let o = run_plain(&["matrix", "--rows", "bogus", "--cols", "head_dim=64"]);
    refused(&o, &["--rows: unknown fact `bogus`"]);
    let o = run_plain(&["matrix", "--rows", "head_dim=64", "--cols", "sm_typo=90"]);
    refused(&o, &["--cols: unknown fact `sm_typo`"]);
    let o = run_plain(&[
        "matrix",
        "--rows",
        "head_dim=64",
        "--cols",
        "sm=90",
        "--fix",
        "qkv_dtyp=bf16",
    ]);
    refused(
        &o,
        &["--fix: unknown fact `qkv_dtyp`", "did you mean `qkv_dtype`"],
    );
}

/// `explain -` on a terminal prints a one-line hint on stderr (checked by hand under
/// `script`: no pseudo-terminal here); piped, stderr stays empty.
#[test]
fn a_piped_config_gets_no_stdin_hint() {
    let o = run_with(
        cmd()
            .args(["explain", "--no-env", "-"])
            .write_stdin(r#"{"head_dim_qk": 64}"#),
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(o.stdout.starts_with("selected: "), "{}", o.stdout);
    assert!(o.stderr.is_empty(), "{}", o.stderr);
}
