//! The variable order of a manager: which fact is tested at which level.
//!
//! Facts are placed at levels `k * SPREAD` in the order given (objects always before their
//! members, so a member's availability is decided above it); the levels in between are free
//! for relation variables (see `relations`). The order decides the diagrams' sizes, not their
//! meaning: [`Mdd::for_policies`] follows a walk of the rules so that facts one condition reads
//! together are adjacent, and two integer facts compared with each other are adjacent (their
//! ordering variable then sits next to both).
//!
//! Invariants: `level[v]` is var `v`'s level; `order[level[v]] == v`; `order[l] == usize::MAX`
//! for a free level; `used` lists the taken levels ascending; `full[l]` holds every class of
//! the var at level `l`; `ncls[v]` is var `v`'s number of classes.

use crate::space::Space;
use attn_policy::eval::program::{Func, Node as PNode, NodeId, Program};

use super::bits::Bits;
use super::manager::{Mdd, SPREAD};
use super::store::{HashMap, HashSet, NodeMemo, OpMemo, Store};

impl<'s> Mdd<'s> {
    /// A manager ordered for these packs: facts in the order a depth-first walk of the rules
    /// first meets them, rules of the backend with the most rules first. Facts one condition
    /// reads together end up adjacent, which keeps TE's FusedAttention rules (per-step
    /// sequence lengths) at ~35k nodes instead of ~300k with the most-read-first order.
    pub fn for_policies(space: &'s Space, packs: &[&attn_policy::Policy]) -> Mdd<'s> {
        let mut first = Vec::new();
        for p in packs {
            let mut count = vec![0usize; p.backends.len()];
            for r in &p.rules {
                count[r.backend as usize] += 1;
            }
            let mut rules: Vec<usize> = (0..p.rules.len()).collect();
            rules.sort_by_key(|&r| std::cmp::Reverse(count[p.rules[r].backend as usize]));
            for r in rules {
                let mut slots = Vec::new();
                slots_in_order(&p.program, p.rules[r].when.node, &mut slots);
                for s in slots {
                    for &v in &space.deps[s] {
                        if !first.contains(&v) {
                            first.push(v);
                        }
                    }
                }
            }
        }
        // Two integer facts compared with each other follow each other (with the object the
        // later one belongs to): their ordering variable then sits next to both.
        let var_of = |s: usize| space.vars.iter().position(|v| v.slot == s);
        let mut partners: Vec<Vec<usize>> = vec![Vec::new(); space.vars.len()];
        for p in packs {
            for node in &p.program.nodes {
                let PNode::Cmp(_, a, b) = *node else { continue };
                let (mut xs, mut ys) = (Vec::new(), Vec::new());
                branch_slots(space.schema, &p.program, a, &mut xs);
                branch_slots(space.schema, &p.program, b, &mut ys);
                for &x in &xs {
                    for &y in &ys {
                        if let (Some(vx), Some(vy)) = (var_of(x), var_of(y))
                            && vx != vy
                            && !partners[vx].contains(&vy)
                        {
                            partners[vx].push(vy);
                            partners[vy].push(vx);
                        }
                    }
                }
            }
        }
        let mut grouped: Vec<usize> = Vec::with_capacity(first.len());
        fn place(v: usize, space: &Space, partners: &[Vec<usize>], out: &mut Vec<usize>) {
            if out.contains(&v) {
                return;
            }
            if let Some(p) = space.vars[v].parent {
                place(p, space, partners, out);
            }
            out.push(v);
            for &w in &partners[v] {
                if !out.contains(&w) {
                    place(w, space, partners, out);
                }
            }
        }
        for &v in &first {
            place(v, space, &partners, &mut grouped);
        }
        Mdd::with_order(space, grouped)
    }

    /// A manager whose order starts with `first` (the remaining vars follow, most-read first).
    pub fn with_order(space: &'s Space, first: Vec<usize>) -> Mdd<'s> {
        let nv = space.vars.len();
        let mut by_reads: Vec<usize> = (0..nv).collect();
        by_reads.sort_by_key(|&v| (std::cmp::Reverse(space.reads[v]), v));
        // Objects come before their members.
        let mut order: Vec<usize> = Vec::with_capacity(nv);
        for v in first.into_iter().chain(by_reads) {
            let mut chain = vec![v];
            while let Some(p) = space.vars[*chain.last().expect("chain")].parent {
                chain.push(p);
            }
            for &x in chain.iter().rev() {
                if !order.contains(&x) {
                    order.push(x);
                }
            }
        }
        // Facts sit at every SPREAD-th level; relation variables take the levels just below
        // the deepest fact they read.
        let mut level = vec![0u32; nv];
        let mut by_level = vec![usize::MAX; nv * SPREAD as usize];
        let mut full = vec![Bits::empty(0); nv * SPREAD as usize];
        for (l, &v) in order.iter().enumerate() {
            let at = l as u32 * SPREAD;
            level[v] = at;
            by_level[at as usize] = v;
            full[at as usize] = Bits::full(space.vars[v].classes.len());
        }
        let used: Vec<u32> = (0..nv as u32).map(|l| l * SPREAD).collect();
        Mdd {
            space,
            store: Store::new(full.iter().map(|b| b.words().len() as u32).collect()),
            full,
            order: by_level,
            used,
            level,
            ek: Vec::new(),
            ew: Vec::new(),
            pend: Vec::new(),
            and_memo: OpMemo::default(),
            or_memo: OpMemo::default(),
            not_memo: OpMemo::default(),
            diff_memo: OpMemo::default(),
            compiled: HashMap::default(),
            atoms: HashMap::default(),
            progs: Vec::new(),
            evaluations: 0,
            unknown: 0,
            steps: 0,
            vals: Vec::new(),
            sat_dead: HashSet::default(),
            pair_memos: std::cell::Cell::new(Default::default()),
            widen_memos: std::cell::Cell::new(Default::default()),
            scratch: std::cell::Cell::new(NodeMemo::default()),
            rels: Vec::new(),
            rel_index: HashMap::default(),
            ties: Vec::new(),
            ncls: space.vars.iter().map(|v| v.classes.len()).collect(),
            member_counts: std::cell::OnceCell::new(),
            budget: usize::MAX,
            exhausted: false,
        }
    }

    /// Number of diagram vars (the space's facts, then the relation variables).
    pub fn nvars(&self) -> usize {
        self.level.len()
    }

    /// `vars` with the objects they are members of, in diagram order, without repeats.
    pub(super) fn with_objects_in_order(&self, vars: &[usize]) -> Vec<usize> {
        let mut out: Vec<usize> = Vec::new();
        for &v in vars {
            let mut v = Some(v);
            while let Some(x) = v {
                out.push(x);
                v = self.space.vars[x].parent;
            }
        }
        out.sort_by_key(|&v| self.level[v]);
        out.dedup();
        out
    }
}

/// The facts node `id` reads, in depth-first order of first appearance.
fn slots_in_order(p: &Program, id: NodeId, out: &mut Vec<usize>) {
    match p.nodes[id as usize] {
        PNode::Const(_) => {}
        PNode::Slot(s) => {
            if !out.contains(&(s as usize)) {
                out.push(s as usize);
            }
        }
        PNode::Not(a)
        | PNode::IsNull(a)
        | PNode::IsNotNull(a)
        | PNode::IsParsed(a)
        | PNode::Neg(a) => slots_in_order(p, a, out),
        PNode::In { item, .. } => slots_in_order(p, item, out),
        PNode::Cmp(_, a, b) | PNode::Arith(_, a, b) => {
            slots_in_order(p, a, out);
            slots_in_order(p, b, out);
        }
        PNode::And { start, len } | PNode::Or { start, len } | PNode::Call { start, len, .. } => {
            for &c in &p.children[start as usize..(start + len) as usize] {
                slots_in_order(p, c, out);
            }
        }
    }
}

/// The integer facts an expression can be, directly or as a branch of `if`.
fn branch_slots(
    schema: &attn_policy::facts::Schema,
    p: &Program,
    id: NodeId,
    out: &mut Vec<usize>,
) {
    match p.nodes[id as usize] {
        PNode::Slot(s) if schema.fields[s as usize].ty == attn_policy::facts::schema::Ty::Int => {
            out.push(s as usize)
        }
        PNode::Call {
            func: Func::If,
            start,
            len: 3,
        } => {
            let k = &p.children[start as usize..start as usize + 3];
            branch_slots(schema, p, k[1], out);
            branch_slots(schema, p, k[2], out);
        }
        _ => {}
    }
}
