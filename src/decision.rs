//! The decision and its renderings: human text (a compact table), JSON (`explain/v1`, see
//! docs/decision-json.md) and TransformerEngine's return tuple (`--format te`).

use std::fmt::Write as _;

use serde_json::{Map, Value as Json, json};

use crate::facts::schema::Ty;
use crate::facts::{Domain, Facts, Value};
use crate::policy::{Policy, RuleKind};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Selected,
    /// Eligible, but another backend came first in the preference order (`None`: nothing
    /// was selected, e.g. the backend is missing from the order that applied).
    Outranked {
        by: Option<u16>,
    },
    /// At least one rule declined every variant.
    Declined,
    /// Turned off by an environment switch (and nothing else would serve).
    Disabled,
    /// Eligible unless a probe fact answers otherwise.
    Undecided,
}

impl Status {
    pub fn word(self) -> &'static str {
        match self {
            Status::Selected => "selected",
            Status::Outranked { .. } => "outranked",
            Status::Declined => "declined",
            Status::Disabled => "disabled",
            Status::Undecided => "undecided",
        }
    }

    pub fn eligible(self) -> bool {
        matches!(self, Status::Selected | Status::Outranked { .. })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct BackendResult {
    pub status: Status,
    /// The chosen variant (first eligible in the backend's order).
    pub variant: Option<u8>,
    /// The chosen variant's reported value (TE: flash version, fused sub-backend).
    pub value: Value,
    pub applicable: u64,
    pub declined: u64,
    pub switched: u64,
    pub undecided: u64,
}

impl Default for BackendResult {
    fn default() -> Self {
        BackendResult {
            status: Status::Declined,
            variant: None,
            value: Value::Null,
            applicable: 0,
            declined: 0,
            switched: 0,
            undecided: 0,
        }
    }
}

/// The outcome of one decision. Indices refer to the deciding [`Policy`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    pub selected: Option<u16>,
    /// Index of the preference entry that applied.
    pub preference: Option<u16>,
    /// An undecided backend precedes the selected one: a probe answer could change the choice.
    pub pending: bool,
    pub backends: Vec<BackendResult>,
    /// Rules whose condition held, in pack order.
    pub fired: Vec<u32>,
    /// Rules whose condition is unknown until a probe answers.
    pub unknown: Vec<u32>,
    /// Scratch: values of the pack's definitions during the last decision.
    pub(crate) memo: Vec<Option<Value>>,
    /// Scratch: truth of the pack's shared conjuncts during the last decision.
    pub(crate) atoms: crate::eval::plan::AtomScratch,
}

impl Decision {
    pub(crate) fn reset(&mut self, n: usize) {
        self.selected = None;
        self.preference = None;
        self.pending = false;
        self.fired.clear();
        self.unknown.clear();
        self.backends.clear();
        self.backends.resize(n, BackendResult::default());
    }

    /// Exit status of `explain`: 0 selected, 1 none can serve.
    pub fn exit_code(&self) -> i32 {
        if self.selected.is_some() { 0 } else { 1 }
    }
}

fn value_json(v: Value, slot: Option<usize>, facts: &Facts) -> Json {
    let domain = slot.and_then(|s| match facts.schema().fields[s].ty {
        Ty::Enum(d) => Some(d),
        _ => None,
    });
    if v == Value::BadVersion
        && let Some(raw) = slot.and_then(|s| facts.raw_version(s))
    {
        return Json::String(format!("{raw} (unparseable)"));
    }
    v.to_json(domain)
}

fn value_text(v: Value, slot: usize, facts: &Facts) -> String {
    let domain: Option<Domain> = match facts.schema().fields[slot].ty {
        Ty::Enum(d) => Some(d),
        _ => None,
    };
    if v == Value::BadVersion
        && let Some(raw) = facts.raw_version(slot)
    {
        return format!("{raw:?} (unparseable)");
    }
    v.display(domain).to_string()
}

