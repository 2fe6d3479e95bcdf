//! A loaded, type-checked rule pack and its decision procedure. **Where a rule is evaluated:**
//! [`Policy::decide_into`] runs every rule's compiled condition (through the decision plan,
//! `eval::plan::RulePlan::eval_all`, which computes exactly what [`Program::eval`] computes) and
//! folds the results into per-backend statuses and the selection.

use crate::decision::{Decision, Status};
use crate::diag::SourceMap;
use crate::diag::{Diagnostics, Loc};
use crate::eval::plan::{AtomScratch, RulePlan};
use crate::eval::program::{Program, Truth};
use crate::facts::{Facts, Schema, Value};
use crate::typecheck::Compiled;

/// Whether a rule declines (capability or guard) or is an environment switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
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
    /// `applicable_src` as explanations show it: the pack's internal definitions written out
    /// (public ones by name; [`Definition`]).
    pub applicable_shown: Option<String>,
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
    /// `when_src` as explanations show it: the pack's internal definitions written out
    /// (public ones by name; [`Definition`]).
    pub when_shown: String,
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
    /// `when_src` as explanations show it (see [`Rule::when_shown`]).
    pub when_shown: Option<String>,
    pub order: Vec<u16>,
    pub refs: Vec<String>,
    pub loc: Loc,
}

/// A definition of the pack (`defs:` in pack.yaml). Explanations name only the public ones
/// (`public_defs:`, each with what it means; `attn-policy facts` and docs/definitions.md list
/// them) and show every other one as the condition it stands for.
#[derive(Clone, Debug)]
pub struct Definition {
    pub name: String,
    /// As written (on one line).
    pub source: String,
    /// As explanations show it: the internal definitions it uses written out.
    pub shown: String,
    /// What it means, when it is public.
    pub public: Option<String>,
}

/// One entry of an executor chain: an executor name, and the index of its `admits` condition
/// in [`Policy::executor_admits`] when the catalogue stated one for this pack's family.
#[derive(Clone, Debug)]
pub struct ChainEntry {
    pub executor: String,
    pub admits: Option<usize>,
    /// Listed under `if_admitted:`: in the chain only for configurations its `admits`
    /// condition accepts (see [`Policy::executor_chain_for`]).
    pub if_admitted: bool,
    pub loc: Loc,
}

/// The executors that run a backend's decisions (`executors:` in pack.yaml), in order: the
/// first that is available and accepts the problem runs; the others are reported.
#[derive(Clone, Debug)]
pub struct ExecutorChain {
    pub backend: u16,
    /// `Some`: this chain is for one variant (and overrides the backend's).
    pub variant: Option<u8>,
    pub entries: Vec<ChainEntry>,
    pub loc: Loc,
}

/// The upstream release a pack loads as (`releases:` in pack.yaml, docs/packs/releases.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    /// The release (`2.19.0`).
    pub name: String,
    /// Input fields this release does not have, with their fact slots: no rule of the
    /// release reads them (the loader checks), so they decide as if absent.
    pub ignores: Vec<(String, usize)>,
}

/// How `<pack>@auto` resolved against the installed upstream release
/// (docs/packs/releases.md, "te@auto"; `pack::resolve_installed`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AutoRelease {
    /// The name asked for (`te@auto`).
    pub requested: String,
    /// The installed release as given (`2.19.5`, `2.19.0+cu13`).
    pub installed: String,
    /// The upstream project, as messages name it (`TransformerEngine`).
    pub upstream: String,
    /// The pack that decides (`te@2.19.0`).
    pub pack: &'static str,
    /// Set when the installed release has no pack of its own: one line naming the installed
    /// release and the pack chosen instead.
    pub warning: Option<String>,
}

