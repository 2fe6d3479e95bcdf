//! [`SpaceBuilder`]: from the collected constants to the vars and classes of a [`Space`].
//!
//! `build` runs in stages, each a function below: derived facts are folded into the inputs
//! that determine them (`sm` and the compute capability, `window.left/right` from
//! `window_size` and the mask); facts under non-linear arithmetic get classes of their own for
//! small values; facts compared with each other share their constants (so their intervals line
//! up); then one var per fact read, its dependencies, the default values and the read counts.
//! The order of vars is the order of slots in the schema (parents sort before members).
//! The facts are the builder's family's ([`SpaceBuilder::for_schema`]); the derived-fact folding
//! is the te family's and applies to it alone.

use std::collections::{BTreeMap, BTreeSet};

use attn_policy::eval::program::{NodeId, Program};
use attn_policy::facts::Value;
use attn_policy::facts::schema::{Origin, Schema, Ty};

use super::classes::{float_classes, int_classes, version_classes};
use super::collect::{Collect, slots_under};
use super::model::{Class, ClassDesc, Space, Var, WindowVars};

/// Builds a [`Space`] from the conditions of one or more programs.
#[derive(Default)]
pub struct SpaceBuilder {
    c: Collect,
    extra: Vec<(usize, Value)>,
}

impl SpaceBuilder {
    /// A builder over the `te` family's facts.
    pub fn new() -> SpaceBuilder {
        SpaceBuilder::default()
    }

    /// A builder over `schema`'s facts (a policy's: `policy.schema`).
    pub fn for_schema(schema: &'static Schema) -> SpaceBuilder {
        let mut b = SpaceBuilder::default();
        b.c.schema = Some(schema);
        b
    }

    /// Adds a condition (or any expression) whose value must be constant on every class.
    pub fn root(&mut self, p: &Program, id: NodeId) -> &mut Self {
        self.c.walk(p, id);
        let mut s = Vec::new();
        slots_under(p, id, &mut s);
        s.sort_unstable();
        s.dedup();
        for x in s {
            *self.c.reads.entry(x).or_default() += 1;
        }
        self
    }

    /// Adds a constant at which a fact's classes must split (e.g. a pack's minimum version).
    pub fn split_at(&mut self, slot: usize, v: Value) -> &mut Self {
        self.extra.push((slot, v));
        self
    }

    pub fn build(mut self) -> Space {
        for (s, v) in std::mem::take(&mut self.extra) {
            self.c.read.insert(s);
            self.c.konst(s, v);
        }
        let c = &mut self.c;
        let schema = c.schema();
        let (read, need_window) = c.fold_derived_facts();
        let inexact_slots = c.small_values_of_inexact();
        let relational = c.share_relational_constants();
        let (vars, index) = c.vars(&read);
        let var_of = |p: &str| schema.slot(p).and_then(|s| index.get(&s).copied());
        let sm_var = if c.te() { var_of("sm") } else { None };
        let window = if need_window {
            Some(WindowVars {
                size: var_of("window_size").expect("window var"),
                left: var_of("window_size.left").expect("window var"),
                right: var_of("window_size.right").expect("window var"),
                mask: var_of("attn_mask_type"),
            })
        } else {
            None
        };
        let deps = deps(schema, &vars, sm_var, window);
        let reads = c.read_counts(&vars);
        let inexact = c.inexact_paths(&inexact_slots, &read);
        Space {
            vars,
            reads,
            deps,
            base: base_values(schema),
            schema,
            sm_var,
            window,
            inexact,
            relational: relational.into_iter().collect(),
        }
    }
}

/// Slot of a te fact the te derivations rely on.
fn sid(p: &str) -> usize {
    attn_policy::facts::te::slot(p).expect("schema fact")
}

