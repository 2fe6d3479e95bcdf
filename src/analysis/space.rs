//! The finite abstraction of the configuration space that every analysis searches.
//!
//! Each fact a condition reads becomes a [`Var`] whose values are split into equivalence
//! classes: integers at the constants they are compared with (`c` gets a class of its own),
//! refined by residues modulo the lcm of the `%` moduli applied to them; floats and versions at
//! their constants (with the open intervals in between, pre-releases included); every enum
//! value; both booleans; null for nullable facts. Within one class every condition of the
//! programs the space was built from has the same value, so one representative per class
//! decides for the whole class. Facts are those of the space's pack family ([`Schema`]); for
//! the `te` family derived facts are not variables: `sm` is (and sets the compute
//! capability), `window.left/right` come from `window_size` and the mask as in
//! [`crate::facts::Facts::from_json`]. Object members exist only when their object is present.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value as Json, json};

use crate::eval::program::{Func, Node, NodeId, Program};
use crate::facts::schema::{FieldDef, Origin, Schema, Ty};
use crate::facts::{Domain, Value};
use crate::lang::Version;
use crate::lang::ast::ArithOp;
use crate::lang::version::PreKind;

/// A set of fact slots (the schema has fewer than 128 facts).
pub type SlotMask = u128;

pub fn slot_bit(s: usize) -> SlotMask {
    if s < 128 { 1u128 << s } else { 0 }
}

pub fn mask_of(slots: &[u16]) -> SlotMask {
    slots.iter().fold(0, |m, &s| m | slot_bit(s as usize))
}

