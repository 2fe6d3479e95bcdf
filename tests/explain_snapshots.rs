//! `explain` for curated configurations: every preset plus the cases in tests/explain_cases/
//! (one JSON config each), against the embedded `te` pack with its guard layer. Human text
//! and JSON are snapshots, reviewed like code: a rule change shows here as a diff.
//!
//! The JSON snapshots hold the `explain/v1` document as it was before the explanation model;
//! fields added since (docs/decision-json.md, "Added fields") are taken out before comparing,
//! so these snapshots prove the document only gained fields. tests/explain_schema.rs checks
//! the added fields against the JSON Schema.

use std::path::Path;

use attn_policy::facts::ConfigText;
use attn_policy::facts::presets::PRESETS;
use attn_policy::{Explanation, Facts, Policy};

fn cases() -> Vec<(String, serde_json::Value)> {
    let mut out: Vec<(String, serde_json::Value)> = PRESETS
        .iter()
        .map(|p| (format!("preset-{}", p.name), (p.config)()))
        .collect();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/explain_cases");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("cases dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("case file");
        let name = f.file_stem().expect("name").to_string_lossy().into_owned();
        // Read as the CLI reads a config file: a key given twice is an error.
        let config = ConfigText::parse(&f.display().to_string(), &text)
            .unwrap_or_else(|e| panic!("{e}"))
            .value;
        out.push((name, config));
    }
    out
}

/// The document without the fields added after the snapshots were taken (each must be there).
fn without_added_fields(mut doc: serde_json::Value) -> serde_json::Value {
    let top = doc.as_object_mut().expect("an object");
    for key in ["input", "provenance", "executor", "executor_chain"] {
        assert!(top.remove(key).is_some(), "added field `{key}` missing");
    }
    for backend in top["backends"].as_array_mut().expect("backends") {
        for list in ["declined_by", "pending"] {
            for rule in backend[list].as_array_mut().expect("rules") {
                let rule = rule.as_object_mut().expect("a rule object");
                assert!(
                    rule.remove("probes").is_some(),
                    "added field `probes` missing"
                );
            }
        }
    }
    doc
}

#[test]
fn explain_snapshots() {
    let policy = Policy::embedded("te").expect("te pack loads");
    let cases = cases();
    assert!(cases.len() >= 30, "at least 30 curated configurations");
    for (name, config) in cases {
        let facts = Facts::from_json(&config).unwrap_or_else(|e| panic!("{name}: {e}"));
        let d = policy.decide(&facts);
        let ex = Explanation::new(&policy, &facts, &d);
        insta::with_settings!({snapshot_suffix => format!("{name}-text"), description => serde_json::to_string(&config).expect("json"), omit_expression => true}, {
            insta::assert_snapshot!(ex.to_text(false));
        });
        insta::with_settings!({snapshot_suffix => format!("{name}-json"), omit_expression => true}, {
            insta::assert_json_snapshot!(without_added_fields(ex.to_json()));
        });
    }
}
