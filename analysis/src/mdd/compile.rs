//! Conditions of a registered program -> diagrams.
//!
//! `and` / `or` / `not` and a boolean `if` become diagram operations; every other boolean node
//! is an atom (see `atoms`). A numeric `if` inside an atom is split first:
//! `f(if(c, a, b))` is `(c and f(a)) or (not c and f(b))`, so each part reads fewer facts.
//!
//! Invariants: programs are registered once and copied ([`Mdd::program`]); splitting appends
//! nodes to the copy, never changes existing ones, so `(program, node)` keys stay valid.
//! `compiled` memoises per `(program, node)`; `atoms` per structural fingerprint of the atom,
//! so the same atom in two packs (as `diff` compiles them) is one diagram and is evaluated
//! once. An unknown constant reads false and is counted in `unknown`.

use attn_policy::eval::program::{Func, Node as PNode, NodeId, Program, Truth};

use super::manager::Mdd;
use super::store::{FALSE, HashMap, Id, Op, TRUE};

impl<'s> Mdd<'s> {
    /// Registers a program (copied: splitting atoms at their `if`s adds nodes to it).
    pub fn program(&mut self, p: &Program) -> usize {
        self.progs.push(p.clone());
        self.progs.len() - 1
    }

    /// The diagram of condition `id` of registered program `prog`.
    pub fn condition(&mut self, prog: usize, id: NodeId) -> Id {
        if let Some(&r) = self.compiled.get(&(prog, id)) {
            return r;
        }
        let kids = |m: &Self, start: u32, len: u32| {
            m.progs[prog].children[start as usize..(start + len) as usize].to_vec()
        };
        let r = match self.progs[prog].nodes[id as usize] {
            PNode::Const(v) => self.terminal(Truth::of(v)),
            PNode::Not(a) => {
                let x = self.condition(prog, a);
                self.not(x)
            }
            PNode::And { start, len } => self.fold(prog, &kids(self, start, len), Op::And),
            PNode::Or { start, len } => self.fold(prog, &kids(self, start, len), Op::Or),
            PNode::Call {
                func: Func::If,
                start,
                len: 3,
            } => {
                // In a boolean position, `if(c, a, b)` is `(c and a) or (not c and b)`.
                let k = kids(self, start, 3);
                self.ite(prog, k[0], k[1], k[2])
            }
            _ => self.atom(prog, id),
        };
        self.compiled.insert((prog, id), r);
        r
    }

    /// `and` / `or` of conditions, stopping at the first false / true.
    fn fold(&mut self, prog: usize, kids: &[NodeId], op: Op) -> Id {
        let (unit, zero) = match op {
            Op::And => (TRUE, FALSE),
            Op::Or => (FALSE, TRUE),
            Op::Diff => unreachable!("conditions fold and / or"),
        };
        let mut acc = unit;
        for &c in kids {
            let x = self.condition(prog, c);
            acc = self.apply(op, acc, x);
            if acc == zero {
                break;
            }
        }
        acc
    }

    /// `(c and a) or (not c and b)` of three conditions.
    fn ite(&mut self, prog: usize, c: NodeId, a: NodeId, b: NodeId) -> Id {
        let c = self.condition(prog, c);
        let a = self.condition(prog, a);
        let b = self.condition(prog, b);
        let ca = self.and(c, a);
        let nc = self.not(c);
        let ncb = self.and(nc, b);
        self.or(ca, ncb)
    }

