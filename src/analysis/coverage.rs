//! Rule coverage over a corpus (`attn-policy coverage`), in the spirit of `opa test --coverage`:
//! how often each rule fired, and which rules no record exercised.

use serde::Serialize;

use crate::corpus::Record;
use crate::decision::Decision;
use crate::facts::Value;
use crate::facts::schema::Origin;
use crate::policy::Policy;

#[derive(Clone, Debug, Serialize)]
pub struct RuleCount {
    pub rule: String,
    pub backend: String,
    pub fired: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct CoverageReport {
    pub records: usize,
    /// Records whose config did not read (they count for nothing).
    pub invalid: Vec<String>,
    pub rules: Vec<RuleCount>,
    pub never_fired: Vec<String>,
    /// Fired rules / all rules.
    pub ratio: f64,
}

/// Decides every record (unanswered probes answered "supported") and counts fired rules.
pub fn coverage(policy: &Policy, records: &[Record]) -> CoverageReport {
    let mut counts = vec![0u64; policy.rules.len()];
    let mut invalid = Vec::new();
    let mut d = Decision::default();
    for rec in records {
        // PyTorch corpora keep the device beside the config (`torch`).
        let read = match policy.schema.family {
            "torch" => crate::conformance::torch_record_facts(policy, &rec.raw),
            _ => policy.read_facts(&rec.config).map_err(|e| e.to_string()),
        };
        let mut facts = match read {
            Ok(f) => f,
            Err(e) => {
                invalid.push(format!("{} (line {}): {e}", rec.id, rec.line));
                continue;
            }
        };
        for (s, def) in policy.schema.fields.iter().enumerate() {
            if def.origin == Origin::Probe && facts.values[s] == Value::Unknown {
                facts.values[s] = Value::Bool(true);
            }
        }
        policy.decide_into(&facts, &mut d);
        for &r in &d.fired {
            counts[r as usize] += 1;
        }
    }
    let rules: Vec<RuleCount> = policy
        .rules
        .iter()
        .zip(&counts)
        .map(|(r, &c)| RuleCount {
            rule: r.id.clone(),
            backend: policy.backends[r.backend as usize].name.clone(),
            fired: c,
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
        invalid,
        rules,
        never_fired,
        ratio,
    }
}
