//! Differential conformance: decide every record of a TransformerEngine corpus (see
//! ../shared/conformance/README.md) with a pack and compare with TE's own decision.
//!
//! Compared per record: the selected backend, the flash-attn version TE reports
//! (`flash_attention_backend`, set whenever FlashAttention is eligible), the fused sub-backend
//! (`fused_attention_backend`, set whenever FusedAttention is eligible) and
//! `available_backends` `[flash, fused, unfused]`. A record where TE raised (`decision` null)
//! agrees only if the pack selects nothing. Probe facts are answered "supported", as the
//! corpus' emulated cuDNN accepted every graph (fidelity limit 1).
//!
//! A record whose config is structurally invalid (docs/facts.md: a domain or a constraint of
//! the family, such as KV heads that do not divide the query heads) is an *input error*: it is
//! not decided, it is reported with its line, and the agreement rate is over the valid records.
//! `--parity` changes nothing about them (validation precedes every rule and layer).

use std::collections::BTreeMap;

use serde_json::{Value as Json, json};

use crate::corpus::Record;
use crate::facts::{Facts, Value};
use crate::lang::Version;
use crate::policy::Policy;

/// The backends TE 2.20.2 reports, in `available_backends` order.
pub const TE_BACKENDS: [&str; 3] = [
    "FlashAttention",
    "FusedAttention",
    "UnfusedDotProductAttention",
];

/// The pack's answer in TE's terms.
#[derive(Clone, Debug, PartialEq)]
pub struct TeView {
    /// Backend name, or "NoBackend".
    pub selected: String,
    pub flash_version: Option<String>,
    pub fused_sub_backend: Option<i64>,
    pub available: [bool; 3],
}

/// A class of disagreement: the fields that differ and how.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClassKey(pub String);

#[derive(Clone, Debug, Default)]
pub struct Class {
    pub count: usize,
    pub example: String,
}

/// A record that was not decided: its config is structurally invalid.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RecordError {
    pub line: usize,
    pub id: String,
    pub error: crate::facts::InputError,
}

/// Aggregated result of a conformance run.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Every record of the corpus.
    pub total: usize,
    /// Valid records where the pack agrees with TE.
    pub agree: usize,
    /// Per backend TE selected ("NoBackend", or "raised" when TE raised), over valid records:
    /// (agree, total).
    pub per_backend: BTreeMap<String, (usize, usize)>,
    pub classes: BTreeMap<ClassKey, Class>,
    /// Records whose config is structurally invalid (not decided, not in the rate), in order.
    pub input_errors: Vec<RecordError>,
}

impl Report {
    /// Records that were decided.
    pub fn valid(&self) -> usize {
        self.total - self.input_errors.len()
    }

    pub fn disagree(&self) -> usize {
        self.valid() - self.agree
    }

    /// Agreement over the valid records (1.0 when there are none: then nothing disagreed; the
    /// report says how many were input errors).
    pub fn rate(&self) -> f64 {
        if self.valid() == 0 {
            1.0
        } else {
            self.agree as f64 / self.valid() as f64
        }
    }

