//! `attn-policy run` on a GPU (issue 14, section 2): the te pack decided with the live device
//! facts and run on the real executors at the Gemma-4 presets' real sizes, small cases verified
//! against the float64 reference, and `--as-configured` (a B200 decision run on this device).
//!
//! Gated: built only with the `cuda` feature, and each test prints `SKIPPED` and returns when
//! `run` finds no CUDA device. The expectations are the H200's (sm_90); on another device the
//! tests that depend on it say so and skip. The cuDNN cases need the `cudnn` feature.
//!
//! On the GPU machine (no Rust there) the binary under test is `$ATTN_POLICY_BIN` when set
//! (the test executable and the `attn-policy` binary are carried together); see
//! docs/executors.md "Proof on the H200" for the recipe.
#![cfg(feature = "cuda")]

mod common;

use common::{bin, run, text, words};
use serde_json::Value as Json;

/// `run ARGS --json`, logged for the GPU machine's record: the exit code and the document.
fn run_json(args: &[&str]) -> (i32, Json) {
    let full = [args, &["--json"]].concat();
    let o = run(&full);
    let doc = common::json_of(&full, &o);
    println!(
        "run {}: exit {:?}, backend {}, executor {}, chain {}",
        args.join(" "),
        o.status.code(),
        doc["backend"],
        doc["executor"],
        doc["executor_chain"]
    );
    (o.status.code().unwrap_or(-1), doc)
}

/// The live device as `run` sees it, or `None` (printed: SKIPPED) without one; `Some(false)`
/// when it is not an sm_90 device (the expectations below are the H200's).
fn h200() -> Option<bool> {
    let (_, doc) = run_json(&words(
        "run --pack native --head-dim 64 --seqlen 16 --heads 1 --kv-heads 1 --forward-only \
         --verify never",
    ));
    let d = &doc["device"];
    if d["available"] != true {
        println!("SKIPPED: no CUDA device for `run`: {}", d["reason"]);
        return None;
    }
    println!(
        "device: {} sm {} cuDNN {} (binary {})",
        d["name"],
        d["compute_capability"],
        d["cudnn_version"],
        bin()
    );
    let sm90 = d["compute_capability"] == serde_json::json!([9, 0]);
    if !sm90 {
        println!("SKIPPED: the expectations are an sm_90 device's");
    }
    Some(sm90)
}

fn outcome(doc: &Json, i: usize) -> (&str, &str) {
    let a = &doc["executor_chain"][i];
    (
        a["executor"].as_str().unwrap_or_default(),
        a["outcome"].as_str().unwrap_or_default(),
    )
}

/// The B200 preset decided for the H200: sm and (with a loaded libcudnn) the cuDNN version are
/// the device's, and the document says what the config said.
fn assert_live(doc: &Json) {
    let d = &doc["device"];
    assert_eq!(d["used"], true, "{d}");
    assert_eq!(doc["decision"]["input"]["sm"], 90);
    assert_eq!(
        doc["decision"]["provenance"]["device_compute_capability"],
        "live"
    );
    let sm = d["differs_from_config"]
        .as_array()
        .and_then(|l| l.iter().find(|x| x["fact"] == "sm"))
        .expect("sm differs from the preset's");
    assert_eq!(
        (&sm["configured"], &sm["live"]),
        (&Json::from(100), &Json::from(90))
    );
    if let Some(v) = d["cudnn_version"].as_str() {
        assert_eq!(doc["decision"]["input"]["cudnn_version"], v);
    }
}

#[test]
fn gemma4_global_live_runs_on_fused_at_real_size() {
    if h200() != Some(true) {
        return;
    }
    // b2 hq8 hkv4 s8192 d512 causal bf16, forward and backward.
    let (code, doc) = run_json(&["run", "--pack", "te", "--preset", "gemma4-global"]);
    assert_eq!(code, 0, "{doc:#}");
    assert_live(&doc);
    // FROST has no SM90 backward: TE's choice on the H200 is the unfused path, d512 included;
    // the te pack runs it on `fused` where its manifest admits the problem (issue 34).
    assert_eq!(doc["backend"], "UnfusedDotProductAttention");
    assert_eq!(doc["executor"], "fused");
    assert_eq!(doc["substitute"], false);
    assert_eq!(outcome(&doc, 0), ("fused", "ran"));
    assert_eq!(outcome(&doc, 1), ("chunked", "not_tried"));
    assert_eq!(outcome(&doc, 2), ("reference", "not_tried"));
    assert!(doc["run"]["backward_ms"].as_f64().is_some_and(|t| t > 0.0));
    println!(
        "gemma4-global real size on fused: fwd {} ms, bwd {} ms, verification: {}",
        doc["run"]["forward_ms"], doc["run"]["backward_ms"], doc["run"]["verification_skipped"]
    );
    // At a head dim fused does not serve (520 > 512) chunked is the backend's own executor.
    let (code, doc) = run_json(&words(
        "run --pack te --preset gemma4-global --head-dim 520 --seqlen 1024",
    ));
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(doc["executor"], "chunked");
    assert_eq!(doc["substitute"], false);
    assert_eq!(outcome(&doc, 0), ("chunked", "ran"));
}

