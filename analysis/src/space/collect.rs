//! What the conditions of a pack say about each fact: the constants where a condition's truth
//! can change (thresholds), the moduli applied to it, pairs of facts compared with each other,
//! and facts under non-linear arithmetic.
//!
//! Invariant: for every fact, splitting its values at the collected constants (a class of its
//! own per constant) and by residues modulo the collected moduli makes every walked condition
//! constant on each class, except for facts recorded in `inexact` and pairs in `relational`.
//! Thresholds are pushed through linear arithmetic (`x + k`, `k * x`, `x // k`, `max`,
//! `abs`, `round_up`) to the facts underneath; anything else marks every fact under the
//! expression with the constant.

use std::collections::{BTreeMap, BTreeSet};

use attn_policy::eval::program::{Func, Node, NodeId, Program};
use attn_policy::facts::Value;
use attn_policy::lang::ast::ArithOp;

#[derive(Default)]
pub(super) struct Collect {
    /// Constants per slot.
    pub(super) consts: BTreeMap<usize, Vec<Value>>,
    /// Extra integer class starts per slot.
    pub(super) starts: BTreeMap<usize, BTreeSet<i64>>,
    pub(super) moduli: BTreeMap<usize, BTreeSet<i64>>,
    /// Conditions reading each slot.
    pub(super) reads: BTreeMap<usize, u32>,
    /// Pairs of slots compared with each other.
    pub(super) relational: Vec<(Vec<usize>, Vec<usize>)>,
    pub(super) read: BTreeSet<usize>,
    /// Facts under non-linear arithmetic (`x % y`, `x // y`, `x * y` with a fact on both
    /// sides): per-fact classes cannot make such conditions constant.
    pub(super) inexact: BTreeSet<usize>,
    /// The facts' family (`None`: te), set by the builder.
    pub(super) schema: Option<&'static attn_policy::facts::Schema>,
}

impl Collect {
    /// The family whose facts are collected.
    pub(super) fn schema(&self) -> &'static attn_policy::facts::Schema {
        self.schema.unwrap_or(&attn_policy::facts::te::TE)
    }

    /// Whether the te family's derived facts (sm, window) are folded into their inputs.
    pub(super) fn te(&self) -> bool {
        self.schema().family == "te"
    }
}

pub(crate) fn slots_under(p: &Program, id: NodeId, out: &mut Vec<usize>) {
    match p.nodes[id as usize] {
        Node::Const(_) => {}
        Node::Slot(s) => out.push(s as usize),
        Node::Not(a) | Node::IsNull(a) | Node::IsNotNull(a) | Node::IsParsed(a) | Node::Neg(a) => {
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

/// The constants an expression can take when it is a constant or an `if` whose branches are
/// (recursively) such expressions; None otherwise.
fn const_leaves(p: &Program, id: NodeId) -> Option<Vec<Value>> {
    if let Some(c) = as_const(p, id) {
        return Some(vec![c]);
    }
    match p.nodes[id as usize] {
        Node::Call {
            func: Func::If,
            start,
            len: 3,
        } => {
            let args = &p.children[start as usize..start as usize + 3];
            let mut out = const_leaves(p, args[1])?;
            out.extend(const_leaves(p, args[2])?);
            Some(out)
        }
        _ => None,
    }
}

/// `-c` for a number (other values unchanged).
fn negate(c: Value) -> Value {
    match c {
        Value::Int(i) => Value::Int(-i),
        Value::Float(x) => Value::Float(-x),
        v => v,
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
    pub(super) fn konst(&mut self, s: usize, v: Value) {
        self.consts.entry(s).or_default().push(v);
    }

    pub(super) fn walk(&mut self, p: &Program, id: NodeId) {
        match p.nodes[id as usize] {
            Node::Const(_) => {}
            Node::Slot(s) => {
                self.read.insert(s as usize);
            }
            Node::Not(a)
            | Node::IsNull(a)
            | Node::IsNotNull(a)
            | Node::IsParsed(a)
            | Node::Neg(a) => self.walk(p, a),
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
                        // A side that is a choice between constants (`if(c, 9.25.0, 9.23.0)`):
                        // each constant is a threshold of the other side, as if compared
                        // alone. Without them a class could straddle one, and an atom on a
                        // block of one class is decided at its representative.
                        for (x, other) in [(a, b), (b, a)] {
                            for c in const_leaves(p, other).unwrap_or_default() {
                                self.thresholds(p, x, c);
                            }
                        }
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
                (ArithOp::Sub, Some(k), None) => self.thresholds(p, b, vadd(negate(c), k, 1.0)),
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
                        self.thresholds(p, args[0], negate(c));
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
            Node::Neg(a) => self.thresholds(p, a, negate(c)),
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
