//! Rule coverage over a corpus (`attn-policy coverage`), in the spirit of `opa test --coverage`:
//! how often each rule fired, and which rules no record exercised.

use serde::Serialize;

use attn_policy::Decision;
use attn_policy::Policy;
use attn_policy::Record;

#[derive(Clone, Debug, Serialize)]
pub struct RuleCount {
    /// The rule id (a layer rule declining several backends is one rule).
    pub rule: String,
    /// The backends it declines.
    pub backends: Vec<String>,
    /// Records where it fired (once per record, whichever of its backends it declined).
    pub fired: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct CoverageReport {
    pub records: usize,
    /// Records that were not decided: structurally invalid configs (docs/facts.md), with
    /// their line.
    pub input_errors: Vec<attn_policy::conformance::RecordError>,
    /// One entry per rule id, in pack order.
    pub rules: Vec<RuleCount>,
    pub never_fired: Vec<String>,
    /// Rule ids that fired / all rule ids.
    pub ratio: f64,
}

/// Decides every record (unanswered probes answered "supported") and counts, per rule id, the
/// records where it fired.
pub fn coverage(policy: &Policy, records: &[Record]) -> CoverageReport {
    // Rule ids in pack order, and each rule's index among them.
    let mut ids: Vec<(String, Vec<String>)> = Vec::new();
    let mut of_rule = Vec::with_capacity(policy.rules.len());
    for r in &policy.rules {
        let backend = policy.backends[r.backend as usize].name.clone();
        let i = match ids.iter().position(|(id, _)| *id == r.id) {
            Some(i) => i,
            None => {
                ids.push((r.id.clone(), Vec::new()));
                ids.len() - 1
            }
        };
        if !ids[i].1.contains(&backend) {
            ids[i].1.push(backend);
        }
        of_rule.push(i);
    }
    let mut counts = vec![0u64; ids.len()];
    let mut seen = vec![false; ids.len()];
    let mut input_errors = Vec::new();
    let mut d = Decision::default();
    for rec in records {
        let facts = match attn_policy::conformance::read_record(policy, rec) {
            Ok(f) => f,
            Err(error) => {
                input_errors.push(attn_policy::conformance::RecordError {
                    line: rec.line,
                    id: rec.id.clone(),
                    error,
                });
                continue;
            }
        };
        policy.decide_into(&facts, &mut d);
        seen.fill(false);
        for &r in &d.fired {
            let i = of_rule[r as usize];
            if !seen[i] {
                seen[i] = true;
                counts[i] += 1;
            }
        }
    }
    let rules: Vec<RuleCount> = ids
        .into_iter()
        .zip(&counts)
        .map(|((rule, backends), &fired)| RuleCount {
            rule,
            backends,
            fired,
        })
        .collect();
    let never_fired: Vec<String> = rules
        .iter()
        .filter(|r| r.fired == 0)
        .map(|r| r.rule.clone())
        .collect();
    let ratio = if rules.is_empty() {
        1.0
    } else {
        (rules.len() - never_fired.len()) as f64 / rules.len() as f64
    };
    CoverageReport {
        records: records.len(),
        input_errors,
        rules,
        never_fired,
        ratio,
    }
}
