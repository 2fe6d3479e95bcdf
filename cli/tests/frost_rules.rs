//! FROST (TransformerEngine PR #3527) rules FR.1-FR.29, one test each, through the CLI: a
//! configuration that triggers exactly that rule (FROST declined by it alone) and a neighbour
//! that does not (`explain --format te` reports `use_frost_attention: true`).
//!
//! The base is the PR's Gemma-4 global layer on a B200 with the FROST stack (preset
//! `gemma4-global`: head_dim 512, causal, bf16, training, cuDNN frontend 1.29.0, cutlass-dsl
//! 4.7.1), with the probes answered as the PR measured there: FROST returns its plan, the C++
//! fused path has no d512 graph.

use std::process::{Command, Output};

use serde_json::Value as Json;

const BASE: &[&str] = &[
    "--preset",
    "gemma4-global",
    "--probe",
    "frost_plan=true",
    "--probe",
    "fused_attn_graph=false",
];

/// `explain BASE EXTRA`, whatever it exits with.
fn explain_output(extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attn-policy"))
        .arg("explain")
        .args(BASE)
        .args(extra)
        .output()
        .expect("binary runs")
}

fn explain(extra: &[&str], format: &str) -> Json {
    let out = explain_output(&[extra, &["--format", format]].concat());
    assert_ne!(
        out.status.code(),
        Some(2),
        "bad input {extra:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

fn frost_selected(extra: &[&str]) -> bool {
    explain(extra, "te")["use_frost_attention"]
        .as_bool()
        .expect("use_frost_attention")
}

/// The rules declining FrostAttention.
fn frost_declines(extra: &[&str]) -> Vec<String> {
    let j = explain(extra, "json");
    let frost = j["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "FrostAttention")
        .expect("FrostAttention in the explanation")
        .clone();
    frost["declined_by"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect()
}

/// `trigger` declines FROST by `rule` alone; `neighbour` selects FROST.
fn check(rule: &str, trigger: &[&str], neighbour: &[&str]) {
    assert!(
        !frost_selected(trigger),
        "{rule}: {trigger:?} still selects FROST"
    );
    assert_eq!(
        frost_declines(trigger),
        vec![rule.to_string()],
        "{rule}: {trigger:?}"
    );
    assert!(
        frost_selected(neighbour),
        "{rule}: neighbour {neighbour:?} does not select FROST: {:?}",
        frost_declines(neighbour)
    );
}

/// [`check`] for a rule about one fact given with `--set` (`fact=value` on both sides).
fn check_set(rule: &str, trigger: &str, neighbour: &str) {
    check(rule, &["--set", trigger], &["--set", neighbour]);
}

#[test]
fn base_selects_frost() {
    assert!(frost_selected(&[]));
    assert!(frost_declines(&[]).is_empty());
}

#[test]
fn fr01_env_switch() {
    check(
        "FR.1",
        &["--env", "NVTE_FROST_ATTN=0"],
        &["--env", "NVTE_FROST_ATTN=1"],
    );
    let j = explain(&["--env", "NVTE_FROST_ATTN=0"], "json");
    let frost = j["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "FrostAttention")
        .unwrap()
        .clone();
    assert_eq!(
        frost["status"], "disabled",
        "NVTE_FROST_ATTN=0 declines cleanly, as a switch"
    );
}

#[test]
fn fr02_sm100_sm103_only() {
    check("FR.2", &["--sm", "90"], &["--sm", "103"]);
}

#[test]
fn fr03_dtype() {
    check("FR.3", &["--dtype", "fp32"], &["--dtype", "fp16"]);
}

#[test]
fn fr04_quantized_qkv_type() {
    check_set("FR.4", r#"qkv_type="Float8Tensor""#, r#"qkv_type="Tensor""#);
}

#[test]
fn fr05_fp8_attention() {
    let recipe = |dpa: bool| {
        format!(r#"fp8_recipe={{"recipe": "DelayedScaling", "fp8_dpa": {dpa}, "fp8_mha": false}}"#)
    };
    let (on, off) = (recipe(true), recipe(false));
    check(
        "FR.5",
        &["--set", "fp8=true", "--set", &on],
        // FP8 autocast for the GEMMs only: attention stays bf16 and FROST serves it.
        &["--set", "fp8=true", "--set", &off],
    );
}

#[test]
fn fr06_symmetric_head_dims() {
    check("FR.6", &["--head-dim-v", "320"], &["--head-dim", "320"]);
}

#[test]
fn fr07_head_dim_band() {
    check("FR.7", &["--head-dim", "256"], &["--head-dim", "264"]);
    assert_eq!(
        frost_declines(&["--head-dim", "520"]),
        vec!["FR.7".to_string()]
    );
}

#[test]
fn fr08_multiple_of_8() {
    // 260 is in (256, 512] but declines on the multiple-of-8 rule.
    check("FR.8", &["--head-dim", "260"], &["--head-dim", "264"]);
}

#[test]
fn fr09_no_thd() {
    check(
        "FR.9",
        &[
            "--layout",
            "thd_thd_thd",
            "--set",
            "num_tokens_q=16384",
            "--set",
            "num_tokens_kv=16384",
        ],
        &["--layout", "sbhd_sbhd_sbhd"],
    );
}

#[test]
fn fr10_masks() {
    check(
        "FR.10",
        &["--mask", "padding_causal"],
        &["--mask", "causal_bottom_right"],
    );
}

#[test]
fn fr11_bias() {
    check_set(
        "FR.11",
        r#"core_attention_bias_type="alibi""#,
        r#"core_attention_bias_type="no_bias""#,
    );
}

#[test]
fn fr12_dropout() {
    check_set("FR.12", "attention_dropout=0.1", "attention_dropout=0.0");
}

#[test]
fn fr13_softcap() {
    check_set("FR.13", "softcap=30.0", "softcap=0.0");
}

#[test]
fn fr14_softmax() {
    check_set(
        "FR.14",
        r#"softmax_type="off-by-one""#,
        r#"softmax_type="vanilla""#,
    );
}

#[test]
fn fr15_max_logit() {
    check_set("FR.15", "return_max_logit=true", "return_max_logit=false");
}

#[test]
fn fr16_kv_cache() {
    check(
        "FR.16",
        &[
            "--inference",
            "--set",
            r#"inference={"is_paged": false, "page_size": 256}"#,
        ],
        &["--inference"],
    );
}

#[test]
fn fr17_score_mod() {
    check_set("FR.17", "has_score_mod=true", "has_score_mod=false");
    // score_mod_bprop without score_mod must still end with no FROST (and no backend at all).
    assert_eq!(
        frost_declines(&["--set", "has_score_mod_bprop=true"]),
        vec!["FR.17".to_string()]
    );
    assert!(!frost_selected(&["--set", "has_score_mod_bprop=true"]));
}

#[test]
fn fr18_num_splits() {
    check_set("FR.18", "num_splits=2", "num_splits=1");
}

#[test]
fn fr19_checkpoint_core_attention() {
    check_set(
        "FR.19",
        "checkpoint_core_attention=true",
        "checkpoint_core_attention=false",
    );
}

#[test]
fn fr20_cuda_graph() {
    check_set("FR.20", "cuda_graph=true", "cuda_graph=false");
}

#[test]
fn fr21_deterministic_training() {
    // Inference with determinism is served; only the deterministic backward is missing.
    check(
        "FR.21",
        &["--deterministic"],
        &["--deterministic", "--inference"],
    );
}

#[test]
fn fr22_window_with_p2p() {
    check(
        "FR.22",
        &["--cp-comm-type", "p2p", "--window", "1024,0"],
        &["--cp-comm-type", "all_gather", "--window", "1024,0"],
    );
    // p2p without a real window still selects FROST; so does a2a+p2p, and a2a with the window.
    assert!(frost_selected(&["--cp-comm-type", "p2p", "--window=-1,0"]));
    assert!(frost_selected(&[
        "--cp-comm-type",
        "a2a+p2p",
        "--cp-size",
        "4",
        "--set",
        "cp_size_a2a=2"
    ]));
    assert!(frost_selected(&[
        "--cp-comm-type",
        "a2a",
        "--window",
        "1024,0"
    ]));
    assert_eq!(
        frost_declines(&[
            "--cp-comm-type",
            "a2a+p2p",
            "--cp-size",
            "4",
            "--set",
            "cp_size_a2a=2",
            "--window",
            "1024,0"
        ]),
        vec!["FR.22".to_string()]
    );
}

#[test]
fn fr23_cp_causal_cross_attention() {
    check(
        "FR.23",
        &[
            "--cp-comm-type",
            "p2p",
            "--seqlen-q",
            "4096",
            "--seqlen-kv",
            "8192",
        ],
        // no_mask with unequal lengths stays allowed under CP.
        &[
            "--cp-comm-type",
            "p2p",
            "--seqlen-q",
            "4096",
            "--seqlen-kv",
            "8192",
            "--mask",
            "no_mask",
        ],
    );
}

#[test]
fn fr24_cp_bottom_right() {
    check(
        "FR.24",
        &[
            "--cp-comm-type",
            "all_gather",
            "--mask",
            "causal_bottom_right",
        ],
        &["--cp-comm-type", "all_gather", "--mask", "causal"],
    );
}

#[test]
fn fr25_noncausal_window_cross() {
    check(
        "FR.25",
        &[
            "--mask",
            "no_mask",
            "--window",
            "128,128",
            "--seqlen-q",
            "4096",
            "--seqlen-kv",
            "8192",
        ],
        &["--mask", "no_mask", "--window", "128,128"],
    );
}

#[test]
fn fr26_window_validation() {
    // A bound below -1 is no window: since issue 15 such an input is refused when read (exit
    // 2, at the flag) before FR.26 could see it; FR.26 stays as TE's own check.
    let out = explain_output(&["--window=-2,0"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--window") && err.contains(">= -1"), "{err}");
    // (0, 0) is a tested, served boundary.
    assert!(frost_selected(&["--window", "0,0"]));
}

#[test]
fn fr27_cudnn_frontend_floor() {
    check_set(
        "FR.27",
        r#"cudnn_frontend_version="1.28.0""#,
        r#"cudnn_frontend_version="1.29.0""#,
    );
    // Pre-releases count below the floor; a missing package declines.
    let rc = ["--set", r#"cudnn_frontend_version="1.29.0rc1""#];
    assert_eq!(frost_declines(&rc), vec!["FR.27".to_string()]);
    assert_eq!(
        frost_declines(&["--set", "cudnn_frontend_version=null"]),
        vec!["FR.27".to_string()]
    );
    // A version that does not parse (the probe's raw string) does not decline: it defers to
    // the plan-name check, which passes in BASE, so FROST is selected.
    let custom = ["--set", r#"cudnn_frontend_version="1.29.x-custom""#];
    let out = explain_output(&custom);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(frost_selected(&custom));
    assert!(frost_declines(&custom).is_empty());
    // The explanation shows the raw string, in text and in JSON.
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("selected: FrostAttention"), "{text}");
    assert!(
        text.contains(r#"cudnn_frontend_version = "1.29.x-custom" (unparseable)"#),
        "{text}"
    );
    let j = explain(&custom, "json");
    assert_eq!(j["selected"], "FrostAttention");
    assert_eq!(
        j["input"]["cudnn_frontend_version"],
        "1.29.x-custom (unparseable)"
    );
    // With a failing plan-name check FR.plan declines, and only it.
    let no_plan = [&custom[..], &["--probe", "frost_plan=false"]].concat();
    assert_eq!(frost_declines(&no_plan), vec!["FR.plan".to_string()]);
    // A wrong JSON type stays an input error.
    let out = explain_output(&["--set", "cudnn_frontend_version=129"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cudnn_frontend_version"));
}

#[test]
fn fr28_cutlass_dsl_floor() {
    check_set(
        "FR.28",
        r#"cutlass_dsl_version="4.6.2""#,
        r#"cutlass_dsl_version="4.7.0""#,
    );
    assert_eq!(
        frost_declines(&["--set", r#"cutlass_dsl_version="4.7.0rc1""#]),
        vec!["FR.28".to_string()]
    );
    assert_eq!(
        frost_declines(&["--set", "cutlass_dsl_version=null"]),
        vec!["FR.28".to_string()]
    );
    // Unparseable: defers to the plan-name check (as FR.27).
    let custom = ["--set", r#"cutlass_dsl_version="4.7-git""#];
    assert!(frost_selected(&custom));
    let no_plan = [&custom[..], &["--probe", "frost_plan=false"]].concat();
    assert_eq!(frost_declines(&no_plan), vec!["FR.plan".to_string()]);
}

#[test]
fn fr29_frost_engines_switch() {
    check(
        "FR.29",
        &["--env", "CUDNN_FRONTEND_ENABLE_FROST_ENGINES=0"],
        &["--env", "CUDNN_FRONTEND_ENABLE_FROST_ENGINES=1"],
    );
}

#[test]
fn frost_is_preferred_over_unfused_only() {
    // FR.P: FROST after FlashAttention and FusedAttention, before (and suppressing) Unfused.
    let te = explain(&[], "te");
    assert_eq!(te["use_frost_attention"], true);
    assert_eq!(te["use_unfused_attention"], false);
    assert_eq!(te["available_backends"][2], true, "unfused stays available");
    let fused = explain(&["--probe", "fused_attn_graph=true"], "te");
    assert_eq!(
        (
            fused["use_fused_attention"].as_bool(),
            fused["use_frost_attention"].as_bool()
        ),
        (Some(true), Some(false))
    );
}
