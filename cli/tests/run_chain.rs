//! `attn-policy run` walks the selected backend's executor chain (issue 14, sections 1-2), on a
//! machine without a GPU executor: every te chain ends in `reference`, which runs small problems
//! as a reported substitute; what no entry can run exits 4; no backend exits 1.
//!
//! These assert the CPU-only outcome, so they are built without the `cuda` feature (no GPU
//! executor can be available); `run_gpu.rs` holds the GPU cases.
#![cfg(not(feature = "cuda"))]

mod common;

use common::{run, text, words};
use serde_json::Value as Json;

/// `run ARGS --json`: the exit code and the document.
fn run_json(args: &[&str]) -> (i32, Json) {
    common::run_json(&[args, &["--json"]].concat())
}

fn outcomes(doc: &Json) -> Vec<(String, String)> {
    doc["executor_chain"]
        .as_array()
        .expect("executor_chain is a list")
        .iter()
        .map(|a| {
            (
                a["executor"].as_str().unwrap_or_default().to_string(),
                a["outcome"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn pairs(xs: &[(&str, &str)]) -> Vec<(String, String)> {
    xs.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

/// Reduced sizes: the reference's float64 work stays small (and within its size limit).
const SMALL: [&str; 4] = ["--seqlen", "64", "--batch", "1"];

#[test]
fn te_runs_a_small_problem_on_the_reference_as_a_reported_substitute() {
    let (code, doc) = run_json(&words(
        "run --pack te --head-dim 64 --seqlen 64 --heads 2 --kv-heads 1",
    ));
    assert_eq!(code, 0, "{doc:#}");
    // The JSON contract: what existed (decision, run) and what the chain adds.
    assert_eq!(doc["backend"], "UnfusedDotProductAttention");
    assert_eq!(doc["executor"], "reference");
    assert_eq!(doc["substitute"], true);
    assert_eq!(
        outcomes(&doc),
        pairs(&[("chunked", "unavailable"), ("reference", "ran")])
    );
    let why = doc["executor_chain"][0]["reason"]
        .as_str()
        .unwrap_or_default();
    assert!(why.contains("`cuda` feature"), "{why}");
    assert_eq!(doc["executor_chain"][1]["reason"], Json::Null);
    assert_eq!(doc["decision"]["selected"], doc["backend"]);
    assert_eq!(doc["decision"]["executor"], "reference");
    assert_eq!(doc["decision"]["executor_chain"], doc["executor_chain"]);
    assert_eq!(doc["run"]["executor"], "reference");
    assert_eq!(doc["run"]["verification"]["passed"], true, "{doc:#}");
    assert_eq!(doc["device"]["available"], false);
    assert_eq!(doc["error"], Json::Null);
}

#[test]
fn the_human_output_names_the_substitute_and_the_chain() {
    let o = run(&[
        &["run", "--pack", "te", "--preset", "gemma4-sliding"][..],
        &SMALL,
    ]
    .concat());
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains(
            "executor:  selected FlashAttention; ran on reference (substitute: torch_flash \
             unavailable: provided by the Python host; cudnn unavailable: attn-policy-adapters \
             was built without the `cudnn` feature; chunked unavailable: attn-policy-adapters was \
             built without the `cuda` feature)"
        ),
        "{out}"
    );
    // The explanation lists each entry's outcome.
    for line in [
        "executors of FlashAttention:",
        "  torch_flash  unavailable  provided by the Python host",
        "  reference    ran          substitute",
    ] {
        assert!(out.contains(line), "missing `{line}`:\n{out}");
    }
    assert!(out.contains("verified:  PASS"), "{out}");
    assert!(out.contains("device:    no CUDA device"), "{out}");
}

/// Every Gemma-4 preset at reduced sizes, decided with the preset's B200 facts (no live device
/// here): the layers without context parallelism run on the reference; under context
/// parallelism the executors refuse (they run one device's whole sequence) or no backend serves.
#[test]
fn gemma4_presets_run_or_say_why_not() {
    const CP: &str = "context_parallel = true: executors run one device's whole sequence";
    const FROST_CP: &[(&str, &str)] = &[("frost", "refused"), ("reference", "refused")];
    const FLASH_CP: &[(&str, &str)] = &[
        ("torch_flash", "refused"),
        ("cudnn", "refused"),
        ("chunked", "refused"),
        ("reference", "refused"),
    ];
    type Case = (
        &'static str,
        i32,
        Option<&'static str>,
        &'static [(&'static str, &'static str)],
        Option<&'static str>,
    );
    // (preset, exit code, backend, chain outcomes, how the reason every entry gives starts)
    let all: &[Case] = &[
        (
            "gemma4-global",
            0,
            Some("FrostAttention"),
            &[("frost", "unavailable"), ("reference", "ran")],
            None,
        ),
        (
            "gemma4-global-cp-p2p",
            4,
            Some("FrostAttention"),
            FROST_CP,
            Some(CP),
        ),
        (
            "gemma4-global-cp-all-gather",
            4,
            Some("FrostAttention"),
            FROST_CP,
            Some(CP),
        ),
        (
            "gemma4-global-cp-a2a",
            4,
            Some("FrostAttention"),
            FROST_CP,
            Some(CP),
        ),
        (
            "gemma4-global-cp-a2a-p2p",
            4,
            Some("FrostAttention"),
            FROST_CP,
            Some(CP),
        ),
        (
            "gemma4-sliding",
            0,
            Some("FlashAttention"),
            &[
                ("torch_flash", "unavailable"),
                ("cudnn", "unavailable"),
                ("chunked", "unavailable"),
                ("reference", "ran"),
            ],
            None,
        ),
        // TE asserts: a sliding window under CP needs a2a or all_gather.
        ("gemma4-sliding-cp-p2p", 1, None, &[], None),
        (
            "gemma4-sliding-cp-all-gather",
            4,
            Some("FlashAttention"),
            FLASH_CP,
            Some(CP),
        ),
        (
            "gemma4-sliding-cp-a2a",
            4,
            Some("FlashAttention"),
            FLASH_CP,
            Some(CP),
        ),
        ("gemma4-sliding-cp-a2a-p2p", 1, None, &[], None),
    ];
    // Every Gemma-4 preset is covered.
    let presets = attn_policy::facts::presets::PRESETS
        .iter()
        .filter(|p| p.name.starts_with("gemma4"))
        .count();
    assert_eq!(all.len(), presets);
    for &(preset, code, backend, chain, reason) in all {
        let (got, doc) =
            run_json(&[&["run", "--pack", "te", "--preset", preset][..], &SMALL].concat());
        assert_eq!(got, code, "{preset}: {doc:#}");
        assert_eq!(doc["backend"].as_str(), backend, "{preset}");
        assert_eq!(outcomes(&doc), pairs(chain), "{preset}");
        if let Some(reason) = reason {
            for a in doc["executor_chain"].as_array().into_iter().flatten() {
                assert!(
                    a["reason"].as_str().is_some_and(|r| r.starts_with(reason)),
                    "{preset}: {a}"
                );
            }
        }
        match code {
            0 => {
                assert_eq!(doc["executor"], "reference", "{preset}");
                assert_eq!(doc["substitute"], true, "{preset}");
                assert_eq!(doc["run"]["verification"]["passed"], true, "{preset}");
            }
            _ => {
                assert_eq!(doc["run"], Json::Null, "{preset}");
                assert_eq!(doc["executor"], Json::Null, "{preset}");
            }
        }
        // Decided with the preset's B200 facts: no live device here.
        assert_eq!(doc["decision"]["input"]["sm"], 100, "{preset}");
        assert_eq!(doc["device"]["used"], false, "{preset}");
    }
}

#[test]
fn no_substitute_exits_4_and_runs_nothing() {
    let (code, doc) = run_json(&words(
        "run --pack te --head-dim 64 --seqlen 64 --no-substitute",
    ));
    assert_eq!(code, 4, "{doc:#}");
    assert_eq!(
        outcomes(&doc),
        pairs(&[("chunked", "unavailable"), ("reference", "not_tried")])
    );
    assert_eq!(doc["run"], Json::Null);
    let err = doc["error"].as_str().unwrap_or_default();
    assert!(err.contains("--no-substitute"), "{err}");
    // The backend's own executor may run: native's `reference` backend on the reference.
    let o = run(&words(
        "run --head-dim 64 --seqlen 64 --heads 2 --kv-heads 1 --forward-only --no-substitute",
    ));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("executor:  selected reference; ran on reference\n"),
        "{}",
        text(&o)
    );
}

#[test]
fn dropout_in_training_is_refused_by_every_entry() {
    let o = run(&[
        &[
            "run",
            "--pack",
            "te",
            "--preset",
            "gemma4-global",
            "--set",
            "attention_dropout=0.1",
        ][..],
        &SMALL,
    ]
    .concat());
    let out = text(&o);
    assert_eq!(o.status.code(), Some(4), "{out}");
    assert!(
        out.contains(
            "chunked, reference refused: attention_dropout = 0.1: executors apply no dropout"
        ),
        "{out}"
    );
    let (code, doc) = run_json(
        &[
            &["run", "--pack", "te", "--preset", "gemma4-global"][..],
            &["--set", "attention_dropout=0.1"],
            &SMALL,
        ]
        .concat(),
    );
    assert_eq!(code, 4);
    let chain = doc["executor_chain"].as_array().expect("a chain");
    assert!(!chain.is_empty());
    for a in chain {
        assert_eq!(a["outcome"], "refused", "{a}");
        assert!(
            a["reason"].as_str().is_some_and(|r| r.contains("dropout")),
            "{a}"
        );
    }
    // Dropout outside training changes nothing: it runs.
    let (code, doc) = run_json(
        &[
            &[
                "run",
                "--pack",
                "te",
                "--preset",
                "gemma4-global",
                "--inference",
            ][..],
            &["--set", "attention_dropout=0.1", "--forward-only"],
            &SMALL,
        ]
        .concat(),
    );
    assert_eq!(code, 0, "{doc:#}");
}

#[test]
fn no_backend_exits_1_with_the_document() {
    let (code, doc) = run_json(
        &[
            &["run", "--pack", "te", "--preset", "gemma4-sliding-cp-p2p"][..],
            &SMALL,
        ]
        .concat(),
    );
    assert_eq!(code, 1);
    assert_eq!(doc["backend"], Json::Null);
    assert_eq!(doc["decision"]["selected"], Json::Null);
    assert_eq!(doc["executor_chain"], serde_json::json!([]));
}

#[test]
fn as_configured_without_a_device_decides_as_the_config_says() {
    let (code, doc) = run_json(
        &[
            &[
                "run",
                "--pack",
                "te",
                "--preset",
                "gemma4-global",
                "--as-configured",
            ][..],
            &SMALL,
            &["--forward-only"],
        ]
        .concat(),
    );
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(doc["decision"]["input"]["sm"], 100);
    assert_eq!(doc["device"]["available"], false);
    assert_eq!(doc["device"]["used"], false);
}

#[test]
fn packs_of_another_fact_family_and_their_flags_are_bad_input() {
    // The torch pack's executors are the Python host's; its facts are not executor problems.
    let o = run(&["run", "--pack", "torch", "--head-dim", "64"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("te fact family"), "{}", text(&o));
    // A torch flag is not silently ignored by a te-family pack.
    let o = run(&["run", "--causal", "--head-dim", "64"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--causal"), "{}", text(&o));
}

/// The te pack's unfused path runs on `fused` only where its manifest admits the problem
/// (`if_admitted:`): d512 on SM90 has it first; on SM80 and SM120 (no sm_90a code there) and at a head
/// dim outside 264..512 it is left out of the chain, so `chunked` is the backend's own
/// executor there, not a substitute (issue 34, part 1).
#[test]
fn te_unfused_chain_has_fused_only_where_it_is_admitted() {
    let chain = |extra: &str| {
        let (code, doc) = run_json(&words(&format!(
            "run --pack te --preset gemma4-global --seqlen 64 --batch 1 --forward-only {extra}"
        )));
        assert_eq!(code, 0, "{extra}: {doc:#}");
        assert_eq!(doc["backend"], "UnfusedDotProductAttention", "{extra}");
        outcomes(&doc)
            .into_iter()
            .map(|(e, _)| e)
            .collect::<Vec<_>>()
    };
    assert_eq!(chain("--sm 90"), ["fused", "chunked", "reference"]);
    assert_eq!(chain("--sm 80"), ["chunked", "reference"]);
    assert_eq!(chain("--sm 120"), ["chunked", "reference"]);
    assert_eq!(chain("--sm 90 --head-dim 520"), ["chunked", "reference"]);
}

/// `explain --executors` lists the chain `run` would walk (the `if_admitted:` entries the facts
/// do not admit left out), every entry `not_tried`; without the flag the chain stays empty.
#[test]
fn explain_executors_lists_the_chain_run_would_walk() {
    let chain = |extra: &str| {
        let line = format!("explain --pack te --preset gemma4-global --sm 90 {extra}");
        let (code, doc) = run_json(&words(&line));
        assert_eq!(code, 0, "{line}");
        doc
    };
    let doc = chain("--executors");
    assert_eq!(doc["selected"], "UnfusedDotProductAttention");
    assert_eq!(
        outcomes(&doc),
        pairs(&[
            ("fused", "not_tried"),
            ("chunked", "not_tried"),
            ("reference", "not_tried")
        ])
    );
    assert!(doc["executor"].is_null(), "nothing ran");
    // d520 is outside `fused`'s manifest: its if_admitted entry is left out.
    let doc = chain("--executors --head-dim 520");
    assert_eq!(doc["selected"], "UnfusedDotProductAttention");
    assert_eq!(
        outcomes(&doc),
        pairs(&[("chunked", "not_tried"), ("reference", "not_tried")])
    );
    assert_eq!(chain("")["executor_chain"], serde_json::json!([]));
}

/// The model-feature presets run end to end on the CPU (small sizes): each call is decided
/// with the facts its family sets, its problem carries the feature (padded sequences, a
/// soft-cap, a learnable sink, MLA's head dims), and the reference's outputs, learnable
/// sink gradient included, pass verification against float64.
#[test]
fn model_feature_presets_run_with_their_features_and_verify() {
    for (preset, expect) in [
        ("gemma2", vec!["padded right", "softcap 50"]),
        ("gpt-oss", vec!["padded right", "sink learnable"]),
        ("deepseek-v3", vec!["padded right", "d_qk 192 d_v 128"]),
    ] {
        let args =
            format!("run --pack te --preset {preset} --batch 2 --seqlen 48 --heads 4 --kv-heads 2");
        let (code, doc) = run_json(&words(&args));
        assert_eq!(code, 0, "{preset}: {doc:#}");
        assert_eq!(doc["executor"], "reference", "{preset}");
        let report = &doc["run"];
        assert_eq!(
            report["verification"]["passed"], true,
            "{preset}: {report:#}"
        );
        let checks: Vec<&str> = report["verification"]["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        if preset == "gpt-oss" {
            assert!(checks.contains(&"d_sink"), "{checks:?}");
        }
        let human = text(&run(&words(&args)));
        for e in expect {
            assert!(human.contains(e), "{preset}: `{e}` not in\n{human}");
        }
    }
}
