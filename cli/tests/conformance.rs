//! Differential conformance against TransformerEngine 2.20.2's own decisions
//! (tests/corpora/te-2.20.2-corpus-a.jsonl.gz, shipped in the repository). The rates
//! asserted here are the ones documented in docs/conformance.md.

use std::process::Command;

use serde_json::{Value as Json, json};

const CORPUS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/corpora/te-2.20.2-corpus-a.jsonl.gz"
);

/// docs/conformance.md: agreement of `--parity` on corpus-a's valid records.
const DOCUMENTED_PARITY_RATE: f64 = 1.0;

/// docs/conformance.md: corpus-a records that are structurally invalid (KV heads that do not
/// divide, or exceed, the query heads: 1,824 + 98).
const DOCUMENTED_INPUT_ERRORS: u64 = 1922;

fn conformance(extra: &[&str]) -> Json {
    assert!(
        std::path::Path::new(CORPUS).exists(),
        "corpus missing: {CORPUS} (shipped in tests/corpora/)"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_attn-policy"))
        .args(["conformance", CORPUS, "--json", "--top", "50"])
        .args(extra)
        .output()
        .expect("binary runs");
    assert!(
        out.status.success(),
        "conformance failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("--json prints one JSON object")
}

#[test]
fn te_parity_meets_the_documented_rate() {
    let r = conformance(&["--parity"]);
    let (total, valid, agree) = (
        r["total"].as_u64().unwrap(),
        r["valid"].as_u64().unwrap(),
        r["agree"].as_u64().unwrap(),
    );
    assert_eq!(total, 20_000);
    // Records whose KV heads do not divide the query heads (or exceed them) cannot reach TE's
    // selector (DotProductAttention asserts it): input errors, reported and not decided.
    assert_eq!(r["input_errors"], DOCUMENTED_INPUT_ERRORS);
    assert_eq!(valid, total - DOCUMENTED_INPUT_ERRORS);
    for class in r["input_error_classes"].as_array().unwrap() {
        assert_eq!(class["error"], "constraint: num_gqa_groups", "{class}");
    }
    let first = &r["input_error_records"][0];
    assert!(first["line"].as_u64().unwrap() >= 1);
    assert!(
        first["message"]
            .as_str()
            .unwrap()
            .contains("te-2.20.2-corpus-a.jsonl.gz:"),
        "an input error names the corpus line: {first}"
    );
    assert_eq!(r["disagree"].as_u64().unwrap(), valid - agree);
    let rate = agree as f64 / valid as f64;
    assert!(
        rate >= DOCUMENTED_PARITY_RATE,
        "agreement {agree}/{valid} is below the documented rate; classes: {:#}",
        r["classes"]
    );
    // TE raised (SIGFPE) on 8 records; the pack selects nothing for them.
    assert_eq!(r["per_backend"]["raised"], json!({"agree": 8, "total": 8}));
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/conformance.md"
    ))
    .expect("docs/conformance.md");
    assert!(
        doc.contains("18078/18078"),
        "docs/conformance.md states the parity result"
    );
}

#[test]
fn guard_layer_only_removes_backends() {
    // With the guard layer on, every difference from TE is a backend the guards decline:
    // an available backend becomes unavailable, never the other way round.
    let r = conformance(&[]);
    assert!(
        r["disagree"].as_u64().unwrap() > 0,
        "the corpus exercises the guards"
    );
    for c in r["classes"].as_array().unwrap() {
        let diff = c["difference"].as_str().unwrap();
        assert!(
            !diff.contains("false -> true") && !diff.contains("-> FrostAttention"),
            "a guard added a backend: {diff}"
        );
    }
}

