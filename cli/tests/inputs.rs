//! Issue 15 end to end, through the binary (assert_cmd): impossible inputs refused with a
//! location (exit 2, nothing decided), one exit-code table, closed pipes, `check --allow`,
//! outputs a person reads, and the environment rule. Every command runs with the selector's
//! environment variables cleared, so the shell this test runs in cannot change a result.

use std::io::Write;
use std::process::Stdio;

use assert_cmd::Command;

mod common;
use common::{Out, run_with};
use serde_json::Value as Json;

/// The environment variables the te family reads (its `env.*` facts).
const ENV_VARS: &[&str] = &[
    "NVTE_FLASH_ATTN",
    "NVTE_FLASH_ATTN_V2",
    "NVTE_FLASH_ATTN_V3",
    "NVTE_FLASH_ATTN_V4",
    "NVTE_FUSED_ATTN",
    "NVTE_UNFUSED_ATTN",
    "NVTE_FROST_ATTN",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO",
    "NVTE_UnfusedDPA_Emulate_FP8",
    "NVTE_DPA_FP8CS_O_in_F16",
    "NVTE_FP8_DPA_BWD",
    "CUDNN_FRONTEND_ENABLE_FROST_ENGINES",
    "NVTE_FROST_TEST_REQUIRED",
];

fn cmd() -> Command {
    let mut c = Command::cargo_bin("attn-policy").expect("binary");
    for v in ENV_VARS {
        c.env_remove(v);
    }
    c.env("NO_COLOR", "1");
    c
}

fn run(args: &[&str]) -> Out {
    run_with(cmd().args(args))
}

fn dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "attn-policy-inputs-{}-{}",
        std::process::id(),
        std::thread::current()
            .name()
            .unwrap_or("t")
            .replace("::", "-")
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Exit 2, nothing on stdout, and stderr names `location` and `key`.
fn refused(o: &Out, location: &str, key: &str) {
    common::refused(o, &[location, key]);
}

// ---- 1. Structural validation ----

#[test]
fn impossible_flags_are_refused_at_the_flag() {
    let cases: &[(&[&str], &str, &str)] = &[
        (
            &["--heads", "8", "--kv-heads", "3"],
            "--kv-heads",
            "num_gqa_groups",
        ),
        (&["--heads", "4", "--kv-heads", "8"], "--kv-heads", "exceed"),
        (&["--heads", "6"], "--heads", "num_heads"),
        (&["--sm", "95"], "--sm", "not the compute capability"),
        (&["--sm", "0"], "--sm", "device_compute_capability"),
        (&["--cudnn", "9.x"], "--cudnn", "is not a version"),
        (&["--batch", "0"], "--batch", "batch_size: must be > 0"),
        (&["--head-dim", "-64"], "--head-dim", "head_dim_qk"),
        (&["--seqlen-kv", "0"], "--seqlen-kv", "max_seqlen_kv"),
        (&["--cp-size", "0"], "--cp-size", "cp_size"),
        (
            &["--window", "-2,0"],
            "--window",
            "window_size.left: must be >= -1",
        ),
        (
            &["--mask", "causal", "--window", "-1,8"],
            "--window",
            "check_set_window_size",
        ),
        (
            &["--set", "attention_dropout=1.5"],
            "--set attention_dropout",
            "in [0, 1]",
        ),
        (&["--set", "softcap=-1"], "--set softcap", ">= 0"),
        (
            &["--set", "batch_size=1.5"],
            "--set batch_size",
            "expected an integer",
        ),
        (
            &["--set", "batch_size=1e300"],
            "--set batch_size",
            "does not fit",
        ),
        (
            &["--set", "flash_attn_versions.v2=\"latest\""],
            "--set flash_attn_versions.v2",
            "not a version",
        ),
        (
            &["--env", "NVTE_FLASH_ATTN=yes"],
            "--env NVTE_FLASH_ATTN",
            "int()",
        ),
        (
            &["--probe", "fused_attn_graph=maybe"],
            "--probe fused_attn_graph",
            "expected true",
        ),
        (&["--window", "abc"], "--window", "LEFT,RIGHT"),
        (
            &["--preset", "gemma4-globl"],
            "--preset",
            "did you mean `gemma4-global`",
        ),
    ];
    for (args, location, key) in cases {
        let o = run(&[&["explain"][..], args].concat());
        refused(&o, location, key);
    }
    // The same validation in every command that reads a config.
    refused(
        &run(&["why-not", "FrostAttention", "--sm", "95"]),
        "--sm",
        "sm95",
    );
    refused(
        &run(&["run", "--pack", "native", "--heads", "8", "--kv-heads", "3"]),
        "--kv-heads",
        "num_gqa_groups",
    );
}

