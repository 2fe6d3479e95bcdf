//! The explanation model and its one builder, [`Explanation::new`].
//!
//! Field order of every serialised struct is the order of the `explain/v1` document
//! (docs/decision-json.md): the fields that existed before the model come first, fields added
//! since come last, so the document only ever gains fields.

use serde::ser::{SerializeMap, SerializeStruct};
use serde::{Serialize, Serializer};
use serde_json::Value as Json;

use crate::decision::{Decision, Status};
use crate::facts::Facts;
use crate::policy::{Policy, RuleKind};

/// A fact value as an explanation shows it: typed and owned, so each renderer picks its form
/// (JSON: enums and versions as strings; text: enums quoted, floats in Rust's notation).
#[derive(Clone, Debug, PartialEq)]
pub enum FactValue {
    /// An absent optional fact.
    Null,
    /// A probe no adapter has answered.
    Unknown,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// An enum value, by name.
    Enum(String),
    Version(String),
    /// A version string that did not parse; its raw text when the facts kept it.
    Unparseable(Option<String>),
}

impl FactValue {
    /// The JSON form (`explain/v1`): enums and versions as strings, unknown probes as
    /// `"unknown"`, an unparseable version as `"<raw> (unparseable)"`, non-finite floats as null.
    pub fn to_json(&self) -> Json {
        match self {
            FactValue::Null => Json::Null,
            FactValue::Unknown => Json::String("unknown".into()),
            FactValue::Bool(b) => Json::Bool(*b),
            FactValue::Int(i) => Json::from(*i),
            FactValue::Float(f) => {
                serde_json::Number::from_f64(*f).map_or(Json::Null, Json::Number)
            }
            FactValue::Enum(s) | FactValue::Version(s) => Json::String(s.clone()),
            FactValue::Unparseable(Some(raw)) => Json::String(format!("{raw} (unparseable)")),
            FactValue::Unparseable(None) => Json::String("unparseable".into()),
        }
    }

    /// The text form of a rule's offending value: enums quoted, an unparseable version with
    /// its raw text quoted.
    pub fn text(&self) -> String {
        match self {
            FactValue::Unparseable(Some(raw)) => format!("{raw:?} (unparseable)"),
            other => other.plain_text(),
        }
    }

    /// The text form without the raw text of an unparseable version.
    pub fn plain_text(&self) -> String {
        match self {
            FactValue::Null => "null".into(),
            FactValue::Unknown => "unknown".into(),
            FactValue::Bool(b) => b.to_string(),
            FactValue::Int(i) => i.to_string(),
            FactValue::Float(x) => format!("{x:?}"),
            FactValue::Enum(s) => format!("{s:?}"),
            FactValue::Version(v) => v.clone(),
            FactValue::Unparseable(_) => "<unparseable version>".into(),
        }
    }
}

impl Serialize for FactValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(s)
    }
}

/// Name -> value pairs in a fixed order, serialised as a JSON object.
#[derive(Clone, Debug, PartialEq)]
pub struct OrderedMap<V>(pub Vec<(String, V)>);

impl<V> Default for OrderedMap<V> {
    fn default() -> Self {
        OrderedMap(Vec::new())
    }
}

impl<V> OrderedMap<V> {
    pub fn get(&self, name: &str) -> Option<&V> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &V)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl<V: Serialize> Serialize for OrderedMap<V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// A backend's chosen variant and the value it reports (TE: the flash-attn version, the fused
/// sub-backend number).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VariantChoice {
    pub name: String,
    pub value: FactValue,
}

/// The preference entry whose condition held: it ordered the eligible backends.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PreferenceApplied {
    pub id: String,
    /// The condition (`None`: the unconditional entry), as written but with the pack's
    /// internal definitions written out: only facts and public definitions are named.
    pub when: Option<String>,
    pub order: Vec<String>,
    /// `file:line:col`.
    pub location: String,
}

/// One rule whose condition held (in `declined_by`) or is unknown (in `pending`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RuleExplanation {
    pub id: String,
    pub layer: String,
    pub kind: RuleKind,
    pub reason: String,
    /// The condition, as written but with the pack's internal definitions written out: it
    /// names only facts and public definitions (`Policy::definitions`, docs/definitions.md).
    pub when: String,
    /// Where the condition is written: `file:line:col`.
    pub location: String,
    pub refs: Vec<String>,
    /// The variants the rule declines; `None`: all of them.
    pub variants: Option<Vec<String>>,
    /// Every fact the condition read, with its value.
    pub values: OrderedMap<FactValue>,
    /// The probe facts the condition reads (a pending rule waits for them). Added.
    pub probes: Vec<String>,
}