    /// Input errors grouped by what is wrong (the error without its values), largest first:
    /// (kind and path, count, first line).
    pub fn input_error_classes(&self) -> Vec<(String, usize, usize)> {
        let mut by: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for e in &self.input_errors {
            let key = format!(
                "{}: {}",
                serde_json::to_value(e.error.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                e.error.path
            );
            let entry = by.entry(key).or_insert((0, e.line));
            entry.0 += 1;
        }
        let mut v: Vec<(String, usize, usize)> =
            by.into_iter().map(|(k, (n, line))| (k, n, line)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }

    /// Disagreement classes, largest first (ties by key).
    pub fn largest_classes(&self) -> Vec<(&ClassKey, &Class)> {
        let mut v: Vec<_> = self.classes.iter().collect();
        v.sort_by(|a, b| b.1.count.cmp(&a.1.count).then(a.0.cmp(b.0)));
        v
    }

    pub fn to_json(&self, top: usize) -> Json {
        let per: serde_json::Map<String, Json> = self
            .per_backend
            .iter()
            .map(|(k, (a, t))| (k.clone(), json!({"agree": a, "total": t})))
            .collect();
        let classes: Vec<Json> = self
            .largest_classes()
            .into_iter()
            .take(top)
            .map(|(k, c)| json!({"difference": k.0, "count": c.count, "example": c.example}))
            .collect();
        let errors: Vec<Json> = self
            .input_errors
            .iter()
            .take(top)
            .map(|e| json!({"line": e.line, "id": e.id, "error": e.error, "message": e.error.to_string()}))
            .collect();
        let error_classes: Vec<Json> = self
            .input_error_classes()
            .into_iter()
            .map(|(k, n, line)| json!({"error": k, "count": n, "first_line": line}))
            .collect();
        json!({
            "total": self.total,
            "valid": self.valid(),
            "agree": self.agree,
            "disagree": self.disagree(),
            "rate": self.rate(),
            "input_errors": self.input_errors.len(),
            "input_error_classes": error_classes,
            "input_error_records": errors,
            "per_backend": per,
            "classes": classes,
        })
    }

    pub fn to_text(&self, top: usize) -> String {
        let mut out = format!(
            "agreement: {}/{} valid records ({:.2}%), {} disagree\n",
            self.agree,
            self.valid(),
            100.0 * self.rate(),
            self.disagree()
        );
        if !self.input_errors.is_empty() {
            out.push_str(&format!(
                "input errors: {} of {} records are structurally invalid (not decided; docs/facts.md):\n",
                self.input_errors.len(),
                self.total
            ));
            for (k, n, line) in self.input_error_classes().into_iter().take(top) {
                out.push_str(&format!("  {n:>6}  {k}  first at line {line}\n"));
            }
            if let Some(e) = self.input_errors.first() {
                out.push_str(&format!("  e.g. line {} ({}): {}\n", e.line, e.id, e.error));
            }
        }
        out.push_str("per backend TE selected:\n");
        for (k, (a, t)) in &self.per_backend {
            out.push_str(&format!(
                "  {k:<28} {a}/{t} ({:.2}%)\n",
                100.0 * *a as f64 / (*t).max(1) as f64
            ));
        }
        let classes = self.largest_classes();
        if !classes.is_empty() {
            out.push_str("largest classes of disagreement (TE -> pack):\n");
            for (k, c) in classes.into_iter().take(top) {
                out.push_str(&format!("  {:>6}  {}  e.g. {}\n", c.count, k.0, c.example));
            }
        }
        out
    }
}

/// Facts of a record's config, with every probe answered "supported".
pub fn record_facts(config: &Json) -> Result<Facts, crate::facts::InputError> {
    let mut facts = Facts::from_json(config)?;
    for probe in crate::facts::te::FIELDS
        .iter()
        .filter(|d| d.origin == crate::facts::schema::Origin::Probe)
    {
        let name = probe.path.trim_start_matches("probe.");
        if facts.get(probe.path) == Some(Value::Unknown) {
            facts.set_probe(name, Some(true))?;
        }
    }
    Ok(facts)
}

/// The pack's decision for `facts`, in TE's terms.
pub fn te_view(policy: &Policy, facts: &Facts) -> TeView {
    let d = policy.decide(facts);
    let idx = |name: &str| policy.backend_index(name);
    let eligible = |b: Option<usize>| b.is_some_and(|b| d.backends[b].status.eligible());
    let value = |b: Option<usize>| {
        b.filter(|&b| d.backends[b].status.eligible())
            .map(|b| d.backends[b].value)
    };
    let [fl, fu, un] = TE_BACKENDS.map(idx);
    TeView {
        selected: d.selected.map_or_else(
            || "NoBackend".to_string(),
            |s| policy.backends[s as usize].name.clone(),
        ),
        flash_version: value(fl).and_then(|v| match v {
            Value::Version(v) => Some(v.to_string()),
            _ => None,
        }),
        fused_sub_backend: value(fu).and_then(|v| match v {
            Value::Int(i) => Some(i),
            _ => None,
        }),
        available: [eligible(fl), eligible(fu), eligible(un)],
    }
}

fn version_eq(te: Option<&str>, pack: Option<&str>) -> bool {
    match (te, pack) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            a == b || Version::parse(a).is_some_and(|x| Version::parse(b) == Some(x))
        }
        _ => false,
    }
}

fn show<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "null".to_string(), |x| x.to_string())
}

/// Compares the pack with TE's decision object: the differing fields, empty when they agree.
pub fn differences(te: &Json, pack: &TeView) -> Vec<String> {
    let mut diffs = Vec::new();
    let te_sel = te.get("selected").and_then(Json::as_str).unwrap_or("?");
    if te_sel != pack.selected {
        diffs.push(format!("selected {te_sel} -> {}", pack.selected));
    }
    let te_flash = te.get("flash_attention_backend").and_then(Json::as_str);
    if !version_eq(te_flash, pack.flash_version.as_deref()) {
        diffs.push(format!(
            "flash version {} -> {}",
            show(te_flash),
            show(pack.flash_version.as_deref())
        ));
    }
    let te_fused = te.get("fused_attention_backend").and_then(Json::as_i64);
    if te_fused != pack.fused_sub_backend {
        diffs.push(format!(
            "fused sub-backend {} -> {}",
            show(te_fused),
            show(pack.fused_sub_backend)
        ));
    }
    let te_avail: Vec<bool> = te
        .get("available_backends")
        .and_then(Json::as_array)
        .map(|a| a.iter().map(|x| x.as_bool().unwrap_or(false)).collect())
        .unwrap_or_default();
    for (i, name) in TE_BACKENDS.iter().enumerate() {
        let t = te_avail.get(i).copied().unwrap_or(false);
        if t != pack.available[i] {
            diffs.push(format!("available {name} {t} -> {}", pack.available[i]));
        }
    }
    diffs
}

/// Runs every record.
pub fn run(policy: &Policy, records: &[Record]) -> Report {
    let mut r = Report::default();
    for rec in records {
        r.total += 1;
        let facts = match rec
            .error
            .clone()
            .map_or_else(|| record_facts(&rec.config), Err)
        {
            Ok(f) => f,
            Err(error) => {
                r.input_errors.push(RecordError {
                    line: rec.line,
                    id: rec.id.clone(),
                    error: error.at(rec.locate_config_error()),
                });
                continue;
            }
        };
        let raised = rec.decision.is_null();
        let group = if raised {
            "raised".to_string()
        } else {
            rec.decision
                .get("selected")
                .and_then(Json::as_str)
                .unwrap_or("?")
                .to_string()
        };
        let entry = r.per_backend.entry(group).or_default();
        entry.1 += 1;
        let view = te_view(policy, &facts);
        let diffs = if raised {
            if view.selected == "NoBackend" {
                Vec::new()
            } else {
                vec![format!("TE raised -> selected {}", view.selected)]
            }
        } else {
            differences(&rec.decision, &view)
        };
        if diffs.is_empty() {
            r.agree += 1;
            entry.0 += 1;
        } else {
            let c = r.classes.entry(ClassKey(diffs.join("; "))).or_default();
            if c.count == 0 {
                c.example = rec.id.clone();
            }
            c.count += 1;
        }
    }
    r
}