#[test]
fn classes_name_the_differing_fields() {
    // A record whose TE decision was altered disagrees, in the field that was altered.
    let dir = std::env::temp_dir().join(format!("attn-policy-conf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("two.jsonl");
    let config = json!({"device_compute_capability": [9, 0], "cudnn_version": [9, 19, 0],
        "flash_attn_versions": {"v2": "2.8.3", "v3": null, "v4": null}, "qkv_dtype": "bf16",
        "qkv_layout": "bshd_bshd_bshd", "head_dim_qk": 128, "head_dim_v": 128,
        "attn_mask_type": "causal", "is_training": true, "deterministic": false});
    let te = json!({"selected": "FusedAttention", "flash_attention_backend": "2.8.3",
        "fused_attention_backend": 1, "available_backends": [true, true, true]});
    let mut wrong = te.clone();
    wrong["selected"] = json!("FlashAttention");
    let lines = [
        json!({"id": "ok", "config": config, "decision": te}),
        json!({"id": "bad", "config": config, "decision": wrong}),
        json!({"id": "raised", "config": config, "decision": null}),
    ];
    let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    std::fs::write(&file, text.join("\n")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_attn-policy"))
        .args(["conformance", file.to_str().unwrap(), "--json", "--parity"])
        .output()
        .expect("binary runs");
    let r: Json = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(
        (r["total"].as_u64(), r["agree"].as_u64()),
        (Some(3), Some(1))
    );
    let classes = r["classes"].as_array().unwrap();
    assert_eq!(classes.len(), 2);
    let find =
        |ex: &str| classes.iter().find(|c| c["example"] == ex).unwrap()["difference"].clone();
    assert_eq!(
        find("bad"),
        json!("selected FlashAttention -> FusedAttention")
    );
    assert_eq!(
        find("raised"),
        json!("TE raised -> selected FusedAttention")
    );
    // --min-rate turns the rate into the exit status.
    let strict = Command::new(env!("CARGO_BIN_EXE_attn-policy"))
        .args([
            "conformance",
            file.to_str().unwrap(),
            "--parity",
            "--min-rate",
            "0.5",
        ])
        .status()
        .unwrap();
    assert_eq!(strict.code(), Some(1));
    let _ = std::fs::remove_dir_all(&dir);
}

const TORCH_CORPUS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/corpora/torch-2.11-sdpa-corpus-a.jsonl.gz"
);

#[test]
fn torch_pack_agrees_with_pytorch_on_every_record_and_backend() {
    assert!(
        std::path::Path::new(TORCH_CORPUS).exists(),
        "corpus missing: {TORCH_CORPUS} (shipped in tests/corpora/)"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_attn-policy"))
        .args([
            "conformance",
            TORCH_CORPUS,
            "--pack",
            "torch",
            "--json",
            "--min-rate",
            "1.0",
        ])
        .output()
        .expect("binary runs");
    let r: Json = serde_json::from_slice(&out.stdout).expect("--json prints one JSON object");
    assert!(
        out.status.success(),
        "below 100%: {:#}\n{}",
        r["classes"],
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(r["total"], 20_000);
    assert_eq!(r["agree"], 20_000, "classes: {:#}", r["classes"]);
    assert_eq!(r["disagree"], 0);
    assert_eq!(r["rate"], 1.0);
    assert_eq!(r["input_errors"], 0);
    // per (record, backend): flash, efficient, cudnn, math
    assert_eq!(r["eligibility_total"], 80_000);
    assert_eq!(r["eligibility_agree"], 80_000);
    assert_eq!(r["classes"], json!([]));
    // every backend PyTorch chose, each agreeing throughout
    for (backend, n) in [
        ("cudnn", 6823),
        ("efficient", 5128),
        ("flash", 845),
        ("math", 7204),
    ] {
        assert_eq!(
            r["per_backend"][backend],
            json!({"agree": n, "total": n}),
            "{backend}"
        );
    }
}

#[test]
fn torch_classes_name_choice_and_eligibility() {
    // An altered record disagrees in the altered fields; the TE-only fields are absent.
    let dir = std::env::temp_dir().join(format!("attn-policy-tconf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("torch.jsonl");
    let config = json!({"batch": 1, "heads_q": 8, "heads_kv": 8, "seqlen_q": 128,
        "seqlen_kv": 128, "head_dim_qk": 64, "head_dim_v": 64, "dtype": "bf16",
        "is_causal": false, "attn_mask": null, "dropout_p": 0.0, "enable_gqa": false,
        "scale": null, "requires_grad": false, "layout": "bhsd", "deterministic": false});
    let torch = json!({"version": "2.11.0+cu130", "cudnn": 91900, "sm": "90"});
    let eligible = json!({"flash": true, "efficient": true, "cudnn": true, "math": true});
    let mut wrong = eligible.clone();
    wrong["flash"] = json!(false);
    let lines = [
        json!({"config": config, "torch": torch, "choice": "cudnn", "eligible": eligible}),
        json!({"config": config, "torch": torch, "choice": "flash", "eligible": wrong}),
    ];
    let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    std::fs::write(&file, text.join("\n")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_attn-policy"))
        .args([
            "conformance",
            file.to_str().unwrap(),
            "--json",
            "--pack",
            "torch",
        ])
        .output()
        .expect("binary runs");
    let r: Json = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(
        (r["total"].as_u64(), r["agree"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(r["eligibility_agree"], 7);
    assert_eq!(r["eligibility_total"], 8);
    assert_eq!(
        r["classes"][0]["difference"],
        json!("choice flash -> cudnn; eligible flash false -> true")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// docs/packs/releases.md: each te@ release agrees with its own release's corpus on every
/// valid record (`--parity`), with the same 1,922 structurally invalid records refused.
fn release_parity(release: &str) {
    let corpus = format!(
        "{}/../tests/corpora/te-{release}-corpus-a.jsonl.gz",
        env!("CARGO_MANIFEST_DIR")
    );
    assert!(
        std::path::Path::new(&corpus).exists(),
        "corpus missing: {corpus}"
    );
    let pack = format!("te@{release}");
    let out = Command::new(env!("CARGO_BIN_EXE_attn-policy"))
        .args([
            "conformance",
            &corpus,
            "--pack",
            &pack,
            "--parity",
            "--json",
        ])
        .args(["--top", "50", "--min-rate", "1.0"])
        .output()
        .expect("binary runs");
    let r: Json = serde_json::from_slice(&out.stdout).expect("--json prints one JSON object");
    assert!(
        out.status.success(),
        "{pack} below 100%: {:#}\n{}",
        r["classes"],
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(r["total"], 20_000);
    assert_eq!(r["input_errors"], DOCUMENTED_INPUT_ERRORS);
    assert_eq!(r["valid"], 20_000 - DOCUMENTED_INPUT_ERRORS);
    assert_eq!(r["agree"], r["valid"], "{pack}: {:#}", r["classes"]);
    assert_eq!(r["classes"], json!([]));
    // No release before 2.20 crashes (the a2a SIGFPE is 2.20's).
    assert!(
        r["per_backend"].get("raised").is_none(),
        "{:#}",
        r["per_backend"]
    );
}

#[test]
fn te_2_19_0_agrees_with_its_corpus() {
    release_parity("2.19.0");
}

#[test]
fn te_2_18_0_agrees_with_its_corpus() {
    release_parity("2.18.0");
}