/// Where a backend stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendStatus {
    Selected,
    /// Eligible, but `by` came first in the preference order (`None`: nothing was selected,
    /// e.g. the backend is missing from the order that applied).
    Outranked {
        by: Option<String>,
    },
    /// Every applicable variant is declined by at least one rule (or none is applicable).
    Declined,
    /// Declined only by environment switches.
    Disabled,
    /// Eligible unless a probe answers otherwise.
    Undecided,
}

impl BackendStatus {
    pub fn word(&self) -> &'static str {
        match self {
            BackendStatus::Selected => "selected",
            BackendStatus::Outranked { .. } => "outranked",
            BackendStatus::Declined => "declined",
            BackendStatus::Disabled => "disabled",
            BackendStatus::Undecided => "undecided",
        }
    }

    pub fn eligible(&self) -> bool {
        matches!(
            self,
            BackendStatus::Selected | BackendStatus::Outranked { .. }
        )
    }
}

/// A variant whose `applicable` condition does not hold.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UnavailableVariant {
    pub name: String,
    /// The `applicable` condition (`None`: none written), with the pack's internal
    /// definitions written out, as `when` of a rule.
    pub applicable: Option<String>,
    /// Added: every fact the condition read, with its value.
    pub values: OrderedMap<FactValue>,
}

/// One backend of the pack.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendExplanation {
    pub name: String,
    pub status: BackendStatus,
    /// The chosen variant when eligible and the backend has variants.
    pub variant: Option<VariantChoice>,
    /// Every rule of this backend whose condition held, in pack order.
    pub declined_by: Vec<RuleExplanation>,
    /// Every rule of this backend whose condition waits for a probe.
    pub pending: Vec<RuleExplanation>,
    pub unavailable_variants: Vec<UnavailableVariant>,
}

impl Serialize for BackendExplanation {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let outranked = matches!(self.status, BackendStatus::Outranked { .. });
        let mut o = s.serialize_struct("Backend", 6 + outranked as usize)?;
        o.serialize_field("name", &self.name)?;
        o.serialize_field("status", self.status.word())?;
        o.serialize_field("variant", &self.variant)?;
        if let BackendStatus::Outranked { by } = &self.status {
            o.serialize_field("outranked_by", by)?;
        }
        o.serialize_field("declined_by", &self.declined_by)?;
        o.serialize_field("pending", &self.pending)?;
        o.serialize_field("unavailable_variants", &self.unavailable_variants)?;
        o.end()
    }
}

/// What happened to one entry of an executor chain (`executors:` in the pack).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutorOutcome {
    Ran,
    /// The executor refused the problem (its typed reason in `reason`), or the configuration
    /// is not expressible as an executor problem.
    Refused,
    /// Not usable here: no GPU, feature off, library missing, provided by the Python host.
    Unavailable,
    /// Its check or plan step returned an error that is not a refusal (a library call failed):
    /// the next entry runs as a substitute. Or the entry that ran failed while running: an
    /// error of the call, never retried on another entry.
    Failed,
    /// An earlier entry ran, `no_substitute` ended the walk before this entry, or the caller
    /// selects without running (the C ABI).
    NotTried,
}

impl ExecutorOutcome {
    /// The word of the JSON document and the text.
    pub fn word(self) -> &'static str {
        match self {
            ExecutorOutcome::Ran => "ran",
            ExecutorOutcome::Refused => "refused",
            ExecutorOutcome::Unavailable => "unavailable",
            ExecutorOutcome::Failed => "failed",
            ExecutorOutcome::NotTried => "not_tried",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExecutorAttempt {
    pub executor: String,
    pub outcome: ExecutorOutcome,
    pub reason: Option<String>,
}

/// An input field the pack's release does not read (see [`Explanation::unread_inputs`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UnreadInput {
    pub field: String,
    /// `te@2.19.0 does not read `softcap` (...)`.
    pub note: String,
}

/// How the pack that decided was chosen when it was named `te@auto` (see
/// [`Explanation::pack_from`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PackFrom {
    /// The name asked for (`te@auto`).
    pub requested: String,
    /// The installed upstream release it resolved against (`2.19.5`).
    pub installed: String,
    /// The upstream project (`TransformerEngine`), for the text; not in the JSON.
    #[serde(skip)]
    pub upstream: String,
    /// Set when that release has no pack of its own: which pack decided instead, and why.
    pub warning: Option<String>,
}