impl Collect {
    /// The facts the space needs vars for: derived facts map to the inputs that determine
    /// them (their constants move there too). Also whether the window vars are needed.
    fn fold_derived_facts(&mut self) -> (BTreeSet<usize>, bool) {
        let c = self;
        let schema = c.schema();
        let (fields, slot) = (schema.fields, |p: &str| schema.slot(p));
        let mut read: BTreeSet<usize> = BTreeSet::new();
        let mut need_window = false;
        let mut need_mask = false;
        for &s in &c.read.clone() {
            let path = fields[s].path;
            if !c.te() {
                // No derived facts to fold: every input fact read is a var (with its object).
                if fields[s].origin != Origin::Input {
                    continue;
                }
                read.insert(s);
                if let Some((parent, _)) = path.rsplit_once('.')
                    && let Some(ps) = slot(parent)
                    && fields[ps].nullable
                {
                    read.insert(ps);
                }
                continue;
            }
            match path {
                "sm" | "device_compute_capability.major" | "device_compute_capability.minor" => {
                    if path == "device_compute_capability.major" {
                        let consts = c.consts.remove(&s).unwrap_or_default();
                        let e = c.starts.entry(sid("sm")).or_default();
                        for v in consts {
                            if let Value::Int(m) = v {
                                e.insert(m * 10);
                                e.insert(m * 10 + 10);
                            }
                        }
                    }
                    read.insert(sid("sm"));
                }
                "window.left" | "window.right" => {
                    need_window = true;
                    need_mask |= path == "window.right";
                    let target = if path == "window.left" {
                        sid("window_size.left")
                    } else {
                        sid("window_size.right")
                    };
                    let consts = c.consts.remove(&s).unwrap_or_default();
                    c.consts.entry(target).or_default().extend(consts);
                    if let Some(m) = c.moduli.remove(&s) {
                        c.moduli.entry(target).or_default().extend(m);
                    }
                }
                "window_size" | "window_size.left" | "window_size.right" => need_window = true,
                "device_compute_capability" | "flash_attn_versions" | "env" => {}
                _ if fields[s].origin == Origin::Probe => {}
                _ => {
                    read.insert(s);
                    if let Some((parent, _)) = path.rsplit_once('.')
                        && let Some(ps) = slot(parent)
                        && fields[ps].nullable
                    {
                        read.insert(ps);
                    }
                }
            }
        }
        if need_window {
            for p in ["window_size", "window_size.left", "window_size.right"] {
                read.insert(sid(p));
            }
            c.konst(sid("window_size.left"), Value::Int(-1));
            c.konst(sid("window_size.right"), Value::Int(-1));
            c.konst(sid("window_size.right"), Value::Int(0));
            if need_mask {
                read.insert(sid("attn_mask_type"));
            }
        }
        (read, need_window)
    }

    /// Facts under non-linear arithmetic: small values get classes of their own, so
    /// witnesses such as `num_heads % cp_size != 0` (3 % 2) exist in the abstraction.
    /// Returns those facts.
    fn small_values_of_inexact(&mut self) -> Vec<usize> {
        let inexact_slots: Vec<usize> = self.inexact.iter().copied().collect();
        for &s in &inexact_slots {
            if self.schema().fields[s].ty == Ty::Int {
                let e = self.starts.entry(s).or_default();
                for k in 0..=5 {
                    e.insert(k);
                }
            }
        }
        inexact_slots
    }

    /// Relational comparisons: both sides share their constants (so their intervals line
    /// up and the diagrams' orderings of the two are decided on most pairs of classes).
    /// Returns the facts compared with another.
    fn share_relational_constants(&mut self) -> BTreeSet<usize> {
        let c = self;
        let mut rel: BTreeSet<usize> = BTreeSet::new();
        let mut groups: Vec<BTreeSet<usize>> = Vec::new();
        for (x, y) in &c.relational {
            let mut g: BTreeSet<usize> = x.iter().chain(y).copied().collect();
            groups.retain(|o| {
                if o.is_disjoint(&g) {
                    true
                } else {
                    g.extend(o.iter().copied());
                    false
                }
            });
            groups.push(g);
        }
        for group in &groups {
            let mut all: Vec<Value> = Vec::new();
            for s in group {
                for v in c.consts.get(s).into_iter().flatten() {
                    if !all.contains(v) {
                        all.push(*v);
                    }
                }
            }
            for &s in group {
                c.consts.insert(s, all.clone());
                rel.insert(s);
            }
        }
        rel
    }

