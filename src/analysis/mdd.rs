//! Multi-valued decision diagrams (MDDs) over the classes of a [`Space`].
//!
//! A condition of a pack is a boolean function of the classes of the space's variables. This
//! module represents such functions canonically, as reduced, ordered MDDs with one child per
//! class: a node tests one variable; equal functions are the same node. The whole pack becomes a
//! handful of diagrams (per backend "eligible", the selection, the gaps), built by `and` / `or` /
//! `not` over the diagrams of its conditions, and every analysis question is a question about a
//! diagram: "no input" is the false node, "every input" the true node, "A implies B" is
//! `A and not B == false`.
//!
//! Conditions are compiled structurally: `and` / `or` / `not` / `if` become diagram operations;
//! every other boolean node (a comparison, `in`, a null test, a boolean fact) is an *atom*,
//! evaluated once per block of classes it tells apart (its own abstraction), with the other
//! facts unassigned. Those evaluations are the "classes examined"; the diagram then covers the
//! full cross product of classes without enumerating it.
//!
//! A hand-written diagram: the BDD crates (biodivine-lib-bdd, oxidd) are boolean, and encoding
//! a variable of up to ~120 classes in bits would make the regions (sets of classes per fact)
//! hard to read back. This one is small: hash-consed nodes, memoised `and` / `or` / `not`.

use std::collections::HashMap as StdHashMap;

/// The node and operation tables are hashed millions of times: foldhash, not SipHash.
type HashMap<K, V> = StdHashMap<K, V, foldhash::fast::FixedState>;

use crate::eval::program::{Func, Node as PNode, NodeId, Program, Truth};
use crate::facts::Value;

use super::space::{Assign, Space, SpaceBuilder, slots_under};

/// A diagram node (an index into the manager's node table).
pub type Id = u32;
/// The constant false function.
pub const FALSE: Id = 0;
/// The constant true function.
pub const TRUE: Id = 1;

const TERMINAL: u32 = u32::MAX;

/// The widest distance in the variable order between two facts an atom relates on refined
/// blocks (a relation between distant facts multiplies every diagram in between).
const MAX_RELATION_SPAN: u32 = 2;

/// A set of classes of one var (bit `c` = class `c`).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Bits(Box<[u64]>);

impl Bits {
    fn empty(n: usize) -> Bits {
        Bits(vec![0; n.div_ceil(64)].into_boxed_slice())
    }

    fn full(n: usize) -> Bits {
        let mut b = Bits::empty(n);
        for c in 0..n {
            b.insert(c as u32);
        }
        b
    }

    fn insert(&mut self, c: u32) {
        self.0[(c / 64) as usize] |= 1 << (c % 64);
    }

    fn remove(&mut self, c: u32) {
        self.0[(c / 64) as usize] &= !(1 << (c % 64));
    }

    fn capacity(&self) -> usize {
        self.0.len() * 64
    }

    fn and(&self, o: &Bits) -> Option<Bits> {
        let w: Box<[u64]> = self.0.iter().zip(o.0.iter()).map(|(a, b)| a & b).collect();
        w.iter().any(|&x| x != 0).then_some(Bits(w))
    }

    fn or_with(&mut self, o: &Bits) {
        for (a, b) in self.0.iter_mut().zip(o.0.iter()) {
            *a |= b;
        }
    }

    fn meets(&self, o: &Bits) -> bool {
        self.0.iter().zip(o.0.iter()).any(|(a, b)| a & b != 0)
    }

    fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The classes in the set, ascending.
    pub fn classes(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for (i, &w) in self.0.iter().enumerate() {
            let mut w = w;
            while w != 0 {
                out.push(i as u32 * 64 + w.trailing_zeros());
                w &= w - 1;
            }
        }
        out
    }
}

/// A node: a var (by level) and a partition of its classes into edges, one per distinct
/// child, sorted by child (so equal functions have equal nodes).
#[derive(Clone, PartialEq, Eq, Hash)]
struct Node {
    level: u32,
    edges: Box<[(Id, Bits)]>,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    And,
    Or,
}

/// Per variable, a set of classes (`None`: any class). A cube of the space.
pub type Cube = Vec<Option<Bits>>;