/// Explains a decision against the policy and facts that produced it.
pub struct Explanation<'a> {
    pub policy: &'a Policy,
    pub facts: &'a Facts,
    pub decision: &'a Decision,
}

impl<'a> Explanation<'a> {
    pub fn new(policy: &'a Policy, facts: &'a Facts, decision: &'a Decision) -> Self {
        Explanation {
            policy,
            facts,
            decision,
        }
    }

    fn variant_json(&self, b: usize) -> Json {
        let r = &self.decision.backends[b];
        match r.variant {
            Some(v) if !self.policy.backends[b].variants.is_empty() => json!({
                "name": self.policy.backends[b].variants[v as usize].name,
                "value": self.reported_value(b),
            }),
            _ => Json::Null,
        }
    }

    /// The chosen variant's value, typed by the expression that produced it.
    pub fn reported_value(&self, b: usize) -> Json {
        let r = &self.decision.backends[b];
        let slot = r
            .variant
            .and_then(|v| self.policy.backends[b].variants.get(v as usize))
            .and_then(|v| v.value.as_ref())
            .and_then(|c| match self.policy.program.nodes[c.node as usize] {
                crate::eval::Node::Slot(s) => Some(s as usize),
                _ => None,
            });
        value_json(r.value, slot, self.facts)
    }

    fn rule_json(&self, i: u32) -> Json {
        let p = self.policy;
        let rule = &p.rules[i as usize];
        let mut values = Map::new();
        for &s in &rule.when.slots {
            values.insert(
                p.schema.fields[s as usize].path.to_string(),
                value_json(
                    self.facts.values()[s as usize],
                    Some(s as usize),
                    self.facts,
                ),
            );
        }
        json!({
            "id": rule.id,
            "layer": p.layers[rule.layer as usize],
            "kind": match rule.kind { RuleKind::Decline => "decline", RuleKind::Switch => "switch" },
            "reason": rule.reason,
            "when": rule.when_src,
            "location": p.sources.describe(rule.when_loc),
            "refs": rule.refs,
            "variants": if rule.variant_names.is_empty() { Json::Null } else { json!(rule.variant_names) },
            "values": values,
        })
    }

    /// The `explain/v1` JSON document (schema in docs/decision-json.md).
    pub fn to_json(&self) -> Json {
        let p = self.policy;
        let d = self.decision;
        let backends: Vec<Json> = p
            .backends
            .iter()
            .enumerate()
            .map(|(b, backend)| {
                let r = &d.backends[b];
                let mine = |list: &[u32]| -> Vec<Json> {
                    list.iter()
                        .filter(|&&i| p.rules[i as usize].backend as usize == b)
                        .map(|&i| self.rule_json(i))
                        .collect()
                };
                let unavailable: Vec<Json> = backend
                    .variants
                    .iter()
                    .enumerate()
                    .filter(|(v, _)| r.applicable & (1 << v) == 0)
                    .map(|(_, v)| json!({"name": v.name, "applicable": v.applicable_src}))
                    .collect();
                let mut o = Map::new();
                o.insert("name".into(), json!(backend.name));
                o.insert("status".into(), json!(r.status.word()));
                o.insert("variant".into(), self.variant_json(b));
                if let Status::Outranked { by } = r.status {
                    o.insert(
                        "outranked_by".into(),
                        by.map_or(Json::Null, |s| json!(p.backends[s as usize].name)),
                    );
                }
                o.insert("declined_by".into(), json!(mine(&d.fired)));
                o.insert("pending".into(), json!(mine(&d.unknown)));
                o.insert("unavailable_variants".into(), json!(unavailable));
                Json::Object(o)
            })
            .collect();
        let preference = d.preference.map(|i| {
            let pref = &p.preference[i as usize];
            json!({"id": pref.id, "when": pref.when_src, "order": pref.order.iter().map(|&b| p.backends[b as usize].name.clone()).collect::<Vec<_>>(), "location": p.sources.describe(pref.loc)})
        });
        let mut probes: Vec<&str> = d
            .unknown
            .iter()
            .flat_map(|&i| {
                p.rules[i as usize]
                    .probes
                    .iter()
                    .map(|&s| p.schema.fields[s as usize].path)
            })
            .collect();
        probes.sort_unstable();
        probes.dedup();
        json!({
            "schema": "attn-policy/explain/v1",
            "pack": p.name,
            "selected": d.selected.map(|s| p.backends[s as usize].name.clone()),
            "variant": d.selected.map_or(Json::Null, |s| self.variant_json(s as usize)),
            "preference": preference,
            "pending_probes": probes,
            "provisional": d.pending,
            "layers_disabled": p.layers.iter().enumerate().filter(|(i, _)| !p.layer_enabled(*i as u8)).map(|(_, l)| l.clone()).collect::<Vec<_>>(),
            "backends": backends,
        })
    }

