//! A loaded, type-checked rule pack and its decision procedure. **Where a rule is evaluated:**
//! [`Policy::decide_into`] runs every rule's compiled condition ([`Program::eval`]) and folds
//! the results into per-backend statuses and the selection.

use crate::check::Compiled;
use crate::decision::{Decision, Status};
use crate::diag::{Diagnostics, Loc};
use crate::eval::fast::FastExpr;
use crate::eval::program::{Program, Truth};
use crate::facts::{Facts, Value};
use crate::pack::source::SourceMap;

/// Whether a rule declines (capability or guard) or is an environment switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleKind {
    Decline,
    Switch,
}

#[derive(Clone, Debug)]
pub struct Variant {
    pub name: String,
    pub description: Option<String>,
    pub applicable: Option<Compiled>,
    pub applicable_src: Option<String>,
    pub value: Option<Compiled>,
}

#[derive(Clone, Debug)]
pub struct Backend {
    pub name: String,
    pub description: Option<String>,
    pub supports: Vec<String>,
    pub variants: Vec<Variant>,
    pub loc: Loc,
}

impl Backend {
    /// Bit mask of all variants (a backend without variants has one implicit variant).
    pub fn all_variants(&self) -> u64 {
        let n = self.variants.len().max(1);
        if n >= 64 { u64::MAX } else { (1u64 << n) - 1 }
    }
}

#[derive(Clone, Debug)]
pub struct Rule {
    pub id: String,
    pub backend: u16,
    /// Variants the rule declines (bit i = variant i); all of them unless `variants:` narrows it.
    pub variants: u64,
    pub variant_names: Vec<String>,
    pub kind: RuleKind,
    pub layer: u8,
    pub when: Compiled,
    pub when_src: String,
    pub until: Option<Compiled>,
    pub until_src: Option<String>,
    pub reason: String,
    pub refs: Vec<String>,
    /// The rule (`- id:`) and its condition (`when:`) in the source.
    pub loc: Loc,
    pub when_loc: Loc,
    /// Probe facts the condition reads (their slots).
    pub probes: Vec<u16>,
}

#[derive(Clone, Debug)]
pub struct Preference {
    pub id: String,
    pub when: Option<Compiled>,
    pub when_src: Option<String>,
    pub order: Vec<u16>,
    pub refs: Vec<String>,
    pub loc: Loc,
}

/// A pack ready to decide: immutable, `Send + Sync`, cheap to share behind an `Arc`.
#[derive(Clone, Debug)]
pub struct Policy {
    pub name: String,
    pub description: Option<String>,
    pub sources: SourceMap,
    pub program: Program,
    pub backends: Vec<Backend>,
    pub rules: Vec<Rule>,
    pub preference: Vec<Preference>,
    /// Layer names; index = `Rule::layer`. Index 0 is `capability`.
    pub layers: Vec<String>,
    pub defs: Vec<(String, Compiled)>,
    /// Minimum supported versions declared by the pack (fact path, version).
    pub min_versions: Vec<(String, crate::lang::Version)>,
    pub warnings: Diagnostics,
    /// Bit i set: layer i is switched off (e.g. `guard` under `--parity`).
    pub(crate) disabled_layers: u64,
    /// The conditions `decide_into` runs, compiled to closures (see `eval::fast`).
    pub(crate) hot: HotPath,
}

/// Closure-compiled rule conditions for the decision hot path, parallel to `Policy::rules`.
/// (Variant and preference conditions are few and stay on the node interpreter.)
#[derive(Clone, Debug, Default)]
pub(crate) struct HotPath {
    rules: Vec<FastExpr>,
}

impl HotPath {
    pub(crate) fn build(program: &Program, rules: &[Rule]) -> HotPath {
        HotPath {
            rules: rules
                .iter()
                .map(|r| FastExpr::build(program, r.when.node))
                .collect(),
        }
    }
}

impl Policy {
    pub fn backend_index(&self, name: &str) -> Option<usize> {
        self.backends.iter().position(|b| b.name == name)
    }

    pub fn rule_index(&self, id: &str) -> Option<usize> {
        self.rules.iter().position(|r| r.id == id)
    }