/// The diagram manager of one space.
pub struct Mdd<'s> {
    pub space: &'s Space,
    /// Level -> var.
    order: Vec<usize>,
    /// Var -> level.
    level: Vec<u32>,
    nodes: Vec<Node>,
    /// Per level: every class of its var.
    full: Vec<Bits>,
    unique: HashMap<Node, Id>,
    apply_cache: HashMap<(Op, Id, Id), Id>,
    not_cache: HashMap<Id, Id>,
    /// Compiled conditions per (program, node).
    compiled: HashMap<(usize, NodeId), Id>,
    /// Atoms by structural fingerprint (the same atom in two programs, or rebuilt by a split).
    atoms: HashMap<String, Id>,
    progs: Vec<Program>,
    /// Atom evaluations at class representatives.
    pub evaluations: u64,
    /// Atom evaluations that stayed unknown with every fact they read assigned (read as
    /// false; a result built from them is not exact).
    pub unknown: u64,
    vals: Vec<Value>,
    /// Facts compared with other facts in atoms evaluated on coarse blocks (non-linear, or
    /// far apart in the order): results involving them are not exact.
    pub approximate: std::collections::BTreeSet<&'static str>,
    /// A reusable memo for `holds_on` / `meets` (they are called per rule per region).
    scratch: std::cell::Cell<HashMap<Id, bool>>,
    /// The most nodes the manager may create.
    pub budget: usize,
    /// The budget ran out: every result is meaningless (report INCOMPLETE).
    pub exhausted: bool,
}

