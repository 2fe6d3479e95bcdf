//! The `attn-policy` binary end to end: exit codes, output formats, errors.

use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attn-policy"))
        .args(args)
        .output()
        .expect("binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn explain_exit_codes() {
    // Probes answered as the FROST PR measured on B200: FROST returns its plan, the C++ fused
    // path has no d512 graph.
    let b200 = [
        "--probe",
        "frost_plan=true",
        "--probe",
        "fused_attn_graph=false",
    ];
    let selected = run(&[&["explain", "--preset", "gemma4-global-cp-p2p"][..], &b200].concat());
    assert_eq!(selected.status.code(), Some(0), "{}", stdout(&selected));
    // Head dim 512 under CP on Hopper: no backend (the FROST PR's gap).
    let none = run(&[
        &["explain", "--preset", "gemma4-global-cp-p2p", "--sm", "90"][..],
        &b200,
    ]
    .concat());
    assert_eq!(none.status.code(), Some(1), "{}", stdout(&none));
    let bad = run(&["explain", "--mask", "casual"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("did you mean `causal`"));
    let bad_preset = run(&["explain", "--preset", "gemma4-globl"]);
    assert_eq!(bad_preset.status.code(), Some(2));
    let bad_rules = run(&[
        "explain",
        "--rules",
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/invalid/enum_typo"
        ),
    ]);
    assert_eq!(bad_rules.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad_rules.stderr).contains("b.yaml:4:29"));
}

#[test]
fn formats() {
    let te = run(&["explain", "--preset", "gemma4-global", "--format", "te"]);
    let v: serde_json::Value = serde_json::from_slice(&te.stdout).expect("te format is JSON");
    for key in [
        "use_flash_attention",
        "flash_attention_backend",
        "use_fused_attention",
        "fused_attention_backend",
        "use_unfused_attention",
        "available_backends",
        "use_frost_attention",
    ] {
        assert!(v.get(key).is_some(), "missing {key} in {v}");
    }
    let json = run(&["explain", "--preset", "gemma4-global", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("json");
    assert_eq!(v["schema"], "attn-policy/explain/v1");
    assert!(v["backends"].as_array().is_some_and(|b| !b.is_empty()));
    // Deterministic: byte-identical output for the same input.
    let again = run(&["explain", "--preset", "gemma4-global", "--json"]);
    assert_eq!(json.stdout, again.stdout);
}

#[test]
fn parity_switches_the_guard_layer_off() {
    let v: serde_json::Value = serde_json::from_slice(
        &run(&[
            "explain",
            "--preset",
            "gemma4-sliding-cp-p2p",
            "--json",
            "--parity",
        ])
        .stdout,
    )
    .expect("json");
    assert_eq!(v["layers_disabled"], serde_json::json!(["guard"]));
}

#[test]
fn run_works_without_a_gpu() {
    let o = run(&[
        "run",
        "--pack",
        "native",
        "--head-dim",
        "64",
        "--seqlen",
        "128",
        "--heads",
        "2",
        "--kv-heads",
        "1",
        "--forward-only",
        "--probe",
        "cuda_device=false",
    ]);
    let text = stdout(&o);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(text.contains("ran:       reference"), "{text}");
    assert!(text.contains("verified:  PASS"), "{text}");
}

/// A search that ran out of budget without finding a region makes no claim: exit 3, not 0.
#[test]
fn incomplete_searches_exit_3_not_0() {
    let mini = "../tests/fixtures/analysis/mini";
    let found = run(&["gaps", "--rules", mini]);
    assert_eq!(found.status.code(), Some(1), "{}", stdout(&found));
    let out_of_budget = run(&["gaps", "--rules", mini, "--budget", "0"]);
    assert_eq!(out_of_budget.status.code(), Some(3));
    assert!(stdout(&out_of_budget).contains("INCOMPLETE"));
    let nowin = "../tests/fixtures/analysis/mini-nowin";
    let diff = run(&["diff", mini, nowin]);
    assert_eq!(diff.status.code(), Some(1), "{}", stdout(&diff));
    let diff_out_of_budget = run(&["diff", mini, nowin, "--budget", "0"]);
    assert_eq!(diff_out_of_budget.status.code(), Some(3));
    let same = run(&["diff", "te", "te"]);
    assert_eq!(same.status.code(), Some(0), "{}", stdout(&same));
}

#[test]
fn executors_lists_every_executor_with_availability() {
    let o = run(&["executors", "--json"]);
    assert_eq!(o.status.code(), Some(0));
    let list: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "reference",
            "chunked",
            "fused",
            "cudnn",
            "frost",
            "torch_flash",
            "torch_efficient",
            "torch_cudnn",
            "torch_math"
        ]
    );
    for e in list.as_array().unwrap() {
        match e["availability"].as_str().unwrap() {
            "available" => assert!(e["detail"].is_string()),
            "unavailable" => assert!(!e["reason"].as_str().unwrap().is_empty()),
            other => panic!("{other}"),
        }
        assert_eq!(e["manifest"]["name"], e["name"]);
    }
    assert_eq!(list[0]["availability"], "available");
    assert_eq!(list[5]["reason"], "provided by the Python host");
    let human = stdout(&run(&["executors"]));
    assert!(
        human.contains("torch_flash      unavailable provided by the Python host"),
        "{human}"
    );
}
