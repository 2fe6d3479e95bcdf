//! Differential conformance: decide every record of a corpus with a pack and compare with the
//! selector's own decision. The pack's family names the selector: `te` packs against a
//! TransformerEngine corpus (tests/corpora/README.md), `torch` packs against a PyTorch
//! SDPA corpus (README.torch.md, [`run_torch`]).
//!
//! TE, compared per record: the selected backend, the flash-attn version TE reports
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
use crate::facts::{Facts, InputError, Value};
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
    /// Whose decisions the records hold ("TE", "PyTorch").
    pub reference: &'static str,
    /// Every record of the corpus.
    pub total: usize,
    /// Valid records on which every compared field agrees.
    pub agree: usize,
    /// Per backend the reference selected ("NoBackend", or "raised" when it raised), over
    /// valid records: (agree, total).
    pub per_backend: BTreeMap<String, (usize, usize)>,
    pub classes: BTreeMap<ClassKey, Class>,
    /// Records whose config is structurally invalid (not decided, not in the rate), in order.
    pub input_errors: Vec<RecordError>,
    /// Where the records hold each backend's eligibility on its own (PyTorch corpora): per
    /// (valid record, backend), how often the pack agrees, out of how many.
    pub eligibility: Option<(usize, usize)>,
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
        let mut out = json!({
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
        });
        if let Some((agree, total)) = self.eligibility {
            out["eligibility_agree"] = json!(agree);
            out["eligibility_total"] = json!(total);
        }
        out
    }

    fn reference(&self) -> &'static str {
        if self.reference.is_empty() {
            "TE"
        } else {
            self.reference
        }
    }

    pub fn to_text(&self, top: usize) -> String {
        let mut out = format!(
            "agreement: {}/{} valid records ({:.2}%), {} disagree\n",
            self.agree,
            self.valid(),
            100.0 * self.rate(),
            self.disagree()
        );
        if let Some((a, t)) = self.eligibility {
            out.push_str(&format!(
                "eligibility (every backend of every valid record): {a}/{t} ({:.2}%)\n",
                100.0 * a as f64 / t.max(1) as f64
            ));
        }
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
        out.push_str(&format!("per backend {} selected:\n", self.reference()));
        for (k, (a, t)) in &self.per_backend {
            out.push_str(&format!(
                "  {k:<28} {a}/{t} ({:.2}%)\n",
                100.0 * *a as f64 / (*t).max(1) as f64
            ));
        }
        let classes = self.largest_classes();
        if !classes.is_empty() {
            out.push_str(&format!(
                "largest classes of disagreement ({} -> pack):\n",
                self.reference()
            ));
            for (k, c) in classes.into_iter().take(top) {
                out.push_str(&format!("  {:>6}  {}  e.g. {}\n", c.count, k.0, c.example));
            }
        }
        out
    }
}

/// Facts of a te record's config, with every probe answered "supported".
pub fn record_facts(config: &Json) -> Result<Facts, InputError> {
    answer_probes(Facts::from_json(config)?)
}

/// Every unanswered probe of the facts' family answered "supported".
fn answer_probes(mut facts: Facts) -> Result<Facts, InputError> {
    let probes: Vec<&str> = facts.schema().probe_names().collect();
    for path in probes {
        if facts.get(path) == Some(Value::Unknown) {
            facts.set_probe(path.trim_start_matches("probe."), Some(true))?;
        }
    }
    Ok(facts)
}

