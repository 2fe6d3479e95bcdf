//! The `explain/v1` document against its JSON Schema (docs/schema/explain-v1.json), for real
//! outputs: every preset and curated case with the `te` pack (guard layer on and off, with a
//! site overlay), the `native` pack, and the binary's own `explain --json` and `run --json`.
//! Also: the schema rejects broken documents, and the model's TE tuple agrees with the
//! conformance comparison's view of the same decision.

mod common;

use std::path::Path;

use attn_policy::FactValue;
use attn_policy::conformance::{record_facts, te_view};
use attn_policy::facts::presets::PRESETS;
use attn_policy::read_corpus;
use attn_policy::{Explanation, Facts, PackSource, Policy, load_pack};
use serde_json::{Value as Json, json};

use common::words;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn validator() -> jsonschema::Validator {
    validator_of("docs/schema/explain-v1.json")
}

fn validator_of(file: &str) -> jsonschema::Validator {
    let text = std::fs::read_to_string(Path::new(ROOT).join(file)).expect(file);
    let schema: Json = serde_json::from_str(&text).expect("the schema is JSON");
    jsonschema::meta::validate(&schema).expect("the schema is a valid JSON Schema");
    jsonschema::validator_for(&schema).expect("the schema compiles")
}

fn assert_valid(v: &jsonschema::Validator, name: &str, doc: &Json) {
    let errors: Vec<String> = v
        .iter_errors(doc)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{name}: {errors:#?}");
}

/// Every preset and every tests/explain_cases config.
fn configs() -> Vec<(String, Json)> {
    let mut out: Vec<(String, Json)> = PRESETS
        .iter()
        .map(|p| (format!("preset-{}", p.name), (p.config)()))
        .collect();
    let mut files: Vec<_> = std::fs::read_dir(Path::new(ROOT).join("tests/explain_cases"))
        .expect("cases dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("case file");
        let name = f.file_stem().expect("name").to_string_lossy().into_owned();
        out.push((name, serde_json::from_str(&text).expect("case JSON")));
    }
    out
}

fn te_policies() -> Vec<(&'static str, Policy)> {
    let plain = Policy::embedded("te").expect("te loads");
    let mut parity = plain.clone();
    parity
        .set_layer_enabled("guard", false)
        .expect("te has a guard layer");
    let overlay = load_pack(
        PackSource::Embedded("te".into()),
        &[Path::new(ROOT).join("tests/fixtures/overlay/site.yaml")],
    )
    .expect("te with the site overlay loads");
    vec![
        ("te", plain),
        ("te --parity", parity),
        ("te + overlay", overlay),
    ]
}

/// The JSON document the binary prints for `args` (whatever its exit code).
fn bin(args: &[&str]) -> Json {
    common::json_of(args, &common::run(args))
}

#[test]
fn real_explanations_match_the_schema() {
    let v = validator();
    let mut docs: Vec<(String, Json)> = Vec::new();
    for (pack, policy) in te_policies() {
        for (name, config) in configs() {
            let facts = Facts::from_json(&config).unwrap_or_else(|e| panic!("{name}: {e}"));
            let d = policy.decide(&facts);
            let ex = Explanation::new(&policy, &facts, &d);
            let doc = ex.to_json();
            // The direct serialisation prints the same bytes as the value.
            assert_eq!(
                ex.to_json_string(true),
                serde_json::to_string_pretty(&doc).unwrap()
            );
            assert_eq!(ex.to_json_string(false), doc.to_string());
            docs.push((format!("{pack}: {name}"), doc));
        }
    }
    let native = Policy::embedded("native").expect("native loads");
    for config in [
        json!({"head_dim_qk": 64, "head_dim_v": 64}),
        json!({"head_dim_qk": 64, "head_dim_v": 64, "probe": {"cuda_device": false}}),
        json!({"head_dim_qk": 1024, "head_dim_v": 1024, "qkv_dtype": "fp8_e4m3"}),
    ] {
        let facts = Facts::from_json(&config).expect("native config");
        let d = native.decide(&facts);
        docs.push((
            format!("native: {config}"),
            Explanation::new(&native, &facts, &d).to_json(),
        ));
    }
    let explain = bin(&words(
        "explain --preset gemma4-global --sm 90 --probe fused_attn_graph=true --json",
    ));
    assert_eq!(explain["provenance"]["head_dim_qk"], "preset");
    assert_eq!(explain["provenance"]["device_compute_capability"], "flag");
    assert_eq!(explain["provenance"]["probe.fused_attn_graph"], "flag");
    assert_eq!(explain["input"]["sm"], 90);
    docs.push(("cli explain --json".into(), explain));
    let run = bin(&words(
        "run --pack native --head-dim 64 --seqlen 64 --heads 2 --kv-heads 1 --forward-only \
         --verify never --probe cuda_device=false --json",
    ));
    let run_doc = run["decision"].clone();
    assert_eq!(run_doc["executor"], run["run"]["executor"]);
    assert_eq!(
        run_doc["executor_chain"],
        json!([{"executor": run["run"]["executor"], "outcome": "ran", "reason": null}])
    );
    docs.push(("cli run --json".into(), run_doc));
    // A walked chain: every outcome word this machine can produce (ran, unavailable, refused,
    // not_tried).
    let small = [
        "--head-dim",
        "64",
        "--seqlen",
        "32",
        "--heads",
        "2",
        "--kv-heads",
        "1",
    ];
    let te_run = |extra: &[&str]| {
        let args = [
            &["run", "--pack", "te", "--forward-only", "--json"][..],
            &small,
            extra,
        ]
        .concat();
        bin(&args)["decision"].clone()
    };
    docs.push(("cli run --pack te --json".into(), te_run(&[])));
    docs.push((
        "cli run --pack te --no-substitute --json".into(),
        te_run(&["--no-substitute"]),
    ));
    docs.push((
        "cli run --pack te (dropout) --json".into(),
        te_run(&["--set", "attention_dropout=0.1"]),
    ));
    // Without GPU executors (a GPU build may run `chunked` instead, leaving none unavailable).
    let words: &[&str] = if cfg!(feature = "cuda") {
        &["ran", "refused", "not_tried"]
    } else {
        &["ran", "unavailable", "refused", "not_tried"]
    };
    for outcome in words {
        assert!(
            docs.iter().any(|(_, d)| d["executor_chain"]
                .as_array()
                .is_some_and(|c| c.iter().any(|a| a["outcome"] == *outcome))),
            "a chain entry {outcome}"
        );
    }

    for (name, doc) in &docs {
        assert_valid(&v, name, doc);
    }
    // The documents cover the shapes the schema describes.
    let any = |f: &dyn Fn(&Json) -> bool| docs.iter().any(|(_, d)| f(d));
    let backends = |d: &Json| d["backends"].as_array().cloned().unwrap_or_default();
    let rules = |d: &Json| -> Vec<Json> {
        backends(d)
            .iter()
            .flat_map(|b| {
                let mut r = b["declined_by"].as_array().cloned().unwrap_or_default();
                r.extend(b["pending"].as_array().cloned().unwrap_or_default());
                r
            })
            .collect()
    };
    let status = |d: &Json, s: &str| backends(d).iter().any(|b| b["status"] == s);
    assert!(any(&|d| d["selected"].is_null()), "a no-backend case");
    assert!(any(&|d| d["provisional"] == true), "a provisional case");
    assert!(
        any(&|d| d["layers_disabled"] == json!(["guard"])),
        "a parity case"
    );
    assert!(
        any(&|d| rules(d).iter().any(|r| r["layer"] == "site")),
        "an overlay rule that fired"
    );
    for s in ["selected", "outranked", "declined", "disabled", "undecided"] {
        assert!(any(&|d| status(d, s)), "a backend with status {s}");
    }
    assert!(any(&|d| backends(d).iter().any(|b| b["status"]
        == "outranked"
        && b["outranked_by"].is_string())));
    assert!(any(&|d| rules(d).iter().any(|r| r["kind"] == "switch")));
    // No case holds an unparseable version (only cudnn_frontend_version and
    // cutlass_dsl_version keep one, issue 30; cli/tests/frost_rules.rs checks its form).
    assert!(any(&|d| d["pending_probes"]
        .as_array()
        .is_some_and(|p| !p.is_empty())));
    // `input` holds every fact.
    for (name, doc) in &docs {
        assert_eq!(
            doc["input"].as_object().map(|m| m.len()),
            Some(attn_policy::facts::te::FIELDS.len()),
            "{name}"
        );
    }
}

/// `run --json` prints the call document (docs/schema/call-v1.json), the shape Python's
/// `Explanation.to_dict()` returns: valid, and its top-level fields agree with its decision.
/// `te@auto`: the pack chosen for the installed release, with the warning (`pack_from`).
#[test]
fn te_auto_explanations_match_the_schema() {
    let v = validator();
    for (release, warned) in [("2.19.5", true), ("2.19.0", false)] {
        let auto = bin(&words(&format!(
            "explain --pack te@auto --set te_version={release} --preset gemma4-global --json"
        )));
        assert_eq!(auto["pack"], "te@2.19.0");
        assert_eq!(auto["pack_from"]["requested"], "te@auto");
        assert_eq!(auto["pack_from"]["installed"], release);
        assert_eq!(auto["pack_from"]["warning"].is_string(), warned);
        assert_valid(&v, &format!("explain --pack te@auto ({release})"), &auto);
    }
}

#[test]
fn run_documents_match_the_call_schema() {
    let call = validator_of("docs/schema/call-v1.json");
    let explain = validator();
    let small = "--head-dim 64 --seqlen 32 --heads 2 --kv-heads 1 --forward-only --json";
    for args in [
        format!("run --pack native {small} --verify never --probe cuda_device=false"),
        format!("run --pack te {small}"),
        format!("run --pack te {small} --no-substitute"),
        format!("run --pack te {small} --set attention_dropout=0.1"),
    ] {
        let doc = bin(&words(&args));
        assert_valid(&call, &args, &doc);
        assert_valid(&explain, &args, &doc["decision"]);
        assert_eq!(doc["schema"], "attn-policy/call/v1", "{args}");
        // Only the Python package's context-parallel and SDPA accounts have an `extra`.
        assert!(doc["extra"].is_null(), "{args}");
        assert_eq!(doc["backend"], doc["decision"]["selected"], "{args}");
        assert_eq!(doc["executor"], doc["decision"]["executor"], "{args}");
        assert_eq!(
            doc["executor_chain"], doc["decision"]["executor_chain"],
            "{args}"
        );
        // Ran: the run report names the executor and there is no error; else the error says why.
        match doc["executor"].as_str() {
            Some(e) => {
                assert_eq!(doc["run"]["executor"], e, "{args}");
                assert!(doc["error"].is_null(), "{args}");
            }
            None => assert!(doc["error"].is_string() && doc["run"].is_null(), "{args}"),
        }
    }
    // The schema is not vacuous: a document missing a field, or with a wrong outcome, fails.
    let mut doc = bin(&words(&format!("run --pack te {small}")));
    doc.as_object_mut().expect("object").remove("substitute");
    assert!(!call.is_valid(&doc));
    let mut doc = bin(&words(&format!("run --pack te {small}")));
    doc["executor_chain"][0]["outcome"] = json!("skipped");
    assert!(!call.is_valid(&doc));
}

#[test]
fn the_schema_rejects_broken_documents() {
    let v = validator();
    let policy = Policy::embedded("te").expect("te loads");
    let facts = Facts::from_json(&(PRESETS[0].config)()).expect("preset");
    let good = Explanation::new(&policy, &facts, &policy.decide(&facts)).to_json();
    assert_valid(&v, "the unbroken document", &good);
    let declined = good["backends"]
        .as_array()
        .and_then(|b| b.iter().position(|b| b["status"] == "declined"))
        .expect("a declined backend");
    type Break = Box<dyn Fn(&mut Json)>;
    let breaks: Vec<(&str, Break)> = vec![
        (
            "unknown status",
            Box::new(|d| d["backends"][0]["status"] = json!("maybe")),
        ),
        (
            "no input",
            Box::new(|d| {
                d.as_object_mut().expect("object").remove("input");
            }),
        ),
        ("an unknown field", Box::new(|d| d["extra"] = json!(1))),
        (
            "outranked_by on a declined backend",
            Box::new(move |d| d["backends"][declined]["outranked_by"] = json!(null)),
        ),
        (
            "a location without line:col",
            Box::new(|d| d["preference"]["location"] = json!("pack.yaml")),
        ),
        (
            "an unknown executor outcome",
            Box::new(|d| {
                d["executor_chain"] = json!([{"executor": "x", "outcome": "maybe", "reason": null}])
            }),
        ),
        (
            "a provenance word outside the vocabulary",
            Box::new(|d| d["provenance"] = json!({"head_dim_qk": "guess"})),
        ),
        (
            "a fact value that is an object",
            Box::new(|d| d["input"]["head_dim_qk"] = json!({})),
        ),
    ];
    for (what, f) in breaks {
        let mut doc = good.clone();
        f(&mut doc);
        assert!(!v.is_valid(&doc), "the schema accepts {what}");
    }
}

/// The TE tuple rendered from the model agrees with `conformance::te_view` (which reads the
/// decision directly, for speed over a corpus) on every curated case and the corpus' first
/// records, so the two readings of TE's semantics cannot drift apart.
#[test]
fn te_tuple_agrees_with_the_conformance_view() {
    let mut facts: Vec<(String, Facts)> = configs()
        .into_iter()
        .map(|(n, c)| (n, Facts::from_json(&c).expect("case")))
        .collect();
    // Beside the checkout in CI; ATTN_POLICY_CORPUS (as bindings/test.sh) for another layout.
    let corpus = std::env::var_os("ATTN_POLICY_CORPUS").map_or_else(
        || Path::new(ROOT).join("tests/corpora/te-2.20.2-corpus-a.jsonl.gz"),
        std::path::PathBuf::from,
    );
    let records = read_corpus(&corpus).expect("the TE corpus (tests/corpora)");
    // Records whose config TE itself would refuse (KV heads that do not divide the query
    // heads) are input errors, not decisions (conformance counts them apart).
    for r in records.iter().take(3000) {
        if let Ok(f) = record_facts(&r.config) {
            facts.push((r.id.clone(), f));
        }
    }
    for (pack, policy) in te_policies() {
        for (name, f) in &facts {
            let ex = Explanation::new(&policy, f, &policy.decide(f));
            let te = ex.te();
            let view = te_view(&policy, f);
            let ctx = format!("{pack}: {name}");
            assert_eq!(
                ex.selected.as_deref().unwrap_or("NoBackend"),
                view.selected,
                "{ctx}"
            );
            assert_eq!(te.available_backends, view.available, "{ctx}");
            let flash = match &te.flash_attention_backend {
                FactValue::Version(v) => Some(v.clone()),
                _ => None,
            };
            assert_eq!(flash, view.flash_version, "{ctx}");
            let fused = match te.fused_attention_backend {
                FactValue::Int(i) => Some(i),
                _ => None,
            };
            assert_eq!(fused, view.fused_sub_backend, "{ctx}");
            for (flag, backend) in [
                (te.use_flash_attention, "FlashAttention"),
                (te.use_fused_attention, "FusedAttention"),
                (te.use_unfused_attention, "UnfusedDotProductAttention"),
                (te.use_frost_attention, "FrostAttention"),
            ] {
                assert_eq!(
                    flag,
                    view.selected == backend,
                    "{ctx}: use_ flag of {backend}"
                );
            }
        }
    }
}