/// The `schema` field of the `explain/v1` JSON document (`json.rs`).
pub const SCHEMA: &str = "attn-policy/explain/v1";

/// The explanation of one decision (`attn-policy/explain/v1`, docs/decision-json.md).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Explanation {
    /// Always [`SCHEMA`].
    pub schema: &'static str,
    pub pack: String,
    /// Set when the pack was named `te@auto`: the installed release `pack` was chosen for,
    /// and the warning when it is not that release's own pack. Left out of the JSON otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pack_from: Option<PackFrom>,
    pub selected: Option<String>,
    /// The selected backend's variant.
    pub variant: Option<VariantChoice>,
    pub preference: Option<PreferenceApplied>,
    /// Probe facts some pending rule waits for, sorted.
    pub pending_probes: Vec<String>,
    /// An undecided backend precedes the selected one: a probe answer could change the choice.
    pub provisional: bool,
    pub layers_disabled: Vec<String>,
    /// Input fields the pack's upstream release does not have, set in this input (`softcap`
    /// on `te@2.19.0`): the decision reads them as absent. Left out of the JSON when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unread_inputs: Vec<UnreadInput>,
    /// Every backend of the pack, in pack order.
    pub backends: Vec<BackendExplanation>,
    /// Added: every fact the decision read, by path, in schema order.
    pub input: OrderedMap<FactValue>,
    /// Added: where input facts came from, by input key (a source word: `preset`, `config`,
    /// `flag`, `live`, `shell` (an environment variable of the shell), and the Python TE drop-in's `object`, `argument`, `set_environment`,
    /// `probe`, `os.environ`, `default`); empty when the caller does not know.
    pub provenance: OrderedMap<String>,
    /// Added: the executor that ran, when one ran.
    pub executor: Option<String>,
    /// Added: each executor tried for the selected backend, in chain order.
    pub executor_chain: Vec<ExecutorAttempt>,
}