    /// An atom (a comparison, `in`, a null test, a boolean fact). A numeric `if` inside it is
    /// split first: `f(if(c, a, b))` is `(c and f(a)) or (not c and f(b))`, so each part
    /// reads fewer facts (TE's per-step sequence lengths are nested `if`s over five facts).
    /// What remains is evaluated once per block of classes it tells apart.
    fn atom(&mut self, prog: usize, id: NodeId) -> Id {
        let key = self.progs[prog].fingerprint(id, false);
        if let Some(&r) = self.atoms.get(&key) {
            return r;
        }
        let r = match find_if(&self.progs[prog], id) {
            Some((at, c, a, b)) => {
                let p = &mut self.progs[prog];
                let with_a = substitute(p, id, at, a, &mut HashMap::default());
                let with_b = substitute(p, id, at, b, &mut HashMap::default());
                self.ite(prog, c, with_a, with_b)
            }
            None => self.enumerate_atom(prog, id),
        };
        self.atoms.insert(key, r);
        r
    }
}

/// The first numeric `if(c, a, b)` under `id` (pre-order): (its node, c, a, b).
fn find_if(p: &Program, id: NodeId) -> Option<(NodeId, NodeId, NodeId, NodeId)> {
    let ch = |start: u32, len: u32| &p.children[start as usize..(start + len) as usize];
    match p.nodes[id as usize] {
        PNode::Const(_) | PNode::Slot(_) => None,
        PNode::Call {
            func: Func::If,
            start,
            len: 3,
        } => {
            let k = ch(start, 3);
            Some((id, k[0], k[1], k[2]))
        }
        PNode::Not(a)
        | PNode::IsNull(a)
        | PNode::IsNotNull(a)
        | PNode::IsParsed(a)
        | PNode::Neg(a) => find_if(p, a),
        PNode::In { item, .. } => find_if(p, item),
        PNode::Cmp(_, a, b) | PNode::Arith(_, a, b) => find_if(p, a).or_else(|| find_if(p, b)),
        PNode::And { start, len } | PNode::Or { start, len } | PNode::Call { start, len, .. } => {
            ch(start, len).iter().find_map(|&c| find_if(p, c))
        }
    }
}

/// `root` with node `target` replaced by `repl` (new nodes are appended to `p`).
fn substitute(
    p: &mut Program,
    root: NodeId,
    target: NodeId,
    repl: NodeId,
    memo: &mut HashMap<NodeId, NodeId>,
) -> NodeId {
    if root == target {
        return repl;
    }
    if let Some(&r) = memo.get(&root) {
        return r;
    }
    let mut sub = |p: &mut Program, x: NodeId| substitute(p, x, target, repl, memo);
    let node = p.nodes[root as usize];
    let new = match node {
        PNode::Const(_) | PNode::Slot(_) => None,
        PNode::Not(a) => Some(PNode::Not(sub(p, a))),
        PNode::IsNull(a) => Some(PNode::IsNull(sub(p, a))),
        PNode::IsNotNull(a) => Some(PNode::IsNotNull(sub(p, a))),
        PNode::IsParsed(a) => Some(PNode::IsParsed(sub(p, a))),
        PNode::Neg(a) => Some(PNode::Neg(sub(p, a))),
        PNode::In {
            item,
            start,
            len,
            negate,
        } => Some(PNode::In {
            item: sub(p, item),
            start,
            len,
            negate,
        }),
        PNode::Cmp(op, a, b) => Some(PNode::Cmp(op, sub(p, a), sub(p, b))),
        PNode::Arith(op, a, b) => Some(PNode::Arith(op, sub(p, a), sub(p, b))),
        PNode::And { start, len } | PNode::Or { start, len } | PNode::Call { start, len, .. } => {
            let old: Vec<NodeId> = p.children[start as usize..(start + len) as usize].to_vec();
            let kids: Vec<NodeId> = old.iter().map(|&c| sub(p, c)).collect();
            if kids == old {
                None
            } else {
                let (start, len) = p.push_children(&kids);
                Some(match node {
                    PNode::And { .. } => PNode::And { start, len },
                    PNode::Or { .. } => PNode::Or { start, len },
                    PNode::Call { func, .. } => PNode::Call { func, start, len },
                    _ => unreachable!("list node"),
                })
            }
        }
    };
    let r = match new {
        Some(n) if n != node => p.push(n),
        _ => root,
    };
    memo.insert(root, r);
    r
}