    /// TransformerEngine's return tuple, as an object (`--format te`).
    pub fn to_te(&self) -> Json {
        let p = self.policy;
        let d = self.decision;
        let find = |name: &str| p.backend_index(name);
        let eligible = |b: Option<usize>| b.is_some_and(|b| d.backends[b].status.eligible());
        let selected = |b: Option<usize>| b.is_some_and(|b| d.selected == Some(b as u16));
        let value = |b: Option<usize>| match b {
            Some(b) if d.backends[b].status.eligible() => self.reported_value(b),
            _ => Json::Null,
        };
        let (flash, fused, unfused, frost) = (
            find("FlashAttention"),
            find("FusedAttention"),
            find("UnfusedDotProductAttention"),
            find("FrostAttention"),
        );
        json!({
            "use_flash_attention": selected(flash),
            "flash_attention_backend": value(flash),
            "use_fused_attention": selected(fused),
            "fused_attention_backend": value(fused),
            "use_unfused_attention": selected(unfused),
            "available_backends": [eligible(flash), eligible(fused), eligible(unfused)],
            "use_frost_attention": selected(frost),
        })
    }

    /// Human text: the selection, then one line per backend with every declining rule under it.
    pub fn to_text(&self, color: bool) -> String {
        let p = self.policy;
        let d = self.decision;
        let style = |code: &str, s: &str| {
            if color {
                format!("\x1b[{code}m{s}\x1b[0m")
            } else {
                s.to_string()
            }
        };
        let mut out = String::new();
        let variant_text = |b: usize| -> String {
            let r = &d.backends[b];
            match r.variant {
                Some(v) if !p.backends[b].variants.is_empty() => {
                    let name = &p.backends[b].variants[v as usize].name;
                    match self.reported_value(b) {
                        Json::Null => format!(" [{name}]"),
                        Json::String(s) => format!(" [{name} {s}]"),
                        other => format!(" [{name} = {other}]"),
                    }
                }
                _ => String::new(),
            }
        };
        match d.selected {
            Some(s) => {
                let _ = write!(
                    out,
                    "{} {}{}",
                    style("1", "selected:"),
                    style("1;32", &p.backends[s as usize].name),
                    variant_text(s as usize)
                );
            }
            None => {
                let _ = write!(
                    out,
                    "{} {}",
                    style("1", "selected:"),
                    style("1;31", "none: no backend can serve this configuration")
                );
            }
        }
        if let Some(i) = d.preference {
            let pref = &p.preference[i as usize];
            let _ = write!(out, "  (preference `{}`", pref.id);
            if let Some(w) = &pref.when_src {
                let _ = write!(out, ": {w}");
            }
            out.push(')');
        }
        out.push('\n');
        if d.pending {
            // Name the undecided backends that come first, and the probes they wait for.
            let mut waiting = Vec::new();
            if let Some(i) = d.preference {
                for &b in &p.preference[i as usize].order {
                    if Some(b) == d.selected {
                        break;
                    }
                    if d.backends[b as usize].status == Status::Undecided {
                        let mut probes: Vec<&str> = d
                            .unknown
                            .iter()
                            .filter(|&&r| p.rules[r as usize].backend == b)
                            .flat_map(|&r| {
                                p.rules[r as usize]
                                    .probes
                                    .iter()
                                    .map(|&s| p.schema.fields[s as usize].path)
                            })
                            .collect();
                        probes.sort_unstable();
                        probes.dedup();
                        waiting.push(format!(
                            "{} (until {} is answered)",
                            p.backends[b as usize].name,
                            probes.join(", ")
                        ));
                    }
                }
            }
            let _ = writeln!(
                out,
                "provisional: undecided and earlier in the preference order: {}; answer with --probe NAME=true|false",
                waiting.join("; ")
            );
        }
        let disabled: Vec<&str> = p
            .layers
            .iter()
            .enumerate()
            .filter(|(i, _)| !p.layer_enabled(*i as u8))
            .map(|(_, l)| l.as_str())
            .collect();
        if !disabled.is_empty() {
            let _ = writeln!(out, "layers off: {}", disabled.join(", "));
        }
        let width = p.backends.iter().map(|b| b.name.len()).max().unwrap_or(0);
        for (b, backend) in p.backends.iter().enumerate() {
            let r = &d.backends[b];
            let (code, status) = match r.status {
                Status::Selected => ("32", "selected".to_string()),
                Status::Outranked { by: Some(by) } => (
                    "33",
                    format!("eligible, outranked by {}", p.backends[by as usize].name),
                ),
                Status::Outranked { by: None } => {
                    ("33", "eligible, not in the preference order".to_string())
                }
                Status::Declined => ("31", "declined".to_string()),
                Status::Disabled => ("31", "disabled by environment".to_string()),
                Status::Undecided => ("35", "undecided: pending probe".to_string()),
            };
            let _ = writeln!(
                out,
                "\n{:<width$}  {}{}",
                backend.name,
                style(code, &status),
                variant_text(b)
            );
            for (list, tag) in [(&d.fired, ""), (&d.unknown, "? ")] {
                for &i in list
                    .iter()
                    .filter(|&&i| p.rules[i as usize].backend as usize == b)
                {
                    let rule = &p.rules[i as usize];
                    let layer = &p.layers[rule.layer as usize];
                    let scope = if rule.variant_names.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", rule.variant_names.join(", "))
                    };
                    let _ = writeln!(
                        out,
                        "  {tag}{}{scope} [{layer}] {}",
                        style("1", &rule.id),
                        rule.reason
                    );
                    let vals: Vec<String> = rule
                        .when
                        .slots
                        .iter()
                        .map(|&s| {
                            format!(
                                "{} = {}",
                                p.schema.fields[s as usize].path,
                                value_text(self.facts.values()[s as usize], s as usize, self.facts)
                            )
                        })
                        .collect();
                    let _ = writeln!(
                        out,
                        "      {}  at {}",
                        vals.join(", "),
                        p.sources.describe(rule.when_loc)
                    );
                }
            }
            for (v, var) in backend.variants.iter().enumerate() {
                if r.applicable & (1 << v) == 0 {
                    // Name what the condition (often a definition of the pack) read, with
                    // the values it saw: `fa4_inst` alone says nothing to a user.
                    let read: Vec<String> = var
                        .applicable
                        .as_ref()
                        .map(|c| {
                            c.slots
                                .iter()
                                .map(|&s| {
                                    format!(
                                        "{} = {}",
                                        p.schema.fields[s as usize].path,
                                        value_text(
                                            self.facts.values()[s as usize],
                                            s as usize,
                                            self.facts
                                        )
                                    )
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    let _ = writeln!(
                        out,
                        "  - {} not available: `{}` is false{}",
                        var.name,
                        var.applicable_src.as_deref().unwrap_or("false"),
                        if read.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", read.join(", "))
                        }
                    );
                }
            }
        }
        out
    }
}