    /// Switches a layer (e.g. `guard`) on or off. Errors name the known layers.
    pub fn set_layer_enabled(&mut self, layer: &str, enabled: bool) -> Result<(), String> {
        let i = self.layers.iter().position(|l| l == layer).ok_or_else(|| {
            format!(
                "pack `{}` has no layer `{layer}`; layers: {}",
                self.name,
                self.layers.join(", ")
            )
        })?;
        if enabled {
            self.disabled_layers &= !(1 << i);
        } else {
            self.disabled_layers |= 1 << i;
        }
        Ok(())
    }

    pub fn layer_enabled(&self, layer: u8) -> bool {
        self.disabled_layers & (1 << layer) == 0
    }

    /// Decides, allocating a fresh [`Decision`]. For a hot loop, reuse one with [`Policy::decide_into`].
    pub fn decide(&self, facts: &Facts) -> Decision {
        let mut d = Decision::default();
        self.decide_into(facts, &mut d);
        d
    }

    /// Evaluates every rule of every backend (no short-circuit, so the explanation is complete)
    /// and selects. Reuses `out`'s buffers: no allocation once they have grown.
    pub fn decide_into(&self, facts: &Facts, out: &mut Decision) {
        let values = facts.values();
        out.reset(self.backends.len());
        // Each definition is computed at most once per decision.
        out.memo.clear();
        out.memo.resize(self.program.memo_count as usize, None);
        let memo = &mut out.memo;
        let n = self.backends.len();
        for (i, b) in self.backends.iter().enumerate() {
            let r = &mut out.backends[i];
            if b.variants.is_empty() {
                r.applicable = 1;
            } else {
                for (v, var) in b.variants.iter().enumerate() {
                    let ok = var.applicable.as_ref().is_none_or(|c| {
                        Truth::of(self.program.eval_memo(c.node, values, memo)) == Truth::True
                    });
                    if ok {
                        r.applicable |= 1 << v;
                    }
                }
            }
        }
        for (i, rule) in self.rules.iter().enumerate() {
            if !self.layer_enabled(rule.layer) {
                continue;
            }
            let r = &mut out.backends[rule.backend as usize];
            match Truth::of(self.hot.rules[i].eval(values, memo)) {
                Truth::True => {
                    out.fired.push(i as u32);
                    r.declined |= rule.variants;
                    if rule.kind == RuleKind::Switch {
                        r.switched |= rule.variants;
                    }
                }
                Truth::Unknown => {
                    out.unknown.push(i as u32);
                    r.undecided |= rule.variants;
                }
                Truth::False => {}
            }
        }
        for (i, b) in self.backends.iter().enumerate() {
            let r = &mut out.backends[i];
            let eligible = r.applicable & !r.declined & !r.undecided;
            r.status = if eligible != 0 {
                Status::Outranked { by: None }
            } else if r.applicable & !r.declined != 0 {
                Status::Undecided
            } else if r.switched != 0 && r.applicable & !r.switched == 0 {
                Status::Disabled
            } else {
                Status::Declined
            };
            if eligible != 0 {
                let v = eligible.trailing_zeros() as usize;
                r.variant = Some(v as u8);
                r.value = b
                    .variants
                    .get(v)
                    .and_then(|var| var.value.as_ref())
                    .map_or(Value::Null, |c| {
                        self.program.eval_memo(c.node, values, memo)
                    });
            }
        }
        // Preference: the first entry whose condition holds orders the eligible backends.
        out.preference = self
            .preference
            .iter()
            .position(|p| {
                p.when.as_ref().is_none_or(|c| {
                    Truth::of(self.program.eval_memo(c.node, values, memo)) == Truth::True
                })
            })
            .map(|p| p as u16);
        if let Some(p) = out.preference {
            let order = &self.preference[p as usize].order;
            for &b in order {
                match out.backends[b as usize].status {
                    Status::Outranked { .. } => {
                        out.selected = Some(b);
                        break;
                    }
                    Status::Undecided => out.pending = true,
                    _ => {}
                }
            }
            if let Some(sel) = out.selected {
                out.backends[sel as usize].status = Status::Selected;
                for i in 0..n {
                    if let Status::Outranked { by } = &mut out.backends[i].status {
                        *by = Some(sel);
                    }
                }
            }
        }
    }
}