impl Explanation {
    /// Builds the explanation of `decision`, which `policy` made for `facts`. The only place
    /// that turns a decision's indices into names, values and locations.
    pub fn new(policy: &Policy, facts: &Facts, decision: &Decision) -> Explanation {
        let p = policy;
        let d = decision;
        let name = |b: u16| p.backends[b as usize].name.clone();
        let rule = |i: u32| {
            let rule = &p.rules[i as usize];
            RuleExplanation {
                id: rule.id.clone(),
                layer: p.layers[rule.layer as usize].clone(),
                kind: rule.kind,
                reason: rule.reason.clone(),
                when: rule.when_shown.clone(),
                location: p.sources.describe(rule.when_loc),
                refs: rule.refs.clone(),
                variants: (!rule.variant_names.is_empty()).then(|| rule.variant_names.clone()),
                values: OrderedMap(
                    rule.when
                        .slots
                        .iter()
                        .map(|&s| schema::fact(facts, s as usize))
                        .collect(),
                ),
                probes: rule
                    .probes
                    .iter()
                    .map(|&s| schema::path(facts, s as usize).to_string())
                    .collect(),
            }
        };
        let backends: Vec<BackendExplanation> = p
            .backends
            .iter()
            .enumerate()
            .map(|(b, backend)| {
                let r = &d.backends[b];
                let mine = |list: &[u32]| -> Vec<RuleExplanation> {
                    list.iter()
                        .filter(|&&i| p.rules[i as usize].backend as usize == b)
                        .map(|&i| rule(i))
                        .collect()
                };
                let variant = match r.variant {
                    Some(v) if !backend.variants.is_empty() => {
                        let var = &backend.variants[v as usize];
                        // A value read straight from a fact is typed by that fact (enum names,
                        // an unparseable version's raw text).
                        let slot = var.value.as_ref().and_then(|c| {
                            match p.program.nodes[c.node as usize] {
                                crate::eval::Node::Slot(s) => Some(s as usize),
                                _ => None,
                            }
                        });
                        Some(VariantChoice {
                            name: var.name.clone(),
                            value: schema::value(facts, r.value, slot),
                        })
                    }
                    _ => None,
                };
                BackendExplanation {
                    name: backend.name.clone(),
                    status: match r.status {
                        Status::Selected => BackendStatus::Selected,
                        Status::Outranked { by } => BackendStatus::Outranked { by: by.map(name) },
                        Status::Declined => BackendStatus::Declined,
                        Status::Disabled => BackendStatus::Disabled,
                        Status::Undecided => BackendStatus::Undecided,
                    },
                    variant,
                    declined_by: mine(&d.fired),
                    pending: mine(&d.unknown),
                    unavailable_variants: backend
                        .variants
                        .iter()
                        .enumerate()
                        .filter(|(v, _)| r.applicable & (1 << v) == 0)
                        .map(|(_, v)| UnavailableVariant {
                            name: v.name.clone(),
                            applicable: v.applicable_shown.clone(),
                            values: OrderedMap(
                                v.applicable
                                    .iter()
                                    .flat_map(|c| c.slots.iter())
                                    .map(|&s| schema::fact(facts, s as usize))
                                    .collect(),
                            ),
                        })
                        .collect(),
                }
            })
            .collect();
        let preference = d.preference.map(|i| {
            let pref = &p.preference[i as usize];
            PreferenceApplied {
                id: pref.id.clone(),
                when: pref.when_shown.clone(),
                order: pref.order.iter().map(|&b| name(b)).collect(),
                location: p.sources.describe(pref.loc),
            }
        });
        let mut pending_probes: Vec<String> = backends
            .iter()
            .flat_map(|b| b.pending.iter().flat_map(|r| r.probes.iter().cloned()))
            .collect();
        pending_probes.sort_unstable();
        pending_probes.dedup();
        Explanation {
            schema: SCHEMA,
            pack: p.name.clone(),
            pack_from: p.auto.as_ref().map(|a| PackFrom {
                requested: a.requested.clone(),
                installed: a.installed.clone(),
                upstream: a.upstream.clone(),
                warning: a.warning.clone(),
            }),
            selected: d.selected.map(name),
            variant: d
                .selected
                .and_then(|s| backends[s as usize].variant.clone()),
            preference,
            pending_probes,
            provisional: d.pending,
            layers_disabled: p
                .layers
                .iter()
                .enumerate()
                .filter(|(i, _)| !p.layer_enabled(*i as u8))
                .map(|(_, l)| l.clone())
                .collect(),
            unread_inputs: p
                .unread_inputs(facts)
                .into_iter()
                .map(|(field, note)| UnreadInput { field, note })
                .collect(),
            backends,
            input: schema::input(facts),
            provenance: OrderedMap::default(),
            executor: None,
            executor_chain: Vec::new(),
        }
    }

    /// Every fact of `facts` as an explanation's `input` shows it, in schema order (what
    /// `presets --show` prints, without a decision).
    pub fn input_of(facts: &Facts) -> OrderedMap<FactValue> {
        schema::input(facts)
    }

    /// Records where input facts came from (input key -> source word); replaces any earlier.
    pub fn with_provenance<K, W>(mut self, sources: impl IntoIterator<Item = (K, W)>) -> Self
    where
        K: Into<String>,
        W: Into<String>,
    {
        let mut map: Vec<(String, String)> = Vec::new();
        for (k, w) in sources {
            let (k, w) = (k.into(), w.into());
            // A key given twice keeps its last source, in its first position.
            match map.iter_mut().find(|(x, _)| *x == k) {
                Some(e) => e.1 = w,
                None => map.push((k, w)),
            }
        }
        self.provenance = OrderedMap(map);
        self
    }

    /// Records the executors tried for the selected backend, in order; `executor` becomes the
    /// one that ran (if any).
    pub fn with_executor_chain(mut self, chain: Vec<ExecutorAttempt>) -> Self {
        self.executor = chain
            .iter()
            .find(|a| a.outcome == ExecutorOutcome::Ran)
            .map(|a| a.executor.clone());
        self.executor_chain = chain;
        self
    }

    /// Records the chain that would run `decision` (the selected backend's, `if_admitted:`
    /// entries these facts are not admitted by left out), every entry `not_tried` with `why`:
    /// for callers that select but do not run (`explain --executors`, the C ABI).
    pub fn with_unwalked_chain(
        self,
        policy: &Policy,
        facts: &Facts,
        decision: &Decision,
        why: &str,
    ) -> Self {
        let chain = match decision.selected {
            Some(b) => policy
                .executor_chain_for(b, decision.backends[b as usize].variant, facts)
                .into_iter()
                .map(|e| ExecutorAttempt {
                    executor: e.executor.clone(),
                    outcome: ExecutorOutcome::NotTried,
                    reason: Some(why.to_string()),
                })
                .collect(),
            None => Vec::new(),
        };
        self.with_executor_chain(chain)
    }