/// A pack ready to decide: immutable, `Send + Sync`, cheap to share behind an `Arc`.
#[derive(Clone, Debug)]
pub struct Policy {
    pub name: String,
    pub description: Option<String>,
    /// The pack family's facts: what the rules read and what [`Policy::decide`] expects.
    pub schema: &'static Schema,
    pub sources: SourceMap,
    pub program: Program,
    pub backends: Vec<Backend>,
    pub rules: Vec<Rule>,
    pub preference: Vec<Preference>,
    /// Layer names; index = `Rule::layer`. Index 0 is `capability`.
    pub layers: Vec<String>,
    pub defs: Vec<(String, Compiled)>,
    /// Every definition, by name, with how explanations show it.
    pub definitions: Vec<Definition>,
    /// Minimum supported versions declared by the pack (fact path, version).
    pub min_versions: Vec<(String, crate::lang::Version)>,
    /// Per backend (and variant), the executors that run its decisions.
    pub executor_chains: Vec<ExecutorChain>,
    /// The catalogue's `admits` conditions for this family, compiled into `program`.
    pub executor_admits: Vec<(String, Compiled)>,
    pub warnings: Diagnostics,
    /// Warning codes the pack allows (`allow:` in pack.yaml): `check` reports them but does
    /// not count them (`--deny-warnings` passes).
    pub allow: Vec<crate::diag::Code>,
    /// The upstream release the pack mirrors (`2.19.0` for `te@2.19.0`), when its pack.yaml
    /// lists releases.
    pub release: Option<Release>,
    /// Set when the pack was named `<pack>@auto` (`te@auto`): the installed release it was
    /// chosen for, and the warning when that release has no pack of its own.
    pub auto: Option<AutoRelease>,
    /// Bit i set: layer i is switched off (e.g. `guard` under `--parity`).
    pub(crate) disabled_layers: u64,
    /// The rule conditions `decide_into` runs, planned for speed (see `eval::plan`).
    pub(crate) hot: HotPath,
}

/// Rule conditions planned for the decision hot path (shared conjuncts computed once per
/// decision, see `eval::plan`), parallel to `Policy::rules`. Variant and preference
/// conditions are few and stay on the node interpreter.
#[derive(Clone, Debug, Default)]
pub(crate) struct HotPath {
    plan: RulePlan,
    /// Per backend, per variant: index of its `applicable` condition among the plan's extras.
    applicable: Vec<Vec<Option<usize>>>,
    /// Per preference entry: index of its `when` among the plan's extras.
    preference: Vec<Option<usize>>,
}

impl HotPath {
    pub(crate) fn build(
        program: &Program,
        schema: &Schema,
        rules: &[Rule],
        backends: &[Backend],
        preference: &[Preference],
    ) -> HotPath {
        let roots: Vec<_> = rules.iter().map(|r| r.when.node).collect();
        let mut extras = Vec::new();
        let mut extra = |c: &Option<Compiled>| {
            c.as_ref().map(|c| {
                extras.push(c.node);
                extras.len() - 1
            })
        };
        let applicable = backends
            .iter()
            .map(|b| b.variants.iter().map(|v| extra(&v.applicable)).collect())
            .collect();
        let preference = preference.iter().map(|p| extra(&p.when)).collect();
        HotPath {
            plan: RulePlan::build(program, schema, &roots, &extras),
            applicable,
            preference,
        }
    }
}

impl Policy {
    /// Reads a config object of this pack's family (see `docs/facts.md`).
    pub fn read_facts(
        &self,
        config: &serde_json::Value,
    ) -> Result<Facts, crate::facts::InputError> {
        self.schema.read(config)
    }

    /// Input fields set in `facts` (away from their defaults) that this pack's release does not
    /// read (`softcap` on `te@2.19.0`), with the line explanations show for each.
    pub fn unread_inputs(&self, facts: &Facts) -> Vec<(String, String)> {
        let Some(release) = &self.release else {
            return Vec::new();
        };
        let defaults = self.schema.defaults();
        release
            .ignores
            .iter()
            .filter(|(_, slot)| facts.values()[*slot] != defaults.values()[*slot])
            .map(|(field, _)| {
                (
                    field.clone(),
                    format!(
                        "{} does not read `{field}` (TransformerEngine {} has no such field): decided as if it were absent",
                        self.name, release.name
                    ),
                )
            })
            .collect()
    }

    /// This pack family's facts at their defaults.
    pub fn default_facts(&self) -> Facts {
        self.schema.defaults()
    }

    /// The executor chain of a backend and its chosen variant: the variant's own chain if the
    /// pack gives one, else the backend's; empty when the pack names none.
    pub fn executor_chain(&self, backend: u16, variant: Option<u8>) -> &[ChainEntry] {
        let own = |v: Option<u8>| {
            self.executor_chains
                .iter()
                .find(|c| c.backend == backend && c.variant == v)
        };
        variant
            .and_then(|v| own(Some(v)))
            .or_else(|| own(None))
            .map_or(&[][..], |c| &c.entries)
    }