#[test]
fn impossible_files_are_refused_at_file_line_col() {
    let d = dir();
    // (file name, its text, where the error must point, what it must name)
    let cases = [
        (
            "c.json",
            "{\n  \"num_heads\": 8,\n  \"num_gqa_groups\": 3\n}\n",
            "c.json:3:3",
            "num_gqa_groups",
        ),
        (
            "c.json",
            "{\"head_dim_qk\": 64,\n \"head_dim_qk\": 128}",
            "c.json:2:2",
            "duplicate key",
        ),
        (
            "c.json",
            "{\"window_size\": [128, -3]}",
            "c.json:1:2",
            "window_size.right",
        ),
        (
            "c.json",
            "{\"cudnn_version\": \"nine\"}",
            "c.json:1:2",
            "not a version",
        ),
        ("c.json", "{\"num_heads\": 8,,}", "c.json:1:", "not JSON"),
        (
            "c.yaml",
            "head_dim_qk: 64\nattention_dropout: 2.0\n",
            "c.yaml:2:1",
            "attention_dropout",
        ),
        (
            "c.yaml",
            "head_dim_qk: 64\nhead_dim_qk: 128\n",
            "c.yaml:2",
            "duplicate",
        ),
        // A whole conformance record: the config inside it.
        (
            "c.json",
            "{\"id\": \"r\", \"config\": {\"device_compute_capability\": [9, 5]}}",
            "c.json:1:24",
            "9.5",
        ),
        // A word for a version whose selector reads numbers (cuDNN's runtime version) is
        // refused; only facts whose probe reports raw text keep it (docs/facts.md).
        (
            "c.json",
            "{\"device_compute_capability\": [10, 0], \"head_dim_qk\": 512, \"head_dim_v\": 512,\n \
             \"cudnn_version\": \"9.dev-local\"}",
            "c.json:2:2",
            "cudnn_version",
        ),
    ];
    for (name, text, at, what) in cases {
        let file = d.join(name);
        std::fs::write(&file, text).unwrap();
        refused(&run(&["explain", file.to_str().unwrap()]), at, what);
    }
    // stdin has a name too.
    let o = run_with(
        cmd()
            .args(["explain", "-"])
            .write_stdin("{\"num_splits\": 0}"),
    );
    refused(&o, "<stdin>:1:2", "num_splits");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn every_preset_is_valid() {
    let list: Json = serde_json::from_str(&run(&["presets", "--json"]).stdout).unwrap();
    for p in list.as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        // A preset sets the facts of its family; the te presets serve the default pack.
        let pack = match p["family"].as_str().unwrap() {
            "torch" => "torch",
            _ => "te",
        };
        let o = run(&["explain", "--pack", pack, "--preset", name, "--json"]);
        assert!(matches!(o.code, Some(0 | 1)), "{name}: {}", o.stderr);
        // Another family's pack refuses it, naming both families.
        let other = if pack == "torch" { "te" } else { "torch" };
        let o = run(&["explain", "--pack", other, "--preset", name]);
        assert_eq!(o.code, Some(2), "{name} on pack {other}: {}", o.stderr);
        assert!(o.stderr.contains("pack family"), "{name}: {}", o.stderr);
    }
}

