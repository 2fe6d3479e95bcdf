//! `explain` for curated configurations: every preset plus the cases in tests/explain_cases/
//! (one JSON config each), against the embedded `te` pack with its guard layer. Human text
//! and JSON are snapshots, reviewed like code: a rule change shows here as a diff.

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
            insta::assert_json_snapshot!(ex.to_json());
        });
    }
}