/// A corpus record's facts for `policy`'s family, unanswered probes answered "supported":
/// te reads the record's `config`, torch its `config` with the device ([`torch_record_facts`]).
/// An error (the record's own, or its config's) is located at the record's line.
pub fn read_record(policy: &Policy, rec: &Record) -> Result<Facts, InputError> {
    let read = match &rec.error {
        Some(e) => Err(e.clone()),
        None => match policy.schema.family {
            "torch" => torch_record_facts(policy, &rec.raw),
            _ => policy.read_facts(&rec.config),
        },
    };
    read.and_then(answer_probes)
        .map_err(|e| e.at(rec.locate_config_error()))
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

/// Runs every record against the selector of the pack's family.
pub fn run(policy: &Policy, records: &[Record]) -> Report {
    match policy.schema.family {
        "torch" => run_torch(policy, records),
        _ => run_te(policy, records),
    }
}

impl Report {
    /// Counts a record that was not decided.
    fn input_error(&mut self, rec: &Record, error: InputError) {
        self.total += 1;
        self.input_errors.push(RecordError {
            line: rec.line,
            id: rec.id.clone(),
            error,
        });
    }
}

/// Counts one record's comparison: agreement per group, and its class when it disagrees.
fn tally(r: &mut Report, group: String, id: &str, diffs: Vec<String>) {
    r.total += 1;
    let entry = r.per_backend.entry(group).or_default();
    entry.1 += 1;
    if diffs.is_empty() {
        r.agree += 1;
        entry.0 += 1;
    } else {
        let c = r.classes.entry(ClassKey(diffs.join("; "))).or_default();
        if c.count == 0 {
            c.example = id.to_string();
        }
        c.count += 1;
    }
}

/// Runs every record of a TE corpus.
pub fn run_te(policy: &Policy, records: &[Record]) -> Report {
    let mut r = Report {
        reference: "TE",
        ..Report::default()
    };
    for rec in records {
        let facts = match read_record(policy, rec) {
            Ok(f) => f,
            Err(error) => {
                r.input_error(rec, error);
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
        tally(&mut r, group, &rec.id, diffs);
    }
    r
}

// ---- PyTorch SDPA ------------------------------------------------------------------------------

/// The backends of a PyTorch SDPA corpus (`choice`, `eligible`), as the `torch` pack names them.
pub const TORCH_BACKENDS: [&str; 4] = ["flash", "efficient", "cudnn", "math"];

/// Facts of a PyTorch corpus record: its `config` with the record's `torch` object (version,
/// cudnn, sm). The corpus was made under `torch.use_deterministic_algorithms(deterministic,
/// warn_only=True)` (README.torch.md), so `deterministic_warn_only` is true unless the config
/// says otherwise.
pub fn torch_record_facts(policy: &Policy, raw: &Json) -> Result<Facts, InputError> {
    let mut config = raw
        .get("config")
        .and_then(Json::as_object)
        .cloned()
        .ok_or_else(|| {
            InputError::new("config", "the record has no `config` object")
                .kind(crate::facts::InputErrorKind::Syntax)
        })?;
    if let Some(torch) = raw.get("torch") {
        config.entry("torch").or_insert_with(|| torch.clone());
    }
    config
        .entry("deterministic_warn_only")
        .or_insert(Json::Bool(true));
    policy.read_facts(&Json::Object(config))
}

/// The pack's answer in a PyTorch corpus' terms: the selected backend (`None`: PyTorch would
/// raise "No available kernel") and each backend's eligibility in [`TORCH_BACKENDS`] order.
#[derive(Clone, Debug, PartialEq)]
pub struct TorchView {
    pub choice: Option<String>,
    pub eligible: [bool; 4],
}

pub fn torch_view(policy: &Policy, facts: &Facts) -> TorchView {
    let d = policy.decide(facts);
    TorchView {
        choice: d.selected.map(|s| policy.backends[s as usize].name.clone()),
        eligible: TORCH_BACKENDS.map(|name| {
            policy
                .backend_index(name)
                .is_some_and(|b| d.backends[b].status.eligible())
        }),
    }
}

/// Compares a PyTorch record (`choice`, `eligible`) with the pack: the differing fields, and
/// how many of the record's per-backend eligibilities agree (out of those it states).
pub fn torch_differences(raw: &Json, pack: &TorchView) -> (Vec<String>, usize, usize) {
    let mut diffs = Vec::new();
    let choice = raw.get("choice").and_then(Json::as_str);
    if choice != pack.choice.as_deref() {
        diffs.push(format!(
            "choice {} -> {}",
            show(choice),
            show(pack.choice.as_deref())
        ));
    }
    let (mut agree, mut total) = (0, 0);
    for (i, name) in TORCH_BACKENDS.iter().enumerate() {
        let Some(theirs) = raw
            .get("eligible")
            .and_then(|e| e.get(name))
            .and_then(Json::as_bool)
        else {
            continue;
        };
        total += 1;
        if theirs == pack.eligible[i] {
            agree += 1;
        } else {
            diffs.push(format!("eligible {name} {theirs} -> {}", pack.eligible[i]));
        }
    }
    (diffs, agree, total)
}

/// Runs every record of a PyTorch SDPA corpus: a record agrees when the choice and every
/// backend's eligibility agree; `eligibility` counts the per-backend agreements.
pub fn run_torch(policy: &Policy, records: &[Record]) -> Report {
    let mut r = Report {
        reference: "PyTorch",
        eligibility: Some((0, 0)),
        ..Report::default()
    };
    for rec in records {
        let group = match rec.raw.get("choice") {
            Some(Json::String(s)) => s.clone(),
            _ => "raised".to_string(),
        };
        let facts = match read_record(policy, rec) {
            Ok(f) => f,
            Err(error) => {
                r.input_error(rec, error);
                continue;
            }
        };
        let view = torch_view(policy, &facts);
        let (diffs, agree, total) = torch_differences(&rec.raw, &view);
        if let Some((a, t)) = r.eligibility.as_mut() {
            *a += agree;
            *t += total;
        }
        tally(&mut r, group, &rec.id, diffs);
    }
    r
}