#[test]
fn corpus_input_errors_are_counted_with_their_line() {
    let d = dir();
    let file = d.join("c.jsonl");
    let good =
        r#"{"id": "ok", "config": {"head_dim_qk": 128, "head_dim_v": 128}, "decision": null}"#;
    let lines = [
        good.to_string(),
        r#"{"id": "kv", "config": {"num_heads": 8, "num_gqa_groups": 3}, "decision": null}"#.into(),
        r#"{"id": "dup", "config": {"num_heads": 8, "num_heads": 4}, "decision": null}"#.into(),
    ];
    std::fs::write(&file, lines.join("\n")).unwrap();
    for parity in [false, true] {
        let mut args = vec!["conformance", file.to_str().unwrap(), "--json"];
        if parity {
            args.push("--parity");
        }
        let o = run(&args);
        let r: Json = serde_json::from_str(&o.stdout).expect(&o.stderr);
        assert_eq!(
            (r["total"].as_u64(), r["valid"].as_u64()),
            (Some(3), Some(1))
        );
        assert_eq!(r["input_errors"], 2, "--parity treats input errors alike");
        let recs = r["input_error_records"].as_array().unwrap();
        assert_eq!(recs[0]["line"], 2);
        assert_eq!(recs[0]["error"]["kind"], "constraint");
        assert_eq!(recs[1]["line"], 3);
        assert_eq!(recs[1]["error"]["kind"], "duplicate_key");
        assert!(
            recs[1]["message"].as_str().unwrap().contains("c.jsonl:3:"),
            "{}",
            recs[1]
        );
    }
    let cov = run(&["coverage", file.to_str().unwrap(), "--json"]);
    let r: Json = serde_json::from_str(&cov.stdout).unwrap();
    assert_eq!(r["input_errors"].as_array().unwrap().len(), 2);
    assert_eq!(r["input_errors"][0]["line"], 2);
    let text = run(&["conformance", file.to_str().unwrap()]);
    assert!(
        text.stdout.contains("input errors: 2 of 3 records"),
        "{}",
        text.stdout
    );
    let _ = std::fs::remove_dir_all(&d);
}

// ---- 2. Exit codes and pipes ----

#[test]
fn closed_pipes_end_quietly() {
    let mini = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/analysis/mini"
    );
    let nowin = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/analysis/mini-nowin"
    );
    let cases: &[&[&str]] = &[
        &["gaps", "--rules", mini],
        &["diff", mini, nowin],
        &["check", "--rules", mini],
        &["explain", "--preset", "gemma4-global"],
        &["facts"],
        &["presets", "--show", "gemma4-global"],
        &["explain-code", "E-TYPE"],
        &["man"],
    ];
    for args in cases {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_attn-policy"))
            .args(*args)
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawns");
        // Close the reading end before the command writes: every write hits a closed pipe.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("waits");
        let stderr = String::from_utf8_lossy(&out.stderr);
        use std::os::unix::process::ExitStatusExt;
        let quiet = out.status.code() == Some(0) || out.status.signal() == Some(13);
        assert!(
            quiet && !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
            "{args:?}: {:?} {stderr}",
            out.status
        );
    }
    // Through a shell, as a user types it: `| head -1` ends with 0 (or 141 from SIGPIPE).
    let o = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{} facts | head -1 >/dev/null; echo ${{PIPESTATUS:-$?}}",
            env!("CARGO_BIN_EXE_attn-policy")
        ))
        .output()
        .unwrap();
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn one_exit_code_table_in_help_and_docs() {
    let help = run(&["--help"]).stdout;
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/cli.md"))
        .expect("docs/cli.md");
    for code in ["0", "1", "2", "3", "4", "5"] {
        assert!(
            help.contains(&format!("\n  {code}  ")),
            "--help lists exit {code}"
        );
        assert!(
            docs.contains(&format!("| {code} |")),
            "docs/cli.md lists exit {code}"
        );
    }
    for sub in ["explain", "check", "gaps", "conformance", "presets"] {
        let h = run(&[sub, "--help"]).stdout;
        assert!(h.contains("Exit codes"), "{sub} --help has the table");
    }
}

#[test]
fn check_on_a_broken_pack_exits_2() {
    let broken = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/invalid/enum_typo"
    );
    let o = run(&["check", "--rules", broken]);
    assert_eq!(o.code, Some(2), "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.contains("b.yaml:4:29"), "{}", o.stdout);
    let json = run(&["check", "--rules", broken, "--json"]);
    assert_eq!(json.code, Some(2));
    let explain = run(&["explain", "--rules", broken]);
    assert_eq!(explain.code, Some(2));
}