    /// One var per fact read, with its classes; and slot -> var.
    /// Order: objects before members (paths sort parents first), then by slot.
    fn vars(&self, read: &BTreeSet<usize>) -> (Vec<Var>, BTreeMap<usize, usize>) {
        let c = self;
        let schema = c.schema();
        let fields = schema.fields;
        let mut vars: Vec<Var> = Vec::new();
        let mut index: BTreeMap<usize, usize> = BTreeMap::new();
        for &s in read {
            let d = &fields[s];
            let parent = d
                .path
                .rsplit_once('.')
                .and_then(|(p, _)| schema.slot(p))
                .filter(|&ps| fields[ps].nullable && fields[ps].ty == Ty::Object)
                .and_then(|ps| index.get(&ps).copied());
            let int_list_member = d.path.starts_with("window_size.")
                || d.path.starts_with("core_attention_bias_shape.")
                || d.path.starts_with("alibi_slopes_shape.");
            // Members of a present object hold values (te: the int-list members; other
            // families fill every member in when the object is read).
            let nullable = d.nullable && !(parent.is_some() && (int_list_member || !c.te()));
            let bounds = int_bounds(schema.family, d.path);
            let (mut classes, modulus) = c.classes(s, bounds);
            if nullable && d.ty != Ty::Object {
                classes.insert(
                    0,
                    Class {
                        value: Value::Null,
                        desc: ClassDesc::Null,
                    },
                );
            }
            // One more value of such a version: present but unparseable.
            if d.raw_text && d.ty == Ty::Version {
                classes.push(Class {
                    value: Value::BadVersion,
                    desc: ClassDesc::Unparseable,
                });
            }
            index.insert(s, vars.len());
            vars.push(Var {
                slot: s,
                path: d.path,
                parent,
                classes,
                modulus,
                bounds,
                fixed: d.fixed || d.origin == Origin::Probe,
                ty: d.ty,
            });
        }
        (vars, index)
    }

    /// The non-null classes of fact `s` and their residue modulus (1: none).
    fn classes(&self, s: usize, bounds: (i64, i64)) -> (Vec<Class>, i64) {
        let c = self;
        let d = &c.schema().fields[s];
        let consts = c.consts.get(&s).cloned().unwrap_or_default();
        let mut modulus = 1;
        let classes = match d.ty {
            Ty::Object => vec![
                Class {
                    value: Value::Null,
                    desc: ClassDesc::Null,
                },
                Class {
                    value: Value::Bool(true),
                    desc: ClassDesc::Present,
                },
            ],
            Ty::Bool => [false, true]
                .into_iter()
                .map(|b| Class {
                    value: Value::Bool(b),
                    desc: ClassDesc::Bool(b),
                })
                .collect(),
            Ty::Enum(dom) => (0..dom.values().len() as u16)
                .map(|i| Class {
                    value: Value::Enum(i),
                    desc: ClassDesc::Enum(i),
                })
                .collect(),
            Ty::Int => {
                let mut starts: BTreeSet<i64> = c.starts.get(&s).cloned().unwrap_or_default();
                for v in &consts {
                    match *v {
                        Value::Int(i) => {
                            starts.insert(i);
                            starts.insert(i.saturating_add(1));
                        }
                        Value::Float(x) if x.is_finite() => {
                            let (f, cl) = (x.floor() as i64, x.ceil() as i64);
                            starts.insert(f);
                            starts.insert(f + 1);
                            starts.insert(cl);
                            starts.insert(cl + 1);
                        }
                        _ => {}
                    }
                }
                for m in c.moduli.get(&s).into_iter().flatten() {
                    if (1..=64).contains(m) {
                        let l = lcm(modulus, *m);
                        if l <= 64 {
                            modulus = l;
                        }
                    }
                }
                int_classes(bounds, &starts, modulus)
            }
            Ty::Float => float_classes(float_lower_bound(d.path), &consts),
            Ty::Version => version_classes(&consts),
        };
        (classes, modulus)
    }

    /// Per var: how many conditions read it, derived facts counted for their inputs.
    fn read_counts(&self, vars: &[Var]) -> Vec<u32> {
        let c = self;
        let slot = |p: &str| c.schema().slot(p);
        vars.iter()
            .map(|v| {
                c.reads.get(&v.slot).copied().unwrap_or(0)
                    + match v.path {
                        _ if !c.te() => 0,
                        "sm" => [
                            "device_compute_capability.major",
                            "device_compute_capability.minor",
                        ]
                        .iter()
                        .filter_map(|p| slot(p).and_then(|s| c.reads.get(&s).copied()))
                        .sum(),
                        "window_size" | "window_size.left" | "window_size.right" => {
                            ["window.left", "window.right"]
                                .iter()
                                .filter_map(|p| slot(p).and_then(|s| c.reads.get(&s).copied()))
                                .sum()
                        }
                        _ => 0,
                    }
            })
            .collect()
    }