/// Lowest value an integer fact takes in the analysis (documented in docs/analysis.md).
fn int_bounds(family: &str, path: &str) -> (i64, i64) {
    const BIG: i64 = 1 << 40;
    if family == "torch" {
        // PyTorch SDPA (docs/packs/torch.md): head counts and head dims >= 1, other sizes,
        // strides and lengths >= 0, a mask has at least 2 dimensions.
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

/// What a class of a variable is, for rendering constraints.
#[derive(Clone, Debug, PartialEq)]
pub enum ClassDesc {
    Null,
    Present,
    Bool(bool),
    Enum(u16),
    /// Integers in `[lo, hi]` (inclusive), with residue `r` modulo `m` when `m > 1`.
    Int {
        iv: usize,
        lo: i64,
        hi: i64,
        r: i64,
    },
    /// An ordered class of floats or versions: index into the var's ordered classes.
    Ordered {
        lo: Option<(Value, bool)>,
        hi: Option<(Value, bool)>,
    },
}

#[derive(Clone, Debug)]
pub struct Class {
    pub value: Value,
    pub desc: ClassDesc,
}

#[derive(Clone, Debug)]
pub struct Var {
    pub slot: usize,
    pub path: &'static str,
    /// The object var this member belongs to (present/null).
    pub parent: Option<usize>,
    pub classes: Vec<Class>,
    /// Modulus of integer residue classes (1: none).
    pub modulus: i64,
    pub bounds: (i64, i64),
    pub fixed: bool,
    pub ty: Ty,
}

impl Var {
    pub fn domain(&self) -> Option<Domain> {
        match self.ty {
            Ty::Enum(d) => Some(d),
            _ => None,
        }
    }
}

#[derive(Default)]
struct Collect {
    /// Constants per slot.
    consts: BTreeMap<usize, Vec<Value>>,
    /// Extra integer class starts per slot.
    starts: BTreeMap<usize, BTreeSet<i64>>,
    moduli: BTreeMap<usize, BTreeSet<i64>>,
    /// Conditions reading each slot.
    reads: BTreeMap<usize, u32>,
    /// Pairs of slots compared with each other.
    relational: Vec<(Vec<usize>, Vec<usize>)>,
    read: BTreeSet<usize>,
    /// Facts under non-linear arithmetic (`x % y`, `x // y`, `x * y` with a fact on both
    /// sides): per-fact classes cannot make such conditions constant.
    inexact: BTreeSet<usize>,
}

pub(crate) fn slots_under(p: &Program, id: NodeId, out: &mut Vec<usize>) {
    match p.nodes[id as usize] {
        Node::Const(_) => {}
        Node::Slot(s) => out.push(s as usize),
        Node::Not(a) | Node::IsNull(a) | Node::IsNotNull(a) | Node::Neg(a) => {
            slots_under(p, a, out)
        }
        Node::And { start, len } | Node::Or { start, len } | Node::Call { start, len, .. } => {
            for &c in &p.children[start as usize..(start + len) as usize] {
                slots_under(p, c, out);
            }
        }
        Node::Cmp(_, a, b) | Node::Arith(_, a, b) => {
            slots_under(p, a, out);
            slots_under(p, b, out);
        }
        Node::In { item, .. } => slots_under(p, item, out),
    }
}

fn as_const(p: &Program, id: NodeId) -> Option<Value> {
    match p.nodes[id as usize] {
        Node::Const(v) => Some(v),
        Node::Neg(a) => match as_const(p, a)? {
            Value::Int(i) => Some(Value::Int(-i)),
            Value::Float(x) => Some(Value::Float(-x)),
            _ => None,
        },
        _ => None,
    }
}

fn vadd(v: Value, k: Value, sign: f64) -> Value {
    match (v, k) {
        (Value::Int(a), Value::Int(b)) => {
            Value::Int(a.saturating_add(b.saturating_mul(sign as i64)))
        }
        _ => match (v.as_f64(), k.as_f64()) {
            (Some(a), Some(b)) => Value::Float(a + sign * b),
            _ => v,
        },
    }
}

impl Collect {
    fn konst(&mut self, s: usize, v: Value) {
        self.consts.entry(s).or_default().push(v);
    }

    fn walk(&mut self, p: &Program, id: NodeId) {
        match p.nodes[id as usize] {
            Node::Const(_) => {}
            Node::Slot(s) => {
                self.read.insert(s as usize);
            }
            Node::Not(a) | Node::IsNull(a) | Node::IsNotNull(a) | Node::Neg(a) => self.walk(p, a),
            Node::And { start, len } | Node::Or { start, len } => {
                for &c in &p.children[start as usize..(start + len) as usize] {
                    self.walk(p, c);
                }
            }
            Node::Call { func, start, len } => {
                let args = &p.children[start as usize..(start + len) as usize];
                if matches!(func, Func::Gcd | Func::RoundUp)
                    && args.len() == 2
                    && let Some(Value::Int(m)) = as_const(p, args[1])
                {
                    self.modulus(p, args[0], m);
                }
                for &c in args {
                    self.walk(p, c);
                }
            }
            Node::Arith(op, a, b) => {
                if matches!(op, ArithOp::Rem | ArithOp::FloorDiv)
                    && let Some(Value::Int(m)) = as_const(p, b)
                {
                    self.modulus(p, a, m);
                }
                let nonlinear = match op {
                    ArithOp::Rem | ArithOp::FloorDiv => as_const(p, b).is_none(),
                    ArithOp::Mul => as_const(p, a).is_none() && as_const(p, b).is_none(),
                    _ => false,
                };
                if nonlinear {
                    let mut s = Vec::new();
                    slots_under(p, id, &mut s);
                    self.inexact.extend(s);
                }
                self.walk(p, a);
                self.walk(p, b);
            }
            Node::Cmp(_, a, b) => {
                match (as_const(p, a), as_const(p, b)) {
                    (None, Some(c)) => self.thresholds(p, a, c),
                    (Some(c), None) => self.thresholds(p, b, c),
                    (None, None) => {
                        let (mut x, mut y) = (Vec::new(), Vec::new());
                        slots_under(p, a, &mut x);
                        slots_under(p, b, &mut y);
                        self.relational.push((x, y));
                    }
                    _ => {}
                }
                self.walk(p, a);
                self.walk(p, b);
            }
            Node::In {
                item, start, len, ..
            } => {
                let consts: Vec<Value> = p.consts[start as usize..(start + len) as usize].to_vec();
                for c in consts {
                    self.thresholds(p, item, c);
                }
                self.walk(p, item);
            }
        }
    }

    fn modulus(&mut self, p: &Program, e: NodeId, m: i64) {
        if m == 0 {
            return;
        }
        if m.abs() > 64 {
            // Residues beyond the supported lcm are not represented.
            let mut s = Vec::new();
            slots_under(p, e, &mut s);
            self.inexact.extend(s);
        }
        let mut s = Vec::new();
        slots_under(p, e, &mut s);
        for s in s {
            self.moduli.entry(s).or_default().insert(m.abs());
        }
    }

    /// Constant `c` compared with expression `e`: the values of `e`'s facts where the
    /// comparison can change.
    fn thresholds(&mut self, p: &Program, e: NodeId, c: Value) {
        match p.nodes[e as usize] {
            Node::Slot(s) => self.konst(s as usize, c),
            Node::Arith(op, a, b) => match (op, as_const(p, a), as_const(p, b)) {
                (ArithOp::Add, None, Some(k)) => self.thresholds(p, a, vadd(c, k, -1.0)),
                (ArithOp::Add, Some(k), None) => self.thresholds(p, b, vadd(c, k, -1.0)),
                (ArithOp::Sub, None, Some(k)) => self.thresholds(p, a, vadd(c, k, 1.0)),
                (ArithOp::Sub, Some(k), None) => {
                    let neg = match c {
                        Value::Int(i) => Value::Int(-i),
                        Value::Float(x) => Value::Float(-x),
                        v => v,
                    };
                    self.thresholds(p, b, vadd(neg, k, 1.0))
                }
                (ArithOp::Mul, None, Some(Value::Int(k)))
                | (ArithOp::Mul, Some(Value::Int(k)), None)
                    if k != 0 =>
                {
                    let x = if as_const(p, a).is_some() { b } else { a };
                    if let Value::Int(ci) = c {
                        self.thresholds(p, x, Value::Int(ci.div_euclid(k)));
                        self.thresholds(p, x, Value::Int(ci.div_euclid(k) + 1));
                    } else {
                        self.thresholds_all(p, x, c);
                    }
                }
                (ArithOp::FloorDiv, None, Some(Value::Int(k))) if k != 0 => {
                    if let Value::Int(ci) = c {
                        let mut s = Vec::new();
                        slots_under(p, a, &mut s);
                        for s in s {
                            let e = self.starts.entry(s).or_default();
                            e.insert(ci.saturating_mul(k));
                            e.insert(ci.saturating_add(1).saturating_mul(k));
                        }
                    }
                }
                _ => self.thresholds_all(p, e, c),
            },
            Node::Call { func, start, len } => {
                let args: Vec<NodeId> = p.children[start as usize..(start + len) as usize].to_vec();
                match func {
                    Func::Max | Func::Min => {
                        for a in args {
                            self.thresholds(p, a, c);
                        }
                    }
                    Func::Abs => {
                        self.thresholds(p, args[0], c);
                        let neg = match c {
                            Value::Int(i) => Value::Int(-i),
                            Value::Float(x) => Value::Float(-x),
                            v => v,
                        };
                        self.thresholds(p, args[0], neg);
                    }
                    Func::RoundUp => {
                        if let (Some(Value::Int(m)), Value::Int(ci)) = (as_const(p, args[1]), c) {
                            self.thresholds(p, args[0], Value::Int(ci));
                            self.thresholds(p, args[0], Value::Int(ci - m));
                        } else {
                            self.thresholds_all(p, e, c);
                        }
                    }
                    Func::Gcd | Func::If => self.thresholds_all(p, e, c),
                }
            }
            Node::Neg(a) => {
                let neg = match c {
                    Value::Int(i) => Value::Int(-i),
                    Value::Float(x) => Value::Float(-x),
                    v => v,
                };
                self.thresholds(p, a, neg)
            }
            _ => self.thresholds_all(p, e, c),
        }
    }

    fn thresholds_all(&mut self, p: &Program, e: NodeId, c: Value) {
        let mut s = Vec::new();
        slots_under(p, e, &mut s);
        for s in s {
            self.konst(s, c);
        }
    }
}

fn lcm(a: i64, b: i64) -> i64 {
    fn gcd(a: i64, b: i64) -> i64 {
        if b == 0 { a } else { gcd(b, a % b) }
    }
    a / gcd(a, b) * b
}

/// The variables of one analysis and how assignments become fact values.
#[derive(Clone, Debug)]
pub struct Space {
    pub vars: Vec<Var>,
    /// Per var: how many conditions read it (search order).
    pub reads: Vec<u32>,
    /// For each slot, the vars that determine it (in assignment order: parents first).
    pub deps: Vec<Vec<usize>>,
    base: Vec<Value>,
    /// The pack family whose facts the vars are.
    pub schema: &'static Schema,
    sm_var: Option<usize>,
    window: Option<WindowVars>,
    /// Facts whose classes are not exact (non-linear arithmetic, residues beyond the lcm
    /// limit): conditions reading them may differ inside a class, so "no class satisfies"
    /// is not a proof there.
    pub inexact: Vec<&'static str>,
    /// Slots compared with another fact (`head_dim_v == head_dim_qk`).
    pub relational: Vec<usize>,
}

#[derive(Clone, Copy, Debug)]
struct WindowVars {
    size: usize,
    left: usize,
    right: usize,
    mask: Option<usize>,
}

/// Builds a [`Space`] from the conditions of one or more programs.
#[derive(Default)]
pub struct SpaceBuilder {
    c: Collect,
    extra: Vec<(usize, Value)>,
    /// The facts' family (`None`: te).
    schema: Option<&'static Schema>,
}

impl SpaceBuilder {
    /// A builder over the `te` family's facts.
    pub fn new() -> SpaceBuilder {
        SpaceBuilder::default()
    }

    /// A builder over `schema`'s facts (a policy's: `policy.schema`).
    pub fn for_schema(schema: &'static Schema) -> SpaceBuilder {
        SpaceBuilder {
            schema: Some(schema),
            ..SpaceBuilder::default()
        }
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
        let schema: &'static Schema = self.schema.unwrap_or(&crate::facts::te::TE);
        let fields: &'static [FieldDef] = schema.fields;
        let slot = |p: &str| schema.slot(p);
        // The te family's derived facts (sm, window) map to the inputs that determine them.
        let te = schema.family == "te";
        let c = &mut self.c;
        let sid = |p: &str| slot(p).expect("schema fact");
        let mut read: BTreeSet<usize> = BTreeSet::new();
        let mut need_window = false;
        let mut need_mask = false;
        for &s in &c.read.clone() {
            let path = fields[s].path;
            if !te {
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
        // Facts under non-linear arithmetic: small values get classes of their own, so
        // witnesses such as `num_heads % cp_size != 0` (3 % 2) exist in the abstraction.
        let inexact_slots: Vec<usize> = c.inexact.iter().copied().collect();
        for &s in &inexact_slots {
            if fields[s].ty == Ty::Int {
                let e = c.starts.entry(s).or_default();
                for k in 0..=5 {
                    e.insert(k);
                }
            }
        }
        // Relational comparisons: both sides share their constants (so their intervals line
        // up and the diagrams' orderings of the two are decided on most pairs of classes).
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
        // Order: objects before members (paths sort parents first), then by slot.
        let mut vars: Vec<Var> = Vec::new();
        let mut index: BTreeMap<usize, usize> = BTreeMap::new();
        for &s in &read {
            let d = &fields[s];
            let consts = c.consts.get(&s).cloned().unwrap_or_default();
            let parent = d
                .path
                .rsplit_once('.')
                .and_then(|(p, _)| slot(p))
                .filter(|&ps| fields[ps].nullable && fields[ps].ty == Ty::Object)
                .and_then(|ps| index.get(&ps).copied());
            let int_list_member = d.path.starts_with("window_size.")
                || d.path.starts_with("core_attention_bias_shape.")
                || d.path.starts_with("alibi_slopes_shape.");
            // Members of a present object hold values (te: the int-list members; other
            // families fill every member in when the object is read).
            let nullable = d.nullable && !(parent.is_some() && (int_list_member || !te));
            let bounds = int_bounds(schema.family, d.path);
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
            let mut classes = classes;
            if nullable && d.ty != Ty::Object {
                classes.insert(
                    0,
                    Class {
                        value: Value::Null,
                        desc: ClassDesc::Null,
                    },
                );
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
        let var_of = |p: &str| slot(p).and_then(|s| index.get(&s).copied());
        let sm_var = if te { var_of("sm") } else { None };
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
        let mut deps: Vec<Vec<usize>> = vec![Vec::new(); fields.len()];
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
        let mut base = schema.defaults().values().to_vec();
        for (s, d) in fields.iter().enumerate() {
            if d.origin == Origin::Probe {
                base[s] = Value::Bool(true);
            }
        }
        let reads = vars
            .iter()
            .map(|v| {
                c.reads.get(&v.slot).copied().unwrap_or(0)
                    + match v.path {
                        _ if !te => 0,
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
            .collect();
        let mut inexact: Vec<&'static str> = inexact_slots
            .iter()
            .filter(|s| read.contains(s))
            .map(|&s| fields[s].path)
            .collect();
        // Residue moduli whose lcm exceeds the limit were dropped.
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
        Space {
            vars,
            reads,
            deps,
            base,
            schema,
            sm_var,
            window,
            inexact,
            relational: rel.into_iter().collect(),
        }
    }
}

/// Sorted integer intervals as conditions, adjacent ones merged.
fn int_intervals(v: &Var, ivs: &[(i64, i64)]) -> Vec<String> {
    let path = v.path;
    let mut merged: Vec<(i64, i64)> = Vec::new();
    for &(lo, hi) in ivs {
        match merged.last_mut() {
            Some((_, e)) if *e + 1 == lo => *e = hi,
            _ => merged.push((lo, hi)),
        }
    }
    merged
        .iter()
        .map(|&(lo, hi)| {
            let (dlo, dhi) = v.bounds;
            if lo == hi {
                format!("{path} == {lo}")
            } else if lo <= dlo && hi >= dhi {
                format!("{path} >= {lo}")
            } else if lo <= dlo {
                format!("{path} <= {hi}")
            } else if hi >= dhi {
                format!("{path} > {}", lo - 1)
            } else {
                format!("{} < {path} <= {hi}", lo - 1)
            }
        })
        .collect()
}

fn int_classes(bounds: (i64, i64), starts: &BTreeSet<i64>, m: i64) -> Vec<Class> {
    let (dlo, dhi) = bounds;
    let mut cuts: Vec<i64> = starts
        .iter()
        .copied()
        .filter(|&s| s > dlo && s <= dhi)
        .collect();
    cuts.insert(0, dlo);
    let mut ivs: Vec<(i64, i64)> = Vec::new();
    for (i, &lo) in cuts.iter().enumerate() {
        let hi = cuts.get(i + 1).map_or(dhi, |n| n - 1);
        ivs.push((lo, hi));
    }
    let mut out = Vec::new();
    for (iv, &(lo, hi)) in ivs.iter().enumerate() {
        for r in 0..m {
            // Representative: the smallest member, or the largest for the unbounded-below class.
            let rep = if lo == dlo && dlo < -(1 << 39) {
                let x = hi - (hi - r).rem_euclid(m);
                (x >= lo).then_some(x)
            } else {
                let x = lo + (r - lo).rem_euclid(m);
                (x <= hi).then_some(x)
            };
            if let Some(x) = rep {
                out.push(Class {
                    value: Value::Int(x),
                    desc: ClassDesc::Int { iv, lo, hi, r },
                });
            }
        }
    }
    out
}

fn ordered(lo: Option<(Value, bool)>, hi: Option<(Value, bool)>, value: Value) -> Class {
    Class {
        value,
        desc: ClassDesc::Ordered { lo, hi },
    }
}

fn float_classes(lower: Option<f64>, consts: &[Value]) -> Vec<Class> {
    let mut pts: Vec<f64> = consts
        .iter()
        .filter_map(|v| v.as_f64())
        .filter(|x| x.is_finite() && lower.is_none_or(|l| *x >= l))
        .collect();
    if let Some(l) = lower {
        pts.push(l);
    }
    pts.sort_by(f64::total_cmp);
    pts.dedup();
    let f = Value::Float;
    let mut out = Vec::new();
    if pts.is_empty() {
        out.push(ordered(None, None, f(0.0)));
        return out;
    }
    if lower.is_none() {
        out.push(ordered(None, Some((f(pts[0]), false)), f(pts[0] - 1.0)));
    }
    for (i, &p) in pts.iter().enumerate() {
        out.push(ordered(Some((f(p), true)), Some((f(p), true)), f(p)));
        match pts.get(i + 1) {
            Some(&n) => out.push(ordered(
                Some((f(p), false)),
                Some((f(n), false)),
                f((p + n) / 2.0),
            )),
            None => out.push(ordered(Some((f(p), false)), None, f(p + 1.0))),
        }
    }
    out
}

fn version_between(a: Option<Version>, b: Option<Version>) -> Option<Version> {
    let mut cands: Vec<Version> = Vec::new();
    match (a, b) {
        (None, Some(b)) => {
            let [x, y, z] = b.parts;
            if b.pre.is_some() {
                cands.push(Version {
                    parts: b.parts,
                    pre: Some((PreKind::Dev, 0)),
                });
            }
            if z > 0 {
                cands.push(Version::new(x, y, z - 1));
            }
            if y > 0 {
                cands.push(Version::new(x, y - 1, 0));
            }
            if x > 0 {
                cands.push(Version::new(x - 1, 0, 0));
            }
            cands.push(Version {
                parts: b.parts,
                pre: Some((PreKind::Dev, 0)),
            });
        }
        (Some(a), hi) => {
            let [x, y, z] = a.parts;
            if a.pre.is_some() {
                cands.push(Version::new(x, y, z));
                if let Some((k, n)) = a.pre {
                    cands.push(Version {
                        parts: a.parts,
                        pre: Some((k, n + 1)),
                    });
                }
            }
            cands.push(Version::new(x, y, z + 1));
            cands.push(Version::new(x, y + 1, 0));
            cands.push(Version::new(x + 1, 0, 0));
            if let Some(b) = hi {
                cands.push(Version {
                    parts: b.parts,
                    pre: Some((PreKind::Dev, 0)),
                });
                if let Some((k, n)) = b.pre
                    && n > 0
                {
                    cands.push(Version {
                        parts: b.parts,
                        pre: Some((k, n - 1)),
                    });
                }
            }
            cands.retain(|v| hi.is_none_or(|b| *v < b));
        }
        (None, None) => cands.push(Version::new(1, 0, 0)),
    }
    cands
        .into_iter()
        .find(|v| a.is_none_or(|a| *v > a) && b.is_none_or(|b| *v < b))
}

fn version_classes(consts: &[Value]) -> Vec<Class> {
    let mut pts: Vec<Version> = consts
        .iter()
        .filter_map(|v| match v {
            Value::Version(v) => Some(*v),
            _ => None,
        })
        .collect();
    pts.sort();
    pts.dedup();
    let v = Value::Version;
    let mut out = Vec::new();
    let mut prev: Option<Version> = None;
    for &p in &pts {
        if let Some(x) = version_between(prev, Some(p)) {
            out.push(ordered(
                prev.map(|a| (v(a), false)),
                Some((v(p), false)),
                v(x),
            ));
        }
        out.push(ordered(Some((v(p), true)), Some((v(p), true)), v(p)));
        prev = Some(p);
    }
    if let Some(x) = version_between(prev, None) {
        out.push(ordered(prev.map(|a| (v(a), false)), None, v(x)));
    }
    out
}

/// A partial assignment: a class per var, `None` = not (yet) fixed.
pub type Assign = Vec<Option<u32>>;

impl Space {
    /// Fact values for a partial assignment: unassigned facts are `Unknown` (Kleene logic
    /// decides what it can), probes are answered "supported" (true).
    pub fn materialize(&self, a: &[Option<u32>], out: &mut Vec<Value>) {
        self.materialize_with(a, &[], out)
    }

    /// [`Space::materialize`] with some integer vars at given members of their classes
    /// (`(var, value)`), not at the classes' representatives.
    pub fn materialize_with(
        &self,
        a: &[Option<u32>],
        values: &[(usize, Value)],
        out: &mut Vec<Value>,
    ) {
        out.clear();
        out.extend_from_slice(&self.base);
        for (i, v) in self.vars.iter().enumerate() {
            out[v.slot] = self.value_of(a, i);
        }
        for &(i, x) in values {
            if out[self.vars[i].slot] != Value::Null {
                out[self.vars[i].slot] = x;
            }
        }
        if let Some(sv) = self.sm_var {
            let (ma, mi) = match out[self.vars[sv].slot] {
                Value::Int(sm) => (Value::Int(sm / 10), Value::Int(sm % 10)),
                other => (other, other),
            };
            out[self.slot("device_compute_capability.major")] = ma;
            out[self.slot("device_compute_capability.minor")] = mi;
        }
        if let Some(w) = self.window {
            let (l, r) = match out[self.vars[w.size].slot] {
                Value::Null => {
                    let mask = match w.mask {
                        Some(m) => out[self.vars[m].slot],
                        None => self.base[self.slot("attn_mask_type")],
                    };
                    let right = match mask {
                        Value::Enum(i) => {
                            if Domain::AttnMaskType.values()[i as usize].contains("causal") {
                                Value::Int(0)
                            } else {
                                Value::Int(-1)
                            }
                        }
                        _ => Value::Unknown,
                    };
                    (Value::Int(-1), right)
                }
                Value::Unknown => (Value::Unknown, Value::Unknown),
                _ => (out[self.vars[w.left].slot], out[self.vars[w.right].slot]),
            };
            out[self.slot("window.left")] = l;
            out[self.slot("window.right")] = r;
        }
    }

    /// Slot of a fact of the space's family that the family's own handling relies on.
    fn slot(&self, path: &str) -> usize {
        self.schema.slot(path).expect("fact of the space's family")
    }

    /// The value of a fact no var determines (its default; probes "supported").
    pub(crate) fn default_value(&self, slot: usize) -> Value {
        self.base[slot]
    }

    /// The value of var `i` under an assignment (null for members of an absent object,
    /// unknown when unassigned).
    pub(crate) fn value_of(&self, a: &[Option<u32>], i: usize) -> Value {
        let v = &self.vars[i];
        if let Some(p) = v.parent {
            match a[p] {
                None => return Value::Unknown,
                Some(c) if self.vars[p].classes[c as usize].value == Value::Null => {
                    return Value::Null;
                }
                _ => {}
            }
        }
        match a[i] {
            Some(c) => v.classes[c as usize].value,
            None => Value::Unknown,
        }
    }

    /// Whether var `i` can be branched on now (its object, if any, is present).
    pub fn available(&self, a: &[Option<u32>], i: usize) -> bool {
        if a[i].is_some() {
            return false;
        }
        match self.vars[i].parent {
            None => true,
            Some(p) => {
                matches!(a[p], Some(c) if self.vars[p].classes[c as usize].value != Value::Null)
            }
        }
    }

    /// The class of var `i` holding `value` (None: no class does).
    pub fn class_of(&self, i: usize, value: Value) -> Option<usize> {
        let v = &self.vars[i];
        v.classes.iter().position(|c| match (&c.desc, value) {
            (ClassDesc::Null, x) => x == Value::Null,
            (_, Value::Null) => false,
            (ClassDesc::Present, _) => true,
            (ClassDesc::Bool(b), Value::Bool(x)) => *b == x,
            (ClassDesc::Enum(e), Value::Enum(x)) => *e == x,
            (ClassDesc::Int { lo, hi, r, .. }, Value::Int(x)) => {
                *lo <= x && x <= *hi && (v.modulus <= 1 || x.rem_euclid(v.modulus) == *r)
            }
            (ClassDesc::Ordered { lo, hi }, x) => {
                use std::cmp::Ordering::*;
                let above = lo.is_none_or(|(b, incl)| match x.compare(b) {
                    Some(Greater) => true,
                    Some(Equal) => incl,
                    _ => false,
                });
                let below = hi.is_none_or(|(b, incl)| match x.compare(b) {
                    Some(Less) => true,
                    Some(Equal) => incl,
                    _ => false,
                });
                above && below
            }
            _ => false,
        })
    }

    /// The members of class `c` of integer var `i`: (first, last, step); None for other
    /// classes.
    pub fn int_members(&self, i: usize, c: u32) -> Option<(i64, i64, i64)> {
        let v = &self.vars[i];
        match v.classes[c as usize].desc {
            ClassDesc::Int { lo, hi, r, .. } => {
                let m = v.modulus.max(1);
                let first = lo.saturating_add((r - lo).rem_euclid(m));
                let last = hi.saturating_sub((hi - r).rem_euclid(m));
                (first <= last).then_some((first, last, m))
            }
            _ => None,
        }
    }

    /// The var of a fact path, if the space has one.
    pub fn var_of(&self, path: &str) -> Option<usize> {
        self.vars.iter().position(|v| v.path == path)
    }

    /// The number of classes of the full cross product (for reporting), as a float.
    pub fn product(&self) -> f64 {
        self.vars.iter().map(|v| v.classes.len() as f64).product()
    }

    /// A config object (conformance `config` format) for a partial assignment: assigned
    /// facts are set, the others keep their defaults.
    pub fn example(&self, a: &[Option<u32>]) -> Json {
        self.example_with(a, &[])
    }

    /// [`Space::example`] with some integer vars at given values (see `materialize_with`).
    pub fn example_with(&self, a: &[Option<u32>], values: &[(usize, Value)]) -> Json {
        let mut obj = Map::new();
        let mut vals = Vec::new();
        self.materialize_with(a, values, &mut vals);
        for (i, v) in self.vars.iter().enumerate() {
            let val = match values.iter().find(|x| x.0 == i) {
                Some(&(_, x)) if self.value_of(a, i) != Value::Null => x,
                _ => self.value_of(a, i),
            };
            if matches!(val, Value::Unknown) {
                continue;
            }
            if let Some(p) = v.parent
                && (a[p].is_none() || self.value_of(a, p) == Value::Null)
            {
                // Members of an absent (or undecided) object are not written.
                continue;
            }
            let path = v.path;
            if self.schema.family != "te" {
                // Structured facts as objects their members fill in; the rest as values.
                let j = match (v.ty, val) {
                    (Ty::Object, Value::Null) => Json::Null,
                    (Ty::Object, _) => json!({}),
                    _ => val.to_json(v.domain()),
                };
                insert_path(&mut obj, path, j);
                continue;
            }
            match path {
                "sm" => {
                    if let Value::Int(sm) = val {
                        obj.insert(
                            "device_compute_capability".into(),
                            json!([sm / 10, sm % 10]),
                        );
                    }
                }
                "window_size" => {
                    if val == Value::Null {
                        obj.insert("window_size".into(), Json::Null);
                    } else {
                        let w = self.window.expect("window vars");
                        let get = |x: usize| match vals[self.vars[x].slot] {
                            Value::Int(i) => i,
                            _ => -1,
                        };
                        obj.insert("window_size".into(), json!([get(w.left), get(w.right)]));
                    }
                }
                "window_size.left" | "window_size.right" => {}
                "core_attention_bias_shape" | "alibi_slopes_shape" => {
                    if val == Value::Null {
                        obj.insert(path.into(), Json::Null);
                    } else if path == "alibi_slopes_shape" {
                        let n = match vals[self.slot("alibi_slopes_shape.len")] {
                            Value::Int(n) if (1..=8).contains(&n) => n as usize,
                            _ => 1,
                        };
                        obj.insert(path.into(), json!(vec![1; n]));
                    } else {
                        let dims: Vec<i64> = ["b", "h", "s_q", "s_kv"]
                            .iter()
                            .map(|m| match vals[self.slot(&format!("{path}.{m}"))] {
                                Value::Int(i) => i,
                                _ => 1,
                            })
                            .collect();
                        obj.insert(path.into(), json!(dims));
                    }
                }
                p if p.starts_with("core_attention_bias_shape.")
                    || p.starts_with("alibi_slopes_shape.") => {}
                "fp8_recipe" | "inference" => {
                    if val == Value::Null {
                        obj.insert(path.into(), Json::Null);
                    } else {
                        obj.entry(path.to_string()).or_insert_with(|| json!({}));
                    }
                }
                _ => {
                    let j = match (val, path.starts_with("env.")) {
                        (Value::Int(i), true) => json!(i.to_string()),
                        _ => val.to_json(v.domain()),
                    };
                    insert_path(&mut obj, path, j);
                }
            }
        }
        let probes: Map<String, Json> = self
            .schema
            .fields
            .iter()
            .filter(|d| d.origin == Origin::Probe)
            .filter_map(|d| d.path.strip_prefix("probe."))
            .map(|n| (n.to_string(), Json::Bool(true)))
            .collect();
        obj.insert("probe".into(), Json::Object(probes));
        Json::Object(obj)
    }

    /// Renders the classes `set` of var `i` as an expression (None: no constraint).
    pub fn render(&self, i: usize, set: &[u32]) -> Option<String> {
        let v = &self.vars[i];
        let n = v.classes.len();
        if set.len() >= n {
            return None;
        }
        let path = v.path;
        let has_null = set
            .iter()
            .any(|&c| v.classes[c as usize].desc == ClassDesc::Null);
        let rest: Vec<&Class> = set
            .iter()
            .map(|&c| &v.classes[c as usize])
            .filter(|c| c.desc != ClassDesc::Null)
            .collect();
        let null_total = v.classes.iter().any(|c| c.desc == ClassDesc::Null);
        let mut parts: Vec<String> = Vec::new();
        if !rest.is_empty() {
            let all_non_null = rest.len() == n - usize::from(null_total);
            if all_non_null {
                parts.push(format!("{path} != null"));
            } else {
                parts.push(self.render_non_null(v, &rest));
            }
        }
        if has_null {
            if rest.is_empty() {
                return Some(format!("{path} == null"));
            }
            let body = parts.join("");
            return Some(format!("{path} == null or {body}"));
        }
        Some(parts.join(""))
    }

    fn render_non_null(&self, v: &Var, cls: &[&Class]) -> String {
        let path = v.path;
        match &cls[0].desc {
            ClassDesc::Present => format!("{path} != null"),
            ClassDesc::Bool(b) => {
                if cls.len() == 2 {
                    format!("{path} != null")
                } else if *b {
                    path.to_string()
                } else {
                    format!("not {path}")
                }
            }
            ClassDesc::Enum(_) => {
                let dom = v.domain().expect("enum var");
                let names: Vec<String> = cls
                    .iter()
                    .filter_map(|c| match c.desc {
                        ClassDesc::Enum(i) => Some(format!("{:?}", dom.values()[i as usize])),
                        _ => None,
                    })
                    .collect();
                let all = dom.values().len();
                if names.len() == 1 {
                    format!("{path} == {}", names[0])
                } else if all - names.len() < names.len() {
                    let others: Vec<String> = dom
                        .values()
                        .iter()
                        .map(|s| format!("{s:?}"))
                        .filter(|s| !names.contains(s))
                        .collect();
                    if others.len() == 1 {
                        format!("{path} != {}", others[0])
                    } else {
                        format!("{path} not in [{}]", others.join(", "))
                    }
                } else {
                    format!("{path} in [{}]", names.join(", "))
                }
            }
            ClassDesc::Int { .. } => self.render_int(v, cls),
            ClassDesc::Ordered { .. } => {
                // Consecutive classes merge into one interval.
                let idx: Vec<usize> = cls
                    .iter()
                    .map(|c| {
                        v.classes
                            .iter()
                            .position(|x| std::ptr::eq(x, *c))
                            .unwrap_or(0)
                    })
                    .collect();
                let mut runs: Vec<(usize, usize)> = Vec::new();
                for &i in &idx {
                    match runs.last_mut() {
                        Some((_, e)) if *e + 1 == i => *e = i,
                        _ => runs.push((i, i)),
                    }
                }
                let terms: Vec<String> = runs
                    .iter()
                    .map(|&(s, e)| {
                        let lo = match &v.classes[s].desc {
                            ClassDesc::Ordered { lo, .. } => *lo,
                            _ => None,
                        };
                        let hi = match &v.classes[e].desc {
                            ClassDesc::Ordered { hi, .. } => *hi,
                            _ => None,
                        };
                        render_bounds(path, lo, hi, v.domain())
                    })
                    .collect();
                terms.join(" or ")
            }
            ClassDesc::Null => format!("{path} == null"),
        }
    }

    fn render_int(&self, v: &Var, cls: &[&Class]) -> String {
        if v.modulus <= 1 {
            return self.render_int_residues(v, cls);
        }
        // Intervals whose every residue class is chosen read as plain intervals.
        let mut total: BTreeMap<usize, usize> = BTreeMap::new();
        for c in &v.classes {
            if let ClassDesc::Int { iv, .. } = c.desc {
                *total.entry(iv).or_default() += 1;
            }
        }
        let mut chosen: BTreeMap<usize, (usize, i64, i64)> = BTreeMap::new();
        for c in cls {
            if let ClassDesc::Int { iv, lo, hi, .. } = c.desc {
                let e = chosen.entry(iv).or_insert((0, lo, hi));
                e.0 += 1;
                e.1 = e.1.min(lo);
                e.2 = e.2.max(hi);
            }
        }
        let whole: Vec<(i64, i64)> = chosen
            .iter()
            .filter(|(iv, e)| total.get(iv) == Some(&e.0))
            .map(|(_, e)| (e.1, e.2))
            .collect();
        if whole.is_empty() {
            return self.render_int_residues(v, cls);
        }
        let partial: Vec<&Class> = cls
            .iter()
            .copied()
            .filter(|c| match c.desc {
                ClassDesc::Int { iv, .. } => total.get(&iv) != chosen.get(&iv).map(|e| &e.0),
                _ => false,
            })
            .collect();
        let mut terms = int_intervals(v, &whole);
        if !partial.is_empty() {
            terms.push(self.render_int_residues(v, &partial));
        }
        terms.join(" or ")
    }

    fn render_int_residues(&self, v: &Var, cls: &[&Class]) -> String {
        let path = v.path;
        // Group intervals by residue.
        let mut by_res: BTreeMap<i64, BTreeSet<(i64, i64)>> = BTreeMap::new();
        let mut all_res: BTreeMap<(i64, i64), BTreeSet<i64>> = BTreeMap::new();
        for c in &v.classes {
            if let ClassDesc::Int { lo, hi, r, .. } = c.desc {
                all_res.entry((lo, hi)).or_default().insert(r);
            }
        }
        for c in cls {
            if let ClassDesc::Int { lo, hi, r, .. } = c.desc {
                by_res.entry(r).or_default().insert((lo, hi));
            }
        }
        let int_terms = |ivs: &BTreeSet<(i64, i64)>| -> Vec<String> {
            int_intervals(v, &ivs.iter().copied().collect::<Vec<_>>())
        };
        if v.modulus <= 1 {
            let ivs = by_res.values().next().cloned().unwrap_or_default();
            return int_terms(&ivs).join(" or ");
        }
        // Same interval set for every chosen residue: intervals and residues separately.
        let first = by_res.values().next().cloned().unwrap_or_default();
        let uniform = by_res.values().all(|s| *s == first);
        let m = v.modulus;
        if uniform {
            let res: Vec<i64> = by_res.keys().copied().collect();
            // All residues of each interval chosen: no residue constraint.
            let full = first.iter().all(|iv| {
                all_res
                    .get(iv)
                    .is_some_and(|rs| rs.iter().all(|r| res.contains(r)))
            });
            let terms = int_terms(&first);
            let ivs = if terms.len() > 1 {
                format!("({})", terms.join(" or "))
            } else {
                terms.join("")
            };
            if full {
                return ivs;
            }
            let rc = if res.len() == 1 {
                format!("{path} % {m} == {}", res[0])
            } else if res.len() == m as usize - 1 {
                let missing = (0..m).find(|r| !res.contains(r)).unwrap_or(0);
                format!("{path} % {m} != {missing}")
            } else {
                format!(
                    "{path} % {m} in [{}]",
                    res.iter()
                        .map(i64::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            return format!("{ivs} and {rc}");
        }
        by_res
            .iter()
            .map(|(r, ivs)| {
                let t = int_terms(ivs);
                let ivs = if t.len() > 1 {
                    format!("({})", t.join(" or "))
                } else {
                    t.join("")
                };
                format!("({ivs} and {path} % {m} == {r})")
            })
            .collect::<Vec<_>>()
            .join(" or ")
    }
}

fn render_bounds(
    path: &str,
    lo: Option<(Value, bool)>,
    hi: Option<(Value, bool)>,
    dom: Option<Domain>,
) -> String {
    let s = |v: Value| v.display(dom).to_string();
    match (lo, hi) {
        (Some((a, true)), Some((b, true))) if a == b => format!("{path} == {}", s(a)),
        (None, None) => format!("{path} != null"),
        (Some((a, incl)), None) => format!("{path} {} {}", if incl { ">=" } else { ">" }, s(a)),
        (None, Some((b, incl))) => format!("{path} {} {}", if incl { "<=" } else { "<" }, s(b)),
        (Some((a, li)), Some((b, hi))) => format!(
            "{} {} {path} {} {}",
            s(a),
            if li { "<=" } else { "<" },
            if hi { "<=" } else { "<" },
            s(b)
        ),
    }
}

fn insert_path(obj: &mut Map<String, Json>, path: &str, value: Json) {
    match path.split_once('.') {
        Some((head, rest)) => {
            let entry = obj
                .entry(head.to_string())
                .or_insert_with(|| Json::Object(Map::new()));
            if !entry.is_object() {
                *entry = Json::Object(Map::new());
            }
            if let Some(m) = entry.as_object_mut() {
                insert_path(m, rest, value);
            }
        }
        None => {
            obj.insert(path.to_string(), value);
        }
    }
}
