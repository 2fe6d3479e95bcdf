//! A pack with some facts replaced by constants (the facts a matrix holds in every cell), its
//! conditions folded: what the analysis of a matrix compiles, so that its space has vars only
//! for the facts that vary (the axes and the free facts).
//!
//! A fact can also be replaced by another fact: a fact that *follows* another when its key is
//! absent (torch's `batch_k` follows `batch`) then moves with it.
//!
//! Invariant: for every input whose substituted facts have the substituted values (or equal
//! the facts they follow), every condition of the specialised pack has the value the original
//! has (substitution, then evaluation of nodes whose operands are all constants, and `and` /
//! `or` / `if` simplified by their constant operands, all with the evaluator's own semantics).

use attn_policy::Policy;
use attn_policy::eval::program::{Func, Node, NodeId, Program, Truth};
use attn_policy::facts::Value;
use attn_policy::typecheck::Compiled;

/// What a slot becomes in the specialised pack.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Subst {
    /// It stays a fact.
    Keep,
    /// A constant.
    Const(Value),
    /// Another fact (the one it follows).
    Slot(u16),
}

/// `policy` with each slot replaced as `values` says (slots past its end are kept).
pub fn specialize(policy: &Policy, values: &[Subst]) -> Policy {
    let mut p = policy.clone();
    let mut s = Specializer {
        prog: &mut p.program,
        values,
        memo: std::collections::HashMap::new(),
    };
    let mut redo = |c: &mut Compiled| c.node = s.node(c.node);
    for r in &mut p.rules {
        redo(&mut r.when);
    }
    for b in &mut p.backends {
        for v in &mut b.variants {
            if let Some(c) = &mut v.applicable {
                redo(c);
            }
        }
    }
    for e in &mut p.preference {
        if let Some(c) = &mut e.when {
            redo(c);
        }
    }
    p
}

struct Specializer<'a> {
    prog: &'a mut Program,
    values: &'a [Subst],
    memo: std::collections::HashMap<NodeId, NodeId>,
}

impl Specializer<'_> {
    fn konst(&mut self, id: NodeId) -> Option<Value> {
        match self.prog.nodes[id as usize] {
            Node::Const(v) => Some(v),
            _ => None,
        }
    }

    fn value(&mut self, v: Value) -> NodeId {
        self.prog.push(Node::Const(v))
    }

    /// The node evaluated (its operands are constants).
    fn folded(&mut self, node: Node) -> NodeId {
        let id = self.prog.push(node);
        let v = self.prog.eval(id, &[]);
        self.value(v)
    }

    fn node(&mut self, id: NodeId) -> NodeId {
        if let Some(&r) = self.memo.get(&id) {
            return r;
        }
        let node = self.prog.nodes[id as usize];
        let kids = |p: &Program, start: u32, len: u32| {
            p.children[start as usize..(start + len) as usize].to_vec()
        };
        let r = match node {
            Node::Const(_) => id,
            Node::Slot(s) => match self.values.get(s as usize).copied() {
                Some(Subst::Const(v)) => self.value(v),
                Some(Subst::Slot(t)) => self.prog.push(Node::Slot(t)),
                Some(Subst::Keep) | None => id,
            },
            Node::Not(a) => self.unary(id, a, Node::Not),
            Node::IsNull(a) => self.unary(id, a, Node::IsNull),
            Node::IsNotNull(a) => self.unary(id, a, Node::IsNotNull),
            Node::IsParsed(a) => self.unary(id, a, Node::IsParsed),
            Node::Neg(a) => self.unary(id, a, Node::Neg),
            Node::Cmp(op, a, b) => self.binary(id, a, b, |x, y| Node::Cmp(op, x, y)),
            Node::Arith(op, a, b) => self.binary(id, a, b, |x, y| Node::Arith(op, x, y)),
            Node::In {
                item,
                start,
                len,
                negate,
            } => self.unary(id, item, |x| Node::In {
                item: x,
                start,
                len,
                negate,
            }),
            Node::And { start, len } | Node::Or { start, len } => {
                let is_and = matches!(node, Node::And { .. });
                // The operand value that decides the whole (false for `and`, true for `or`).
                let decisive = if is_and { Truth::False } else { Truth::True };
                let mut out = Vec::new();
                let mut decided = false;
                for c in kids(self.prog, start, len) {
                    let k = self.node(c);
                    match self.konst(k).map(Truth::of) {
                        Some(t) if t == decisive => {
                            decided = true;
                            break;
                        }
                        // A neutral constant (true in `and`, false in `or`) drops out.
                        Some(Truth::True) | Some(Truth::False) => {}
                        _ => out.push(k),
                    }
                }
                if decided {
                    self.value(Value::Bool(!is_and))
                } else if out.is_empty() {
                    self.value(Value::Bool(is_and))
                } else if out == kids(self.prog, start, len) {
                    id
                } else {
                    let (start, len) = self.prog.push_children(&out);
                    self.prog.push(if is_and {
                        Node::And { start, len }
                    } else {
                        Node::Or { start, len }
                    })
                }
            }
            Node::Call {
                func: Func::If,
                start,
                len: 3,
            } => {
                let k = kids(self.prog, start, 3);
                let c = self.node(k[0]);
                match self.konst(c).map(Truth::of) {
                    Some(Truth::True) => self.node(k[1]),
                    Some(Truth::False) => self.node(k[2]),
                    _ => {
                        let (a, b) = (self.node(k[1]), self.node(k[2]));
                        self.list(id, &k, &[c, a, b], |start, len| Node::Call {
                            func: Func::If,
                            start,
                            len,
                        })
                    }
                }
            }
            Node::Call { func, start, len } => {
                let k = kids(self.prog, start, len);
                let new: Vec<NodeId> = k.iter().map(|&c| self.node(c)).collect();
                self.list(id, &k, &new, |start, len| Node::Call { func, start, len })
            }
        };
        self.memo.insert(id, r);
        r
    }

    fn unary(&mut self, id: NodeId, a: NodeId, make: impl Fn(NodeId) -> Node) -> NodeId {
        let x = self.node(a);
        if self.konst(x).is_some() {
            self.folded(make(x))
        } else if x == a {
            id
        } else {
            self.prog.push(make(x))
        }
    }

    fn binary(
        &mut self,
        id: NodeId,
        a: NodeId,
        b: NodeId,
        make: impl Fn(NodeId, NodeId) -> Node,
    ) -> NodeId {
        let (x, y) = (self.node(a), self.node(b));
        if self.konst(x).is_some() && self.konst(y).is_some() {
            self.folded(make(x, y))
        } else if (x, y) == (a, b) {
            id
        } else {
            self.prog.push(make(x, y))
        }
    }

    /// A node with a list of operands (`old` before, `new` after specialising them).
    fn list(
        &mut self,
        id: NodeId,
        old: &[NodeId],
        new: &[NodeId],
        make: impl Fn(u32, u32) -> Node,
    ) -> NodeId {
        if new.iter().all(|&k| self.konst(k).is_some()) {
            let (start, len) = self.prog.push_children(new);
            return self.folded(make(start, len));
        }
        if new == old {
            return id;
        }
        let (start, len) = self.prog.push_children(new);
        self.prog.push(make(start, len))
    }
}