#[cfg(feature = "cudnn")]
#[test]
fn gemma4_sliding_live_runs_on_cudnn_at_real_size() {
    if h200() != Some(true) {
        return;
    }
    // b2 hq8 hkv4 s8192 d256, causal with a 1024-token window.
    let (code, doc) = run_json(&["run", "--pack", "te", "--preset", "gemma4-sliding"]);
    assert_eq!(code, 0, "{doc:#}");
    assert_live(&doc);
    assert_eq!(doc["backend"], "FusedAttention");
    assert_eq!(doc["executor"], "cudnn");
    assert_eq!(doc["substitute"], false);
    println!(
        "gemma4-sliding real size on cudnn: fwd {} ms, bwd {} ms",
        doc["run"]["forward_ms"], doc["run"]["backward_ms"]
    );
    // The backend's own executor ran, so --no-substitute changes nothing.
    let (code, doc) = run_json(&words(
        "run --pack te --preset gemma4-sliding --no-substitute --forward-only",
    ));
    assert_eq!((code, &doc["executor"]), (0, &Json::from("cudnn")));
}

/// Small cases are verified against the float64 reference (FlashAttention criterion, in `run`).
#[test]
fn small_live_cases_run_on_the_real_executors_and_verify() {
    if h200() != Some(true) {
        return;
    }
    let mut cases = vec![("gemma4-global", "512", "fused")];
    if cfg!(feature = "cudnn") {
        cases.push(("gemma4-sliding", "256", "cudnn"));
    }
    for (preset, seqlen, executor) in cases {
        let (code, doc) = run_json(&[
            "run", "--pack", "te", "--preset", preset, "--seqlen", seqlen, "--batch", "1",
        ]);
        assert_eq!(code, 0, "{preset}: {doc:#}");
        assert_eq!(doc["executor"], executor, "{preset}");
        assert_eq!(doc["substitute"], false, "{preset}");
        let v = &doc["run"]["verification"];
        assert_eq!(v["passed"], true, "{preset}: {v:#}");
        println!("{preset} s{seqlen} on {executor}: {}", v["checks"]);
    }
    // The human output names the device and what the config said.
    let o = run(&words(
        "run --pack te --preset gemma4-global --seqlen 128 --batch 1 --forward-only",
    ));
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("device:    decided for the live device"),
        "{out}"
    );
    assert!(out.contains("not the config's sm 100"), "{out}");
    assert!(
        out.contains("executor:  selected UnfusedDotProductAttention; ran on fused\n"),
        "{out}"
    );
}

/// `--as-configured`: the preset's SM100 FROST decision, run on this device: `frost` does not
/// run here (unavailable: feature off or no cuDNN frontend package; or refused: no SM90 backward,
/// a non-FROST plan), the next entry (the reference, small size) runs as a substitute.
#[test]
fn as_configured_runs_what_the_chain_can_run_here() {
    if h200() != Some(true) {
        return;
    }
    let (code, doc) = run_json(&words(
        "run --pack te --preset gemma4-global --as-configured --seqlen 128 --batch 1",
    ));
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(doc["device"]["used"], false);
    assert_eq!(doc["decision"]["input"]["sm"], 100);
    assert!(
        doc["device"]["differs_from_config"]
            .as_array()
            .is_some_and(|l| !l.is_empty())
    );
    assert_eq!(doc["backend"], "FrostAttention");
    let (frost, how) = outcome(&doc, 0);
    assert_eq!(frost, "frost");
    assert!(how == "unavailable" || how == "refused", "{how}");
    let why = doc["executor_chain"][0]["reason"]
        .as_str()
        .unwrap_or_default();
    assert!(!why.is_empty());
    println!("frost on this device: {how}: {why}");
    assert_eq!(outcome(&doc, 1), ("reference", "ran"));
    assert_eq!(doc["substitute"], true);
    assert_eq!(doc["run"]["verification"]["passed"], true);
}

/// `--as-configured` with the B200 sliding preset at real size: FlashAttention (flash-attn 2 on
/// SM100); `torch_flash` is the Python host's, `cudnn` refuses a decision made for another cuDNN
/// (naming both), `chunked` runs as the substitute.
#[cfg(feature = "cudnn")]
#[test]
fn as_configured_sliding_substitutes_chunked_for_a_cudnn_of_another_version() {
    if h200() != Some(true) {
        return;
    }
    let (code, doc) = run_json(&words(
        "run --pack te --preset gemma4-sliding --as-configured",
    ));
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(doc["backend"], "FlashAttention");
    assert_eq!(outcome(&doc, 0), ("torch_flash", "unavailable"));
    let loaded = doc["device"]["cudnn_version"].as_str().map(str::to_string);
    let cudnn = &doc["executor_chain"][1];
    match loaded.as_deref() {
        Some(v) if v != "9.21.0" => {
            assert_eq!(cudnn["outcome"], "refused", "{cudnn}");
            let why = cudnn["reason"].as_str().unwrap_or_default();
            assert!(why.contains("9.21.0") && why.contains(v), "{why}");
            assert_eq!(doc["executor"], "chunked");
            assert_eq!(doc["substitute"], true);
        }
        other => println!(
            "SKIPPED: cuDNN loaded here is {other:?}, not another version than the preset's 9.21.0; cudnn entry: {cudnn}"
        ),
    }
}