impl<'s> Mdd<'s> {
    /// A manager ordered for these packs: facts in the order a depth-first walk of the rules
    /// first meets them, rules of the backend with the most rules first. Facts one condition
    /// reads together end up adjacent, which keeps TE's FusedAttention rules (per-step
    /// sequence lengths) at ~35k nodes instead of ~300k with the most-read-first order.
    pub fn for_policies(space: &'s Space, packs: &[&crate::policy::Policy]) -> Mdd<'s> {
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
        Mdd::with_order(space, first)
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
        let mut level = vec![0u32; nv];
        for (l, &v) in order.iter().enumerate() {
            level[v] = l as u32;
        }
        let terminal = |_: Id| Node {
            level: TERMINAL,
            edges: Box::new([]),
        };
        let full = order
            .iter()
            .map(|&v| Bits::full(space.vars[v].classes.len()))
            .collect();
        Mdd {
            space,
            full,
            order,
            level,
            nodes: vec![terminal(FALSE), terminal(TRUE)],
            unique: HashMap::default(),
            apply_cache: HashMap::default(),
            not_cache: HashMap::default(),
            compiled: HashMap::default(),
            atoms: HashMap::default(),
            progs: Vec::new(),
            evaluations: 0,
            unknown: 0,
            vals: Vec::new(),
            scratch: std::cell::Cell::new(HashMap::default()),
            approximate: std::collections::BTreeSet::new(),
            budget: usize::MAX,
            exhausted: false,
        }
    }

    /// Number of nodes created (a measure of the work done).
    pub fn size(&self) -> usize {
        self.nodes.len()
    }

    /// The node for `level` with these edges (merging edges to the same child).
    fn mk(&mut self, level: u32, mut edges: Vec<(Id, Bits)>) -> Id {
        edges.sort_by_key(|e| e.0);
        let mut merged: Vec<(Id, Bits)> = Vec::with_capacity(edges.len());
        for (k, b) in edges {
            if b.0.iter().all(|&w| w == 0) {
                continue;
            }
            match merged.last_mut() {
                Some(last) if last.0 == k => last.1.or_with(&b),
                _ => merged.push((k, b)),
            }
        }
        if merged.len() == 1 {
            return merged[0].0;
        }
        let node = Node {
            level,
            edges: merged.into_boxed_slice(),
        };
        if let Some(&id) = self.unique.get(&node) {
            return id;
        }
        if self.nodes.len() >= self.budget {
            // Out of budget: results from now on are meaningless, and flagged so.
            self.exhausted = true;
            return FALSE;
        }
        let id = self.nodes.len() as Id;
        self.nodes.push(node.clone());
        self.unique.insert(node, id);
        id
    }

    /// The edges of `x` seen at `level` (one edge over every class when `x` is below it).
    fn edges_at(&self, x: Id, level: u32) -> Vec<(Id, Bits)> {
        let n = &self.nodes[x as usize];
        if n.level == level {
            n.edges.to_vec()
        } else {
            vec![(x, self.full[level as usize].clone())]
        }
    }

    pub fn not(&mut self, a: Id) -> Id {
        match a {
            FALSE => return TRUE,
            TRUE => return FALSE,
            _ => {}
        }
        if let Some(&r) = self.not_cache.get(&a) {
            return r;
        }
        let level = self.nodes[a as usize].level;
        let old: Vec<(Id, Bits)> = self.nodes[a as usize].edges.to_vec();
        let edges: Vec<(Id, Bits)> = old.into_iter().map(|(k, b)| (self.not(k), b)).collect();
        let r = self.mk(level, edges);
        self.not_cache.insert(a, r);
        self.not_cache.insert(r, a);
        r
    }

    fn apply(&mut self, op: Op, a: Id, b: Id) -> Id {
        let (zero, one) = match op {
            Op::And => (FALSE, TRUE),
            Op::Or => (TRUE, FALSE),
        };
        if a == zero || b == zero {
            return zero;
        }
        if a == one || a == b {
            return b;
        }
        if b == one {
            return a;
        }
        let key = (op, a.min(b), a.max(b));
        if let Some(&r) = self.apply_cache.get(&key) {
            return r;
        }
        let level = self.nodes[a as usize]
            .level
            .min(self.nodes[b as usize].level);
        let (ea, eb) = (self.edges_at(a, level), self.edges_at(b, level));
        let mut edges = Vec::with_capacity(ea.len().max(eb.len()));
        for (x, sx) in &ea {
            for (y, sy) in &eb {
                if let Some(both) = sx.and(sy) {
                    edges.push((self.apply(op, *x, *y), both));
                }
            }
        }
        let r = self.mk(level, edges);
        self.apply_cache.insert(key, r);
        r
    }

    pub fn and(&mut self, a: Id, b: Id) -> Id {
        self.apply(Op::And, a, b)
    }

    pub fn or(&mut self, a: Id, b: Id) -> Id {
        self.apply(Op::Or, a, b)
    }

    /// `a and not b`.
    pub fn minus(&mut self, a: Id, b: Id) -> Id {
        let nb = self.not(b);
        self.and(a, nb)
    }

    /// Whether `a` implies `b` (every class where `a` holds has `b`).
    pub fn implies(&mut self, a: Id, b: Id) -> bool {
        self.minus(a, b) == FALSE
    }

    pub fn any<I: IntoIterator<Item = Id>>(&mut self, xs: I) -> Id {
        xs.into_iter().fold(FALSE, |acc, x| self.or(acc, x))
    }

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
            PNode::Const(v) => match Truth::of(v) {
                Truth::True => TRUE,
                Truth::False => FALSE,
                Truth::Unknown => {
                    self.unknown += 1;
                    FALSE
                }
            },
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

    fn enumerate_atom(&mut self, prog: usize, id: NodeId) -> Id {
        let p = &self.progs[prog];
        let mut slots = Vec::new();
        slots_under(p, id, &mut slots);
        let mut vars: Vec<usize> = Vec::new();
        for s in slots {
            for &v in &self.space.deps[s] {
                let mut v = Some(v);
                while let Some(x) = v {
                    vars.push(x);
                    v = self.space.vars[x].parent;
                }
            }
        }
        vars.sort_by_key(|&v| self.level[v]);
        vars.dedup();
        // The atom's own abstraction: classes it cannot tell apart form one block. A fact
        // compared with another fact (`max_seqlen_q > max_seqlen_kv`) has no constants of
        // its own there; it gets the whole space's interval starts, so that the two sides'
        // blocks line up (otherwise "every length above 1" would be one block on each side and
        // `>` would be evaluated once for all of them).
        let mut b = SpaceBuilder::new();
        b.root(p, id);
        let first = b.build();
        // A fact compared with another fact (`max_seqlen_q > max_seqlen_kv`) has no constants
        // of its own in the atom's abstraction: "every length above 1" would be one block on
        // each side and `>` would be evaluated once for all of them. Such facts get the whole
        // space's interval starts, so both sides' blocks line up, when the atom is linear and
        // its facts are adjacent in the order (a relation between distant facts multiplies
        // every diagram in between). Otherwise the coarse blocks stay and the facts are
        // reported as `approximate`.
        let rel_levels: Vec<u32> = vars
            .iter()
            .filter(|&&v| first.relational.contains(&self.space.vars[v].slot))
            .map(|&v| self.level[v])
            .collect();
        let span = rel_levels.iter().max().unwrap_or(&0) - rel_levels.iter().min().unwrap_or(&0);
        let refine =
            !first.relational.is_empty() && first.inexact.is_empty() && span <= MAX_RELATION_SPAN;
        if !first.relational.is_empty() && !refine {
            self.approximate.extend(
                first
                    .relational
                    .iter()
                    .map(|&s| crate::facts::schema::FIELDS[s].path),
            );
        }
        let sub = if !refine {
            first
        } else {
            let mut b = SpaceBuilder::new();
            b.root(p, id);
            for &s in &first.relational {
                let Some(v) = self.space.vars.iter().position(|x| x.slot == s) else {
                    continue;
                };
                // One start per interval (not per residue class).
                let mut starts: HashMap<usize, i64> = HashMap::default();
                for c in &self.space.vars[v].classes {
                    if let super::space::ClassDesc::Int { iv, lo, .. } = c.desc {
                        let e = starts.entry(iv).or_insert(lo);
                        *e = (*e).min(lo);
                    }
                }
                for lo in starts.into_values() {
                    b.split_at(s, Value::Int(lo));
                }
            }
            b.build()
        };
        let blocks: Vec<Vec<Vec<u32>>> = vars
            .iter()
            .map(|&v| {
                let var = &self.space.vars[v];
                let sv = sub.var_of(var.path);
                let mut groups: Vec<(usize, Vec<u32>)> = Vec::new();
                for (k, c) in var.classes.iter().enumerate() {
                    let image = sv
                        .and_then(|sv| sub.class_of(sv, c.value))
                        .map_or(usize::MAX - k, |x| x);
                    match groups.iter_mut().find(|g| g.0 == image) {
                        Some(g) => g.1.push(k as u32),
                        None => groups.push((image, vec![k as u32])),
                    }
                }
                groups.into_iter().map(|g| g.1).collect()
            })
            .collect();
        let mut assign: Assign = vec![None; self.space.vars.len()];
        self.enumerate(prog, id, &vars, &blocks, 0, &mut assign)
    }

    fn enumerate(
        &mut self,
        prog: usize,
        id: NodeId,
        vars: &[usize],
        blocks: &[Vec<Vec<u32>>],
        i: usize,
        assign: &mut Assign,
    ) -> Id {
        if i == vars.len() {
            self.evaluations += 1;
            let mut vals = std::mem::take(&mut self.vals);
            self.space.materialize(assign, &mut vals);
            let t = Truth::of(self.progs[prog].eval(id, &vals));
            self.vals = vals;
            return match t {
                Truth::True => TRUE,
                Truth::False => FALSE,
                Truth::Unknown => {
                    self.unknown += 1;
                    FALSE
                }
            };
        }
        let v = vars[i];
        if !self.space.available(assign, v) {
            // A member of an absent object: it has no value (null) and no classes.
            return self.enumerate(prog, id, vars, blocks, i + 1, assign);
        }
        let n = self.space.vars[v].classes.len();
        let mut edges = Vec::with_capacity(blocks[i].len());
        for block in &blocks[i] {
            assign[v] = Some(block[0]);
            let r = self.enumerate(prog, id, vars, blocks, i + 1, assign);
            let mut set = Bits::empty(n);
            for &c in block {
                set.insert(c);
            }
            edges.push((r, set));
        }
        assign[v] = None;
        self.mk(self.level[v], edges)
    }

    /// Whether `x` is `want` in every class of the cube.
    fn everywhere(
        &self,
        x: Id,
        cube: &[Option<Bits>],
        want: bool,
        memo: &mut HashMap<Id, bool>,
    ) -> bool {
        match x {
            TRUE => return want,
            FALSE => return !want,
            _ => {}
        }
        if let Some(&r) = memo.get(&x) {
            return r;
        }
        let n = &self.nodes[x as usize];
        let v = self.order[n.level as usize];
        let r = n.edges.iter().all(|(k, set)| {
            cube[v].as_ref().is_some_and(|c| !c.meets(set)) || self.everywhere(*k, cube, want, memo)
        });
        memo.insert(x, r);
        r
    }

    /// Whether `x` holds in every class of the cube.
    pub fn holds_on(&self, x: Id, cube: &[Option<Bits>]) -> bool {
        self.everywhere_reusing(x, cube, true)
    }

    /// Whether `x` holds in some class of the cube.
    pub fn meets(&self, x: Id, cube: &[Option<Bits>]) -> bool {
        !self.everywhere_reusing(x, cube, false)
    }

    /// [`Mdd::everywhere`] with the reusable memo.
    fn everywhere_reusing(&self, x: Id, cube: &[Option<Bits>], want: bool) -> bool {
        let mut memo = self.scratch.take();
        memo.clear();
        let r = self.everywhere(x, cube, want, &mut memo);
        self.scratch.set(memo);
        r
    }

    /// A cover of `f` by cubes: their union is exactly `f` (they may overlap). Each cube is
    /// a path of what is still uncovered, widened per var as far as it stays inside `f`, so
    /// cubes come out large (the largest regions first). At most `limit` cubes; the flag says
    /// whether the cover is complete.
    pub fn cover(&mut self, f: Id, limit: usize) -> (Vec<Cube>, bool) {
        let mut rest = f;
        let mut out = Vec::new();
        while rest != FALSE {
            if out.len() >= limit {
                return (out, false);
            }
            let mut cube = self.widest_path(rest);
            self.expand(f, &mut cube);
            let c = self.cube(&cube);
            rest = self.minus(rest, c);
            out.push(cube);
        }
        (out, true)
    }

    /// A path of `x` to true, taking at each node the edge with the most classes.
    fn widest_path(&self, mut x: Id) -> Cube {
        let mut cube = vec![None; self.space.vars.len()];
        while x > TRUE {
            let n = &self.nodes[x as usize];
            let (k, set) = n
                .edges
                .iter()
                .filter(|e| e.0 != FALSE)
                // Ties go to the lowest class, not the child's id: the cover then depends
                // only on the function, not on the order its nodes were built in.
                .max_by_key(|e| (e.1.len(), std::cmp::Reverse(e.1.classes()[0])))
                .expect("a non-false node has a non-false edge");
            cube[self.order[n.level as usize]] = Some(set.clone());
            x = *k;
        }
        cube
    }

    /// Widens `cube` inside `f`: first frees every var that can take any class (largest
    /// domains first: they read worst), then widens the rest to every class that keeps the
    /// cube inside `f`.
    fn expand(&self, f: Id, cube: &mut Cube) {
        let mut levels: Vec<usize> = (0..self.order.len())
            .filter(|&l| cube[self.order[l]].is_some())
            .collect();
        levels.sort_by_key(|&l| std::cmp::Reverse(self.full[l].len()));
        // Reused (cleared) between vars: allocating fresh tables dominated the run time.
        let (mut memo, mut inside) = (HashMap::default(), HashMap::default());
        for free_only in [true, false] {
            for &l in &levels {
                let v = self.order[l];
                if cube[v].is_none() {
                    continue;
                }
                memo.clear();
                inside.clear();
                let mut good = self.allowed(f, l as u32, cube, &mut memo, &mut inside);
                // An object whose members are constrained stays present: a member's
                // constraint cannot be written for an absent object.
                if self
                    .space
                    .vars
                    .iter()
                    .enumerate()
                    .any(|(u, x)| x.parent == Some(v) && cube[u].is_some())
                {
                    for (c, class) in self.space.vars[v].classes.iter().enumerate() {
                        if class.value == Value::Null {
                            good.remove(c as u32);
                        }
                    }
                }
                if good.len() == self.full[l].len() {
                    cube[v] = None;
                } else if !free_only {
                    cube[v] = Some(good);
                }
            }
        }
    }

    /// The classes of the var at `level` for which `cube` (with that var replaced by the
    /// class) lies inside `x`.
    fn allowed(
        &self,
        x: Id,
        level: u32,
        cube: &Cube,
        memo: &mut HashMap<Id, Bits>,
        inside: &mut HashMap<Id, bool>,
    ) -> Bits {
        let full = &self.full[level as usize];
        let n = &self.nodes[x as usize];
        if n.level > level {
            return if self.everywhere(x, cube, true, inside) {
                full.clone()
            } else {
                Bits::empty(self.space.vars[self.order[level as usize]].classes.len())
            };
        }
        if let Some(r) = memo.get(&x) {
            return r.clone();
        }
        let r = if n.level == level {
            let mut r = Bits::empty(self.space.vars[self.order[level as usize]].classes.len());
            for (k, set) in n.edges.iter() {
                if self.everywhere(*k, cube, true, inside) {
                    r.or_with(set);
                }
            }
            r
        } else {
            let v = self.order[n.level as usize];
            let mut r = full.clone();
            for (k, set) in n.edges.iter() {
                if cube[v].as_ref().is_none_or(|c| c.meets(set)) {
                    let a = self.allowed(*k, level, cube, memo, inside);
                    match r.and(&a) {
                        Some(both) => r = both,
                        None => {
                            r = Bits::empty(full.capacity());
                            break;
                        }
                    }
                }
            }
            r
        };
        memo.insert(x, r.clone());
        r
    }

    /// The diagram of a cube.
    pub fn cube(&mut self, cube: &Cube) -> Id {
        let mut x = TRUE;
        for l in (0..self.order.len()).rev() {
            if let Some(set) = &cube[self.order[l]] {
                let mut other = self.full[l].clone();
                for (w, s) in other.0.iter_mut().zip(set.0.iter()) {
                    *w &= !s;
                }
                x = self.mk(l as u32, vec![(x, set.clone()), (FALSE, other)]);
            }
        }
        x
    }

    /// An assignment inside the cube: the first class of each constrained var (for a fact
    /// compared with another fact, a class with the value already chosen for the other side,
    /// when the cube has one: the evaluations behind the diagram took both sides at their
    /// blocks' first values); free vars stay unassigned (they keep their defaults).
    pub fn example(&self, cube: &[Option<Bits>]) -> Assign {
        let mut out: Assign = vec![None; cube.len()];
        let mut chosen: Vec<Value> = Vec::new();
        for &v in &self.order {
            let Some(set) = &cube[v] else { continue };
            let classes = set.classes();
            let var = &self.space.vars[v];
            let rel = self.space.relational.contains(&var.slot);
            let c = classes
                .iter()
                .copied()
                .find(|&c| rel && chosen.contains(&var.classes[c as usize].value))
                .unwrap_or(classes[0]);
            if rel {
                chosen.push(var.classes[c as usize].value);
            }
            out[v] = Some(c);
        }
        out
    }
}

/// The diagrams of one pack's rules, applicability and preference, and per backend variant
/// where it is out (not applicable or declined). What the pack selects is computed on demand
/// *within* a region (`acc`), conjoining the small "declined" diagrams first.
pub struct PolicyDiagrams {
    /// Per rule: where it fires (false when its layer is disabled).
    pub rule: Vec<Id>,
    /// Per backend, per variant (one implicit variant when none): where it is applicable.
    pub app: Vec<Vec<Id>>,
    /// Per backend, per variant: the rules that decline it.
    pub decliners: Vec<Vec<Vec<usize>>>,
    /// Per backend, per variant: where it is not applicable or some rule declines it.
    pub variant_out: Vec<Vec<Id>>,
    /// Per preference entry: where it is the entry that applies (the first whose `when` holds).
    pub first_pref: Vec<Id>,
    /// Where no preference entry applies.
    pub no_pref: Id,
}

impl PolicyDiagrams {
    /// Builds the diagrams of `p` (its program is registered with the manager).
    pub fn build(m: &mut Mdd, p: &crate::policy::Policy) -> PolicyDiagrams {
        let prog = m.program(&p.program);
        let rule: Vec<Id> = p
            .rules
            .iter()
            .map(|r| {
                if p.layer_enabled(r.layer) {
                    m.condition(prog, r.when.node)
                } else {
                    FALSE
                }
            })
            .collect();
        let app: Vec<Vec<Id>> = p
            .backends
            .iter()
            .map(|b| {
                if b.variants.is_empty() {
                    vec![TRUE]
                } else {
                    b.variants
                        .iter()
                        .map(|v| {
                            v.applicable
                                .as_ref()
                                .map_or(TRUE, |a| m.condition(prog, a.node))
                        })
                        .collect()
                }
            })
            .collect();
        let decliners = app
            .iter()
            .enumerate()
            .map(|(b, apps)| {
                (0..apps.len())
                    .map(|v| {
                        (0..p.rules.len())
                            .filter(|&r| {
                                p.rules[r].backend as usize == b
                                    && p.rules[r].variants & (1u64 << v.min(63)) != 0
                                    && rule[r] != FALSE
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        // With the rule-walk variable order these stay small (FusedAttention ~35k nodes).
        let variant_out = app
            .iter()
            .zip(&decliners)
            .map(|(apps, decl): (&Vec<Id>, &Vec<Vec<usize>>)| {
                apps.iter()
                    .zip(decl)
                    .map(|(&a, rules)| {
                        let na = m.not(a);
                        let any = m.any(rules.iter().map(|&r| rule[r]).collect::<Vec<_>>());
                        m.or(na, any)
                    })
                    .collect()
            })
            .collect();
        let mut first_pref = Vec::with_capacity(p.preference.len());
        let mut earlier = FALSE;
        for e in &p.preference {
            let w = e.when.as_ref().map_or(TRUE, |c| m.condition(prog, c.node));
            first_pref.push(m.minus(w, earlier));
            earlier = m.or(earlier, w);
        }
        PolicyDiagrams {
            rule,
            app,
            decliners,
            variant_out,
            first_pref,
            no_pref: m.not(earlier),
        }
    }

    /// Backends with the fewest rules first: intersecting "declined" regions in this order
    /// shrinks the region the next (larger) backend's rules are intersected with.
    fn fewest_rules_first(&self, order: &[u16]) -> Vec<usize> {
        let mut out: Vec<usize> = order.iter().map(|&b| b as usize).collect();
        out.sort_by_key(|&b| self.decliners[b].iter().map(Vec::len).sum::<usize>());
        out
    }

    /// `acc and not (variant v of backend b is applicable and declined by no rule)`.
    pub fn variant_out(&self, m: &mut Mdd, b: usize, v: usize, acc: Id) -> Id {
        m.and(acc, self.variant_out[b][v])
    }

    /// `acc and not (backend b is eligible)`.
    pub fn declined_within(&self, m: &mut Mdd, b: usize, acc: Id) -> Id {
        let mut out = acc;
        for v in 0..self.app[b].len() {
            if out == FALSE {
                break;
            }
            out = self.variant_out(m, b, v, out);
        }
        out
    }

    /// `acc and (backend b is eligible)`.
    pub fn eligible_within(&self, m: &mut Mdd, b: usize, acc: Id) -> Id {
        let d = self.declined_within(m, b, acc);
        m.minus(acc, d)
    }

    /// Where, within `acc`, the pack selects nothing.
    pub fn none_within(&self, m: &mut Mdd, p: &crate::policy::Policy, acc: Id) -> Id {
        let mut out = m.and(acc, self.no_pref);
        for (i, e) in p.preference.iter().enumerate() {
            let mut part = m.and(acc, self.first_pref[i]);
            for b in self.fewest_rules_first(&e.order) {
                if part == FALSE {
                    break;
                }
                part = self.declined_within(m, b, part);
            }
            out = m.or(out, part);
        }
        out
    }

    /// Whether backend `b` is selected for some input: for some preference entry listing it,
    /// some input where that entry applies, `b` is eligible and every backend before it is
    /// declined (computed inside `b`'s eligible region, which stays small).
    pub fn selectable(&self, m: &mut Mdd, p: &crate::policy::Policy, b: usize) -> bool {
        for (i, e) in p.preference.iter().enumerate() {
            let Some(pos) = e.order.iter().position(|&x| x as usize == b) else {
                continue;
            };
            let mut acc = self.eligible_within(m, b, self.first_pref[i]);
            for earlier in self.fewest_rules_first(&e.order[..pos]) {
                if acc == FALSE {
                    break;
                }
                acc = self.declined_within(m, earlier, acc);
            }
            if acc != FALSE {
                return true;
            }
        }
        false
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
        PNode::Not(a) | PNode::IsNull(a) | PNode::IsNotNull(a) | PNode::Neg(a) => find_if(p, a),
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

/// The facts node `id` reads, in depth-first order of first appearance.
fn slots_in_order(p: &Program, id: NodeId, out: &mut Vec<usize>) {
    match p.nodes[id as usize] {
        PNode::Const(_) => {}
        PNode::Slot(s) => {
            if !out.contains(&(s as usize)) {
                out.push(s as usize);
            }
        }
        PNode::Not(a) | PNode::IsNull(a) | PNode::IsNotNull(a) | PNode::Neg(a) => {
            slots_in_order(p, a, out)
        }
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
