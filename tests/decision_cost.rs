//! The cost of a decision, guarded by a count instead of a clock: for every preset of every
//! embedded pack (and the whole corpus of its family, summed), the evaluation steps of
//! `Policy::decide_counting` (facts classified, rules visited, conditions, atoms and
//! definitions evaluated) must stay within 10% of `tests/baselines/decision-steps.txt`.
//! A change that needs more steps updates that file (and says why in its commit):
//!   ATTN_POLICY_UPDATE_BASELINES=1 cargo test --test decision_cost
//! New presets or packs add their rows the same way; a row nothing produces any more fails.

use std::collections::BTreeMap;
use std::path::Path;

use attn_policy::facts::{self, presets};
use attn_policy::{Decision, Policy};

const BASELINE: &str = "tests/baselines/decision-steps.txt";
/// Growth allowed over the baseline before the guard fails.
const SLACK: f64 = 0.10;

fn corpus_of(family: &str) -> &'static str {
    match family {
        "torch" => "tests/corpora/torch-2.11-sdpa-corpus-a.jsonl.gz",
        _ => "tests/corpora/te-2.20.2-corpus-a.jsonl.gz",
    }
}

/// `(pack, input) -> steps` measured now.
fn measure() -> BTreeMap<(String, String), u64> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut rows = BTreeMap::new();
    for name in attn_policy::pack::embedded_pack_names() {
        let policy = Policy::embedded(name).expect("embedded pack loads");
        let family = facts::family(policy.schema.family).expect("a known family");
        let mut d = Decision::default();
        for p in presets::of_family(family.family) {
            let facts = family.read(&(p.config)()).expect("preset is valid");
            let steps = policy.decide_counting(&facts, &mut d);
            rows.insert((name.to_string(), p.name.to_string()), steps);
        }
        let records = attn_policy::read_corpus(&root.join(corpus_of(family.family)))
            .expect("tests/corpora ships the corpus");
        let mut total = 0;
        for r in &records {
            // Records that are input errors are never decided.
            if let Ok(facts) = attn_policy::conformance::read_record(&policy, r) {
                total += policy.decide_counting(&facts, &mut d);
            }
        }
        rows.insert((name.to_string(), "corpus-total".to_string()), total);
    }
    rows
}

fn parse(text: &str) -> BTreeMap<(String, String), u64> {
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(
                cols.len(),
                3,
                "{BASELINE}: bad row `{l}` (pack input steps)"
            );
            let steps = cols[2]
                .parse()
                .unwrap_or_else(|_| panic!("{BASELINE}: bad count in `{l}`"));
            ((cols[0].to_string(), cols[1].to_string()), steps)
        })
        .collect()
}

fn render(rows: &BTreeMap<(String, String), u64>) -> String {
    let mut out = String::from(
        "# Evaluation steps per decision (Policy::decide_counting), guarded by tests/decision_cost.rs.\n\
         # corpus-total: summed over the family's corpus in tests/corpora/.\n\
         # pack input steps\n",
    );
    for ((pack, input), steps) in rows {
        out.push_str(&format!("{pack} {input} {steps}\n"));
    }
    out
}

#[test]
fn decision_steps_stay_within_ten_percent_of_the_baseline() {
    let now = measure();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(BASELINE);
    if std::env::var_os("ATTN_POLICY_UPDATE_BASELINES").is_some() {
        std::fs::write(&path, render(&now)).expect("write the baseline");
        return;
    }
    let text = std::fs::read_to_string(&path).expect("the baseline file exists");
    let base = parse(&text);
    let mut problems = Vec::new();
    for (key, &steps) in &now {
        match base.get(key) {
            None => problems.push(format!(
                "{} {}: {steps} steps, no baseline row",
                key.0, key.1
            )),
            Some(&b) if steps as f64 > b as f64 * (1.0 + SLACK) => problems.push(format!(
                "{} {}: {steps} steps, baseline {b} (+{:.1}%)",
                key.0,
                key.1,
                (steps as f64 / b as f64 - 1.0) * 100.0
            )),
            Some(_) => {}
        }
    }
    for key in base.keys().filter(|k| !now.contains_key(*k)) {
        problems.push(format!(
            "{} {}: baseline row for an input that no longer exists",
            key.0, key.1
        ));
    }
    assert!(
        problems.is_empty(),
        "decision cost regressed (more than {}% over {BASELINE}):\n  {}\n\
         If the growth is intended, rerun with ATTN_POLICY_UPDATE_BASELINES=1 and commit the file.",
        SLACK * 100.0,
        problems.join("\n  ")
    );
}