#[test]
fn check_deny_warnings_can_pass_with_allow() {
    let lints = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/analysis/lints"
    );
    let o = run(&["check", "--rules", lints, "--json"]);
    let diags: Json = serde_json::from_str(&o.stdout).expect(&o.stderr);
    let mut codes: Vec<String> = diags
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["severity"] == "warning")
        .map(|d| d["code"].as_str().unwrap().to_string())
        .collect();
    codes.sort();
    codes.dedup();
    assert!(!codes.is_empty(), "the lints fixture warns");
    assert_eq!(
        run(&["check", "--rules", lints, "--deny-warnings"]).code,
        Some(1)
    );
    let mut args = vec!["check", "--rules", lints, "--deny-warnings"];
    for c in &codes {
        args.extend(["--allow", c.as_str()]);
    }
    let o = run(&args);
    assert_eq!(o.code, Some(0), "{}", o.stdout);
    assert!(
        o.stdout.contains("(allowed)") && o.stdout.contains("allowed"),
        "{}",
        o.stdout
    );
    // The pack's own allow list does the same.
    let d = dir();
    for f in std::fs::read_dir(lints).unwrap().flatten() {
        std::fs::copy(f.path(), d.join(f.file_name())).unwrap();
    }
    let mut pack = std::fs::OpenOptions::new()
        .append(true)
        .open(d.join("pack.yaml"))
        .unwrap();
    writeln!(pack, "allow: [{}]", codes.join(", ")).unwrap();
    let o = run(&["check", "--rules", d.to_str().unwrap(), "--deny-warnings"]);
    assert_eq!(o.code, Some(0), "{}{}", o.stdout, o.stderr);
    // Unknown and error codes are refused.
    let o = run(&["check", "--allow", "W-SUBSUMD"]);
    assert_eq!(o.code, Some(2));
    assert!(
        o.stderr.contains("did you mean `W-SUBSUMED`"),
        "{}",
        o.stderr
    );
    assert_eq!(run(&["check", "--allow", "E-TYPE"]).code, Some(2));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn min_rate_says_what_fell_short() {
    let d = dir();
    let file = d.join("c.jsonl");
    let config = r#"{"device_compute_capability": [9, 0], "head_dim_qk": 128, "head_dim_v": 128}"#;
    std::fs::write(
        &file,
        format!(
            "{{\"id\": \"wrong\", \"config\": {config}, \"decision\": {{\"selected\": \"FlashAttention\"}}}}\n"
        ),
    )
    .unwrap();
    let o = run(&["conformance", file.to_str().unwrap(), "--min-rate", "1.0"]);
    assert_eq!(o.code, Some(1));
    assert!(
        o.stderr.contains("--min-rate 1") && o.stderr.contains("0/1") && o.stderr.contains("wrong"),
        "{}",
        o.stderr
    );
    assert_eq!(
        run(&["conformance", file.to_str().unwrap(), "--min-rate", "2"]).code,
        Some(2)
    );
    let _ = std::fs::remove_dir_all(&d);
}

// ---- 3. Output a person can read ----

#[test]
fn where_takes_pack_literals_and_points_at_errors() {
    let mini = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/analysis/mini"
    );
    let o = run(&[
        "gaps",
        "--rules",
        mini,
        "--where",
        "cudnn_version >= 9.23 and sm == 90",
    ]);
    assert!(matches!(o.code, Some(0 | 1)), "{}", o.stderr);
    let o = run(&["gaps", "--rules", mini, "--where", "sm == 90 and and"]);
    assert_eq!(o.code, Some(2));
    let lines: Vec<&str> = o.stderr.lines().collect();
    assert!(lines.len() >= 3, "{}", o.stderr);
    let caret = lines
        .iter()
        .position(|l| l.trim_start().starts_with('^'))
        .unwrap();
    assert_eq!(
        lines[caret].find('^'),
        lines[caret - 1].find("and and").map(|i| i + 4),
        "the caret points at the second `and`:\n{}",
        o.stderr
    );
}

#[test]
fn gaps_text_starts_with_a_summary_and_examples_are_real_inputs() {
    let mini = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/analysis/mini"
    );
    let o = run(&["gaps", "--rules", mini]);
    assert_eq!(o.code, Some(1));
    let summary = o.stdout.find("summary").expect("a summary");
    let first = o.stdout.find("\n1. ").expect("regions");
    assert!(summary < first, "{}", o.stdout);
    let json: Json =
        serde_json::from_str(&run(&["gaps", "--rules", mini, "--json"]).stdout).unwrap();
    for r in json["regions"].as_array().unwrap() {
        // Every example is an input the CLI accepts (a real GPU, a window TE accepts).
        let d = dir();
        let f = d.join("example.json");
        std::fs::write(&f, r["example"].to_string()).unwrap();
        let e = run(&["explain", f.to_str().unwrap(), "--rules", mini]);
        assert_eq!(e.code, Some(1), "{} is a gap: {}", r["example"], e.stderr);
        let _ = std::fs::remove_dir_all(&d);
    }
    // A cut search says so first.
    let o = run(&["gaps", "--budget", "10"]);
    assert!(o.stdout.starts_with("INCOMPLETE"), "{}", o.stdout);
}

