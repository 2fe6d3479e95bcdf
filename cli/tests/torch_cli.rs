//! `attn-policy` with the `torch` pack: explain, facts, flags of the other family refused.

mod common;

use std::process::Output;

use common::{run, words};
use serde_json::Value as Json;

fn json(o: &Output) -> Json {
    serde_json::from_slice(&o.stdout).expect("JSON on stdout")
}

fn backend<'a>(ex: &'a Json, name: &str) -> &'a Json {
    ex["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == name)
        .unwrap_or_else(|| panic!("no backend {name}"))
}

fn declined_by(ex: &Json, name: &str) -> Vec<String> {
    backend(ex, name)["declined_by"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn hopper_head_dim_512_with_gqa_is_served_by_math_only() {
    let o = run(&words(
        "explain --pack torch --head-dim 512 --heads 32 --kv-heads 8 --enable-gqa --sm 90 --json",
    ));
    assert_eq!(o.status.code(), Some(0));
    let ex = json(&o);
    assert_eq!(ex["selected"], "math");
    assert_eq!(ex["preference"]["id"], "cudnn-first");
    assert_eq!(declined_by(&ex, "flash"), ["flash.head_dim"]);
    assert_eq!(declined_by(&ex, "efficient"), ["efficient.heads"]);
    assert_eq!(declined_by(&ex, "cudnn"), ["cudnn.head_dim_limit"]);
    // the values the cuDNN rule read
    let rule = &backend(&ex, "cudnn")["declined_by"][0];
    assert_eq!(rule["values"]["head_dim_qk"], 512);
    assert_eq!(rule["values"]["cudnn_version"], "9.19.0");
    // Math off too: no backend, exit 1.
    let none = run(&words(
        "explain --pack torch --head-dim 512 --heads 32 --kv-heads 8 --enable-gqa --disable math",
    ));
    assert_eq!(none.status.code(), Some(1));
}

#[test]
fn corpus_records_explain_as_pytorch_chose() {
    // the corpus' first record: fp32, head_dim 320, a broadcast bool mask, seqlen_kv 1
    let dir = std::env::temp_dir().join(format!("attn-policy-torch-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rec = dir.join("rec.json");
    std::fs::write(
        &rec,
        r#"{"config": {"batch": 1, "heads_q": 2, "heads_kv": 2, "seqlen_q": 2048, "seqlen_kv": 1,
        "head_dim_qk": 320, "head_dim_v": 320, "dtype": "fp32", "is_causal": false,
        "attn_mask": "bool_bcast", "dropout_p": 0.0, "enable_gqa": true, "scale": null,
        "requires_grad": false, "layout": "bhsd", "deterministic": false},
        "torch": {"version": "2.11.0+cu130", "cudnn": 91900, "sm": "90"}, "choice": "efficient"}"#,
    )
    .unwrap();
    let ex = json(&run(&[
        "explain",
        "--pack",
        "torch",
        rec.to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(ex["selected"], "efficient");
    assert_eq!(declined_by(&ex, "flash")[0], "flash.mask");
    assert_eq!(declined_by(&ex, "cudnn")[0], "cudnn.dtype");
    // flags override the file: bf16 and no mask make cuDNN's head_dim the first obstacle
    let ex = json(&run(&[
        "explain",
        "--pack",
        "torch",
        rec.to_str().unwrap(),
        "--dtype",
        "bf16",
        "--attn-mask",
        "none",
        "--json",
    ]));
    assert_eq!(declined_by(&ex, "cudnn")[0], "cudnn.head_dim_limit");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn flags_of_the_other_family_are_refused_with_exit_2() {
    for flags in [
        &["--window", "128,0"][..],
        &["--cp-comm-type", "p2p"],
        &["--cp-size", "2"],
        &["--layout", "bshd_bshd_bshd"],
        &["--mask", "causal"],
        &["--inference"],
        &["--probe", "fused_attn_graph=true"],
    ] {
        let o = run(&[&["explain", "--pack", "torch"][..], flags].concat());
        assert_eq!(o.status.code(), Some(2), "{flags:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(flags[0]) && err.contains("TransformerEngine"),
            "{flags:?}: {err}"
        );
        let o = run(&[&["why-not", "flash", "--pack", "torch"][..], flags].concat());
        assert_eq!(o.status.code(), Some(2), "why-not {flags:?}");
    }
    // Presets belong to a family: a TE preset on the torch pack is refused and the
    // message lists the presets that do fit.
    let o = run(&["explain", "--pack", "torch", "--preset", "gemma4-global"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("pack family `te`") && err.contains("sdpa-h100-d512"),
        "{err}"
    );
    for flags in [
        &["--causal"][..],
        &["--attn-mask", "bool"],
        &["--dropout", "0.1"],
        &["--enable-gqa"],
        &["--requires-grad"],
        &["--tensor-layout", "bhsd"],
        &["--disable", "flash"],
    ] {
        let o = run(&[&["explain"][..], flags].concat());
        assert_eq!(o.status.code(), Some(2), "te {flags:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains(flags[0]));
    }
    // te facts through --set are unknown torch facts: exit 2 with a suggestion
    let o = run(&["explain", "--pack", "torch", "--set", "num_heads=8"]);
    assert_eq!(o.status.code(), Some(2));
    // --set works for any torch fact
    let o = run(&words(
        "explain --pack torch --set flash_sdp_enabled=false --set cudnn_sdp_enabled=false --json",
    ));
    assert_eq!(json(&o)["selected"], "efficient");
}

#[test]
fn facts_lists_the_family_of_the_pack() {
    let o = run(&["facts", "--pack", "torch"]);
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("| `flash_sdp_enabled` | bool |  | true |")
            && text.contains("| `heads_q` | int | > 0 | 16 |")
            && text.contains("| `compute_capability_exists` | `sm` | refused when read |"),
        "{text}"
    );
    assert!(!text.contains("qkv_layout"));
    let te = run(&["facts"]);
    assert!(String::from_utf8_lossy(&te.stdout).contains("| `qkv_layout` |"));
}

#[test]
fn gaps_only_lists_where_one_backend_alone_serves() {
    let w = "sm == 90 and dtype == \"bf16\" and dtype_k == dtype and dtype_v == dtype \
             and not nested and dim_q == 4 and dim_k == 4 and dim_v == 4 and stride_last_q == 1 \
             and attn_mask == null and enable_gqa and heads_q == 32 and heads_kv == 8 \
             and heads_v == 8 and head_dim_v == head_dim_qk and head_dim_k == head_dim_qk \
             and head_dim_qk == 512 and batch_k == batch and batch_v == batch";
    let o = run(&["gaps", "--pack", "torch", "--only", "math", "--where", w]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(text.contains("where only math serves"), "{text}");
    assert!(text.contains("flash: declined by flash.head_dim"), "{text}");
    let bad = run(&["gaps", "--pack", "torch", "--only", "mth"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("did you mean `math`"));
    // te facts in --where are unknown to the torch family
    let bad = run(&["gaps", "--pack", "torch", "--where", "num_heads == 8"]);
    assert_eq!(bad.status.code(), Some(2));
}