    /// A backend by name.
    pub fn backend(&self, name: &str) -> Option<&BackendExplanation> {
        self.backends.iter().find(|b| b.name == name)
    }

    /// The executor that ran is not the chain's first entry (a substitute, never silent).
    pub fn substitute(&self) -> bool {
        self.executor_chain
            .iter()
            .position(|a| a.outcome == ExecutorOutcome::Ran)
            .is_some_and(|i| i > 0)
    }

    /// Exit status of `explain`: 0 selected, 1 none can serve.
    pub fn exit_code(&self) -> i32 {
        if self.selected.is_some() { 0 } else { 1 }
    }
}

/// The facts' schema (their pack family's), read in this one place: slots to fact paths and
/// typed values.
mod schema {
    use super::FactValue;
    use crate::facts::schema::Ty;
    use crate::facts::{Facts, Value};

    pub(super) fn path(facts: &Facts, slot: usize) -> &'static str {
        facts.schema().fields[slot].path
    }

    /// A value typed by the fact it was read from (`slot`; `None`: computed by an expression,
    /// so an enum index has no domain and shows as a number, as before the model).
    pub(super) fn value(facts: &Facts, v: Value, slot: Option<usize>) -> FactValue {
        let domain = slot.and_then(|s| match facts.schema().fields[s].ty {
            Ty::Enum(d) => Some(d),
            _ => None,
        });
        match v {
            Value::Null => FactValue::Null,
            Value::Unknown => FactValue::Unknown,
            Value::Bool(b) => FactValue::Bool(b),
            Value::Int(i) => FactValue::Int(i),
            Value::Float(f) => FactValue::Float(f),
            Value::Enum(i) => match domain {
                Some(d) => FactValue::Enum(d.values()[i as usize].to_string()),
                None => FactValue::Int(i as i64),
            },
            Value::Version(v) => FactValue::Version(v.to_string()),
            Value::BadVersion => {
                FactValue::Unparseable(slot.and_then(|s| facts.raw_version(s)).map(str::to_string))
            }
        }
    }

    /// One fact: its path and value.
    pub(super) fn fact(facts: &Facts, slot: usize) -> (String, FactValue) {
        (
            path(facts, slot).to_string(),
            value(facts, facts.values()[slot], Some(slot)),
        )
    }

    /// Every fact, in schema order.
    pub(super) fn input(facts: &Facts) -> super::OrderedMap<FactValue> {
        super::OrderedMap((0..facts.values().len()).map(|s| fact(facts, s)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::FactValue as F;
    use serde_json::json;

    #[test]
    fn fact_values_render_as_documented() {
        // (value, JSON, rule text, plain text): docs/decision-json.md "Values".
        let cases = [
            (F::Null, json!(null), "null", "null"),
            (F::Unknown, json!("unknown"), "unknown", "unknown"),
            (F::Bool(true), json!(true), "true", "true"),
            (F::Int(-1), json!(-1), "-1", "-1"),
            (F::Float(1.0), json!(1.0), "1.0", "1.0"),
            (F::Float(f64::NAN), json!(null), "NaN", "NaN"),
            (
                F::Enum("causal".into()),
                json!("causal"),
                "\"causal\"",
                "\"causal\"",
            ),
            (
                F::Version("1.29.0rc1".into()),
                json!("1.29.0rc1"),
                "1.29.0rc1",
                "1.29.0rc1",
            ),
            (
                F::Unparseable(Some("9.x".into())),
                json!("9.x (unparseable)"),
                "\"9.x\" (unparseable)",
                "<unparseable version>",
            ),
            (
                F::Unparseable(None),
                json!("unparseable"),
                "<unparseable version>",
                "<unparseable version>",
            ),
        ];
        for (v, j, text, plain) in cases {
            assert_eq!(v.to_json(), j, "{v:?}");
            assert_eq!(serde_json::to_value(&v).expect("serialises"), j, "{v:?}");
            assert_eq!(v.text(), text, "{v:?}");
            assert_eq!(v.plain_text(), plain, "{v:?}");
        }
    }
}