#[test]
fn coverage_counts_rule_ids() {
    let d = dir();
    let file = d.join("c.jsonl");
    std::fs::write(
        &file,
        r#"{"id": "a", "config": {"head_dim_qk": 128, "head_dim_v": 128}}"#,
    )
    .unwrap();
    let r: Json =
        serde_json::from_str(&run(&["coverage", file.to_str().unwrap(), "--json"]).stdout).unwrap();
    let ids: Vec<&str> = r["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["rule"].as_str().unwrap())
        .collect();
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(ids.len(), unique.len(), "each rule id once");
    // A layer rule declining several backends lists them on its one entry.
    assert!(
        r["rules"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["backends"].as_array().unwrap().len() > 1)
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn presets_facts_executors_bench_take_json() {
    let show = run(&["presets", "--show", "gemma4-global", "--json"]);
    let v: Json = serde_json::from_str(&show.stdout).unwrap();
    assert_eq!(v["facts"]["head_dim_qk"], 512);
    assert_eq!(v["facts"]["sm"], 100);
    assert_eq!(v["probes"]["probe.frost_plan"], true);
    assert_eq!(v["probes"]["probe.cuda_device"], "unknown");
    let text = run(&["presets", "--show", "gemma4-global"]).stdout;
    assert!(
        text.contains("* head_dim_qk") && text.contains("probe answers"),
        "{text}"
    );
    let facts: Json = serde_json::from_str(&run(&["facts", "--json"]).stdout).unwrap();
    assert!(
        facts["facts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["domain"] == "> 0")
    );
    assert!(facts["constraints"].as_array().unwrap().len() >= 4);
    // The pack's public definitions come with the facts (what they mean, what they stand
    // for); internal ones are not listed, explanations write them out.
    let defs = facts["definitions"].as_array().unwrap();
    let q_thd = defs.iter().find(|d| d["name"] == "q_thd").expect("q_thd");
    assert!(
        q_thd["meaning"].as_str().unwrap().contains("THD"),
        "{q_thd}"
    );
    assert!(
        q_thd["stands_for"]
            .as_str()
            .unwrap()
            .starts_with("qkv_layout in [")
    );
    assert!(defs.iter().all(|d| d["name"] != "fa4_inst"));
    let text = run(&["facts"]).stdout;
    assert!(
        text.contains("Public definitions of pack `te`") && text.contains("| `q_thd` |"),
        "{text}"
    );
    let ex: Json = serde_json::from_str(&run(&["executors", "--json"]).stdout).unwrap();
    assert!(ex.as_array().is_some_and(|a| !a.is_empty()));
    let bench: Json =
        serde_json::from_str(&run(&["bench", "--passes", "1", "--json"]).stdout).unwrap();
    assert!(bench["median_ns"].as_f64().unwrap() > 0.0);
}

#[test]
fn explain_json_echoes_its_input_and_provenance() {
    let o = run(&[
        "explain",
        "--preset",
        "gemma4-global",
        "--head-dim",
        "256",
        "--json",
    ]);
    let v: Json = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["input"]["head_dim_qk"], 256);
    assert_eq!(v["input"]["num_heads"], 8);
    assert_eq!(v["provenance"]["head_dim_qk"], "flag");
    assert_eq!(v["provenance"]["num_heads"], "preset");
}

#[test]
fn version_completions_man_and_explain_code() {
    let v = run(&["--version"]).stdout;
    assert!(v.contains(env!("CARGO_PKG_VERSION")), "{v}");
    assert!(
        v.contains("te") && v.contains("TransformerEngine 2.20.2"),
        "{v}"
    );
    assert!(v.contains("native") && v.contains("features:"), "{v}");
    // Each pack line names what it mirrors: the torch pack is PyTorch's SDPA, not ours.
    let line = |pack: &str| {
        v.lines()
            .find(|l| l.split_whitespace().next() == Some(pack))
            .unwrap_or_else(|| panic!("no line for {pack}: {v}"))
            .to_string()
    };
    assert!(line("te").contains("TransformerEngine 2.20.2"), "{v}");
    assert!(line("torch").contains("PyTorch 2.11"), "{v}");
    assert!(line("native").contains("this project's executors"), "{v}");
    for shell in ["bash", "zsh", "fish"] {
        let o = run(&["completions", shell]);
        assert_eq!(o.code, Some(0));
        assert!(o.stdout.contains("explain-code"), "{shell}");
    }
    let man = run(&["man"]).stdout;
    assert!(man.contains(".TH") && man.contains("attn-policy"));
    let code = run(&["explain-code", "w-subsumed"]);
    assert_eq!(code.code, Some(0));
    assert!(
        code.stdout
            .starts_with("W-SUBSUMED (warning, reported by check)")
    );
    let bad = run(&["explain-code", "E-TYEP"]);
    assert_eq!(bad.code, Some(2));
    assert!(
        bad.stderr.contains("did you mean `E-TYPE`"),
        "{}",
        bad.stderr
    );
}

#[test]
fn readme_first_example_works_as_written() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    assert!(readme.contains("attn-policy explain examples/gemma4-global.json"));
    let o = run_with(
        cmd()
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .args(["explain", "examples/gemma4-global.json"]),
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(o.stdout.starts_with("selected: "), "{}", o.stdout);
}

// ---- The environment rule ----

#[test]
fn explain_reads_the_shell_env_and_says_so() {
    let base = ["explain", "--preset", "llama3-8b-h100", "--json"];
    let plain: Json = serde_json::from_str(&run(&base).stdout).unwrap();
    assert_eq!(plain["selected"], "FusedAttention");
    let shell: Json =
        serde_json::from_str(&run_with(cmd().args(base).env("NVTE_FUSED_ATTN", "0")).stdout)
            .unwrap();
    assert_ne!(shell["selected"], "FusedAttention");
    assert_eq!(shell["provenance"]["env.NVTE_FUSED_ATTN"], "shell");
    // --no-env ignores it; --env overrides it.
    let ignored: Json = serde_json::from_str(
        &run_with(cmd().args(base).arg("--no-env").env("NVTE_FUSED_ATTN", "0")).stdout,
    )
    .unwrap();
    assert_eq!(ignored["selected"], "FusedAttention");
    let overridden: Json = serde_json::from_str(
        &run_with(
            cmd()
                .args(base)
                .args(["--env", "NVTE_FUSED_ATTN=1"])
                .env("NVTE_FUSED_ATTN", "0"),
        )
        .stdout,
    )
    .unwrap();
    assert_eq!(overridden["selected"], "FusedAttention");
    assert_eq!(overridden["provenance"]["env.NVTE_FUSED_ATTN"], "flag");
    // The human text names what came from the shell, and a bad value is located there.
    let text = run_with(
        cmd()
            .args(["explain", "--preset", "llama3-8b-h100"])
            .env("NVTE_FUSED_ATTN", "0"),
    );
    assert!(
        text.stdout
            .contains("from the shell environment: NVTE_FUSED_ATTN=0")
    );
    let bad = run_with(cmd().args(["explain"]).env("NVTE_FLASH_ATTN", "yes"));
    refused(&bad, "$NVTE_FLASH_ATTN", "int()");
}

#[test]
fn corpus_and_analysis_commands_ignore_the_shell_env() {
    let d = dir();
    let file = d.join("c.jsonl");
    std::fs::write(
        &file,
        r#"{"id": "a", "config": {"device_compute_capability": [9, 0], "head_dim_qk": 128, "head_dim_v": 128}, "decision": null}"#,
    )
    .unwrap();
    let mini = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/analysis/mini"
    );
    let nowin = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/analysis/mini-nowin"
    );
    for args in [
        vec!["conformance", file.to_str().unwrap(), "--json"],
        vec!["coverage", file.to_str().unwrap(), "--json"],
        vec!["gaps", "--rules", mini, "--json"],
        vec!["diff", mini, nowin, "--json"],
    ] {
        let clean = run(&args);
        let shell = run_with(
            cmd()
                .args(&args)
                .env("NVTE_FLASH_ATTN", "0")
                .env("NVTE_FUSED_ATTN", "0")
                .env("NVTE_UNFUSED_ATTN", "0"),
        );
        let strip = |s: &str| -> Json {
            let mut v: Json = serde_json::from_str(s).unwrap();
            if let Some(o) = v.as_object_mut() {
                o.remove("diagram_nodes");
                o.remove("classes_examined");
            }
            v
        };
        assert_eq!(strip(&clean.stdout), strip(&shell.stdout), "{args:?}");
        assert_eq!(clean.code, shell.code);
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn why_not_names_the_switch_for_an_outranked_backend() {
    // Fused and FROST both serve the Gemma-4 global layer once cuDNN builds the graph; Fused
    // comes first on sm >= 90. How do I get FROST? Turn Fused off.
    let args = [
        "why-not",
        "FrostAttention",
        "--preset",
        "gemma4-global",
        "--probe",
        "fused_attn_graph=true",
    ];
    let o = run(&args);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(
        o.stdout.contains("outranked by FusedAttention")
            && o.stdout.contains("select it with: --env NVTE_FUSED_ATTN=0")
            && o.stdout.contains("verified"),
        "{}",
        o.stdout
    );
    let v: Json = serde_json::from_str(&run(&[&args[..], &["--json"]].concat()).stdout).unwrap();
    assert_eq!(v["switch"]["set"], serde_json::json!(["NVTE_FUSED_ATTN=0"]));
    assert_eq!(v["switch"]["verified"], true);
    // And the switch really selects it.
    let e: Json = serde_json::from_str(
        &run(&[
            "explain",
            "--preset",
            "gemma4-global",
            "--probe",
            "fused_attn_graph=true",
            "--env",
            "NVTE_FUSED_ATTN=0",
            "--json",
        ])
        .stdout,
    )
    .unwrap();
    assert_eq!(e["selected"], "FrostAttention");
}

#[test]
fn why_not_names_the_package_once_and_repeats_no_hint() {
    // FlashAttention on Hopper with no flash-attn package installed: the hint names the pip
    // package and the versions the rules accept, once (not one hint per version class).
    let o = run(&[
        "why-not",
        "FlashAttention",
        "--head-dim",
        "128",
        "--sm",
        "80",
        "--set",
        r#"flash_attn_versions={"v2":null}"#,
    ]);
    assert_eq!(o.code, Some(0), "{}{}", o.stdout, o.stderr);
    let hints: Vec<&str> = o
        .stdout
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("- "))
        .collect();
    let installs: Vec<&&str> = hints.iter().filter(|h| h.contains("install")).collect();
    assert_eq!(installs.len(), 1, "one install hint: {}", o.stdout);
    assert!(
        installs[0] == &"install flash-attn with 2.1.1 <= flash_attn_versions.v2 < 2.8.4",
        "{}",
        o.stdout
    );
    // Every hint changes a different set of facts.
    let v: Json = serde_json::from_str(
        &run(&[
            "why-not",
            "FlashAttention",
            "--preset",
            "gemma4-global",
            "--sm",
            "80",
            "--json",
        ])
        .stdout,
    )
    .unwrap();
    let sets: Vec<Vec<String>> = v["hints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            h["changes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["fact"].as_str().unwrap().to_string())
                .collect()
        })
        .collect();
    assert!(!sets.is_empty(), "{v}");
    for (i, s) in sets.iter().enumerate() {
        assert!(!sets[..i].contains(s), "hint on {s:?} repeated: {v}");
    }
}

/// `--softcap` and `--softmax-type` set TE's facts (explain's `features:` line and its JSON
/// input show them); a softmax type TE does not have is refused at the flag; the torch family
/// has no such facts, so the flags are refused there.
#[test]
fn softcap_and_softmax_type_flags_set_the_te_facts() {
    let o = run(&[
        "explain",
        "--preset",
        "llama3-8b-h100",
        "--softcap",
        "30",
        "--softmax-type",
        "learnable",
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(
        o.stdout
            .contains(r#"features: softcap = 30.0, softmax_type = "learnable" (attention sink)"#),
        "{}",
        o.stdout
    );
    let o = run(&[
        "explain",
        "--preset",
        "llama3-8b-h100",
        "--softcap",
        "30",
        "--json",
    ]);
    let doc: Json = serde_json::from_str(&o.stdout).expect("json");
    assert_eq!(doc["input"]["softcap"], 30.0);
    refused(
        &run(&[
            "explain",
            "--preset",
            "llama3-8b-h100",
            "--softmax-type",
            "bogus",
        ]),
        "--softmax-type",
        "softmax_type",
    );
    refused(
        &run(&["explain", "--pack", "torch", "--softcap", "3"]),
        "--softcap",
        "te",
    );
}