    /// The paths of the facts whose classes are not exact: under non-linear arithmetic, or
    /// with residue moduli whose lcm exceeds the limit (they were dropped). Sorted.
    fn inexact_paths(&self, inexact_slots: &[usize], read: &BTreeSet<usize>) -> Vec<&'static str> {
        let c = self;
        let fields = c.schema().fields;
        let mut inexact: Vec<&'static str> = inexact_slots
            .iter()
            .filter(|s| read.contains(s))
            .map(|&s| fields[s].path)
            .collect();
        for (s, ms) in &c.moduli {
            let l = ms.iter().fold(1i64, |a, m| {
                if (1..=64).contains(m) {
                    lcm(a, *m).min(1 << 20)
                } else {
                    a
                }
            });
            if l > 64 && read.contains(s) && !inexact.contains(&fields[*s].path) {
                inexact.push(fields[*s].path);
            }
        }
        inexact.sort_unstable();
        inexact
    }
}

/// Per fact slot, the vars that determine it (parents first; derived facts: their inputs).
fn deps(
    schema: &Schema,
    vars: &[Var],
    sm_var: Option<usize>,
    window: Option<WindowVars>,
) -> Vec<Vec<usize>> {
    let mut deps: Vec<Vec<usize>> = vec![Vec::new(); schema.fields.len()];
    for (i, v) in vars.iter().enumerate() {
        if let Some(p) = v.parent {
            deps[v.slot].push(p);
        }
        deps[v.slot].push(i);
    }
    if let Some(sv) = sm_var {
        for p in [
            "device_compute_capability.major",
            "device_compute_capability.minor",
        ] {
            deps[sid(p)] = vec![sv];
        }
    }
    if let Some(w) = window {
        deps[sid("window.left")] = vec![w.size, w.left];
        deps[sid("window.right")] = [Some(w.size), Some(w.right), w.mask]
            .into_iter()
            .flatten()
            .collect();
    }
    deps
}

/// The value of every fact no var determines: its default; probes answer "supported".
fn base_values(schema: &'static Schema) -> Vec<Value> {
    let mut base = schema.defaults().values().to_vec();
    for (s, d) in schema.fields.iter().enumerate() {
        if d.origin == Origin::Probe {
            base[s] = Value::Bool(true);
        }
    }
    base
}

/// The range an integer fact takes in the analysis (documented in docs/analysis.md).
fn int_bounds(family: &str, path: &str) -> (i64, i64) {
    const BIG: i64 = 1 << 40;
    if family == "torch" {
        // PyTorch SDPA (docs/packs/torch.md): head counts, head dims and ranks >= 1, other
        // sizes, strides and lengths >= 0, a mask has at least 2 dimensions.
        return match path {
            "sm" => (0, 999),
            "attn_mask.dim" => (2, BIG),
            p if p.starts_with("heads_") || p.starts_with("head_dim_") || p.starts_with("dim_") => {
                (1, BIG)
            }
            _ => (0, BIG),
        };
    }
    match path {
        "batch_size"
        | "num_heads"
        | "num_gqa_groups"
        | "max_seqlen_q"
        | "max_seqlen_kv"
        | "head_dim_qk"
        | "head_dim_v"
        | "cp_size"
        | "cp_size_a2a"
        | "num_splits"
        | "alibi_slopes_shape.len" => (1, BIG),
        "num_tokens_q" | "num_tokens_kv" => (0, BIG),
        p if p.starts_with("core_attention_bias_shape.") || p.starts_with("inference.") => (0, BIG),
        // TE accepts any integers here; FROST declines left < -1 (FR.26).
        "window_size.left" | "window_size.right" => (-BIG, BIG),
        "sm" => (0, 999),
        _ => (-BIG, BIG),
    }
}

fn float_lower_bound(path: &str) -> Option<f64> {
    match path {
        "attention_dropout" | "softcap" | "dropout_p" => Some(0.0),
        _ => None,
    }
}

fn lcm(a: i64, b: i64) -> i64 {
    fn gcd(a: i64, b: i64) -> i64 {
        if b == 0 { a } else { gcd(b, a % b) }
    }
    a / gcd(a, b) * b
}