    /// The chain that runs a decision on `facts`: [`Policy::executor_chain`] without the
    /// `if_admitted:` entries whose executor's `admits` condition is false for these facts (an
    /// unknown truth, e.g. an unanswered probe, keeps the entry: the walk's own checks decide).
    /// The first entry left is the backend's own executor; a later one that runs is a
    /// substitute.
    pub fn executor_chain_for(
        &self,
        backend: u16,
        variant: Option<u8>,
        facts: &Facts,
    ) -> Vec<&ChainEntry> {
        self.executor_chain(backend, variant)
            .iter()
            .filter(|e| {
                !e.if_admitted
                    || e.admits.is_none_or(|i| {
                        let c = &self.executor_admits[i].1;
                        Truth::of(self.program.eval(c.node, facts.values())) != Truth::False
                    })
            })
            .collect()
    }

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
        self.decide_in::<false>(facts, out);
    }

    /// [`Policy::decide_into`], also counting its evaluation steps: facts classified, rules
    /// visited, conditions, atoms and definitions evaluated. Deterministic for a pack and an
    /// input, so CI guards a decision's cost with it (`tests/decision_cost.rs`), not with a clock.
    pub fn decide_counting(&self, facts: &Facts, out: &mut Decision) -> u64 {
        self.decide_in::<true>(facts, out);
        out.atoms.steps()
    }

    #[inline(always)]
    fn decide_in<const COUNT: bool>(&self, facts: &Facts, out: &mut Decision) {
        debug_assert!(
            facts.schema() == self.schema,
            "facts of family `{}` decided by pack `{}` of family `{}`",
            facts.schema().family,
            self.name,
            self.schema.family
        );
        let values = facts.values();
        prefetch(values);
        out.reset(self.backends.len());
        // Each definition is computed at most once per decision.
        let defs = self.program.memo_count as usize;
        if out.memo.len() != defs {
            out.memo.resize(defs, None);
        }
        out.memo.fill(None);
        let memo = &mut out.memo;
        let hot = &self.hot;
        hot.plan.reset(&mut out.atoms);
        let n = self.backends.len();
        let (fired, unknown, backends) = (&mut out.fired, &mut out.unknown, &mut out.backends);
        let visit = |i: usize, truth: Truth| {
            let rule = &self.rules[i];
            if !self.layer_enabled(rule.layer) {
                return;
            }
            let r = &mut backends[rule.backend as usize];
            if truth == Truth::True {
                fired.push(i as u32);
                r.declined |= rule.variants;
                if rule.kind == RuleKind::Switch {
                    r.switched |= rule.variants;
                }
            } else {
                unknown.push(i as u32);
                r.undecided |= rule.variants;
            }
        };
        if COUNT {
            hot.plan
                .eval_all_counting(&self.program, values, memo, &mut out.atoms, visit);
        } else {
            hot.plan
                .eval_all(&self.program, values, memo, &mut out.atoms, visit);
        }
        let extra = |c: usize, memo: &mut [Option<Value>], atoms: &mut AtomScratch| {
            if COUNT {
                hot.plan.eval_extra_counting(c, values, memo, atoms)
            } else {
                hot.plan.eval_extra(c, values, memo, atoms)
            }
        };
        for (i, b) in self.backends.iter().enumerate() {
            let r = &mut out.backends[i];
            if b.variants.is_empty() {
                r.applicable = 1;
            } else {
                for v in 0..b.variants.len() {
                    let ok = hot.applicable[i][v]
                        .is_none_or(|c| extra(c, memo, &mut out.atoms) == Truth::True);
                    if ok {
                        r.applicable |= 1 << v;
                    }
                }
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
        out.preference = hot
            .preference
            .iter()
            .position(|when| when.is_none_or(|c| extra(c, memo, &mut out.atoms) == Truth::True))
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

/// Asks for every cache line of the facts at once: facts that come from memory (a corpus, a
/// cold cache) then arrive in parallel, not one miss per fact as the classification reaches it.
#[inline(always)]
fn prefetch(values: &[Value]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // One hint per cache line the facts span (a step of whole values hinted some lines
        // twice: 44 hints for the te schema's 34 lines).
        let base: *const i8 = values.as_ptr().cast();
        let start = base as usize;
        let end = start + std::mem::size_of_val(values);
        let mut line = start & !63;
        // Four lines per turn: one line per turn spent two of its three instructions on the
        // loop (~100 instructions per decision for the te schema's 34 lines).
        while line + 192 < end {
            for k in 0..4 {
                // SAFETY: as below (each address is in a line of `values`: `line + 192 < end`).
                unsafe {
                    _mm_prefetch::<_MM_HINT_T0>(
                        base.wrapping_add((line + 64 * k).wrapping_sub(start)),
                    )
                };
            }
            line += 256;
        }
        while line < end {
            // SAFETY: a prefetch is a hint that never faults and reads nothing the program sees;
            // `sse` is part of the x86_64 baseline, so the instruction exists. The address
            // is in the cache line of a byte of `values` (computed with `wrapping`
            // arithmetic: never dereferenced).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(line.wrapping_sub(start))) };
            line += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = values;
}
