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

use super::cell::{Abs, cmp_for};
use super::space::{Assign, Space, SpaceBuilder, slots_under};

/// A diagram node (an index into the manager's node table).
pub type Id = u32;
/// The constant false function.
pub const FALSE: Id = 0;
/// The constant true function.
pub const TRUE: Id = 1;

const TERMINAL: u32 = u32::MAX;

/// An empty slot of the hash-consing table.
const EMPTY_SLOT: Id = u32::MAX;

fn node_hash(n: &Node) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::default().hash_one(n)
}

/// A cell whose concrete members number at most this is decided by evaluating each of them.
const BRUTE_FORCE_MEMBERS: u128 = 64;

/// Levels per fact: a fact at level `k * SPREAD`, its relation variables just below.
const SPREAD: u32 = 64;

/// A predicate's tie is decided per class of its facts when they have at most this many
/// combinations of classes (else per block of the atom's own abstraction).
const TIE_CELL_LIMIT: usize = 20_000;

/// Members enumerated per cell when looking for a member two predicates agree on.
const JOINT_MEMBERS: u128 = 4096;

/// Candidate assignments tried when looking for a region's example.
const WITNESS_TRIES: usize = 200_000;

/// A relation variable: a diagram variable that is not a fact but the truth of a condition
/// the facts' classes do not decide. It sits just below the deepest fact it reads.
#[derive(Clone, Debug)]
pub enum Rel {
    /// The ordering of two integer facts (vars `x` < `y`); classes: less, equal, greater.
    Ord { x: usize, y: usize },
    /// An atom (non-linear arithmetic, a comparison of expressions of several facts) on the
    /// cells where it is not provably constant; classes: false, true. `vars`: what it reads.
    Pred {
        prog: usize,
        node: NodeId,
        vars: Vec<usize>,
        text: String,
    },
}

/// A memo over node ids, cleared in O(1): a generation stamp per node (the traversals of
/// `cover` visit most of a large diagram once per var; hashing dominated them).
struct NodeMemo<T: Copy + Default> {
    stamp: Vec<u32>,
    val: Vec<T>,
    generation: u32,
}

impl<T: Copy + Default> Default for NodeMemo<T> {
    fn default() -> Self {
        NodeMemo {
            stamp: Vec::new(),
            val: Vec::new(),
            generation: 0,
        }
    }
}

impl<T: Copy + Default> NodeMemo<T> {
    /// Forgets every entry; sized for `nodes` nodes.
    fn clear(&mut self, nodes: usize) {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.stamp.fill(0);
            self.generation = 1;
        }
        if self.stamp.len() < nodes {
            self.stamp.resize(nodes, 0);
            self.val.resize(nodes, T::default());
        }
    }

    fn get(&self, x: Id) -> Option<T> {
        (self.stamp[x as usize] == self.generation).then(|| self.val[x as usize])
    }

    fn set(&mut self, x: Id, v: T) {
        self.stamp[x as usize] = self.generation;
        self.val[x as usize] = v;
    }
}

/// A set of classes of one var (bit `c` = class `c`).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Bits(Words);

/// Words of a class set: inline up to 192 classes (every fact but the longest integer
/// ones), so the diagram operations copy sets without allocating.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum Words {
    Inline(u8, [u64; INLINE_WORDS]),
    Heap(Box<[u64]>),
}

const INLINE_WORDS: usize = 3;

impl Bits {
    fn empty(n: usize) -> Bits {
        let words = n.div_ceil(64);
        Bits(if words <= INLINE_WORDS {
            Words::Inline(words as u8, [0; INLINE_WORDS])
        } else {
            Words::Heap(vec![0; words].into_boxed_slice())
        })
    }

    fn words(&self) -> &[u64] {
        match &self.0 {
            Words::Inline(n, w) => &w[..*n as usize],
            Words::Heap(w) => w,
        }
    }

    fn words_mut(&mut self) -> &mut [u64] {
        match &mut self.0 {
            Words::Inline(n, w) => &mut w[..*n as usize],
            Words::Heap(w) => w,
        }
    }

    fn full(n: usize) -> Bits {
        let mut b = Bits::empty(n);
        for c in 0..n {
            b.insert(c as u32);
        }
        b
    }

    fn insert(&mut self, c: u32) {
        self.words_mut()[(c / 64) as usize] |= 1 << (c % 64);
    }

    fn remove(&mut self, c: u32) {
        self.words_mut()[(c / 64) as usize] &= !(1 << (c % 64));
    }

    fn capacity(&self) -> usize {
        self.words().len() * 64
    }

    fn is_empty(&self) -> bool {
        self.words().iter().all(|&w| w == 0)
    }

    fn and(&self, o: &Bits) -> Option<Bits> {
        let mut r = self.clone();
        for (a, b) in r.words_mut().iter_mut().zip(o.words()) {
            *a &= b;
        }
        (!r.is_empty()).then_some(r)
    }

    /// `self` without the classes of `o`.
    fn minus(&self, o: &Bits) -> Bits {
        let mut r = self.clone();
        for (a, b) in r.words_mut().iter_mut().zip(o.words()) {
            *a &= !b;
        }
        r
    }

    fn or_with(&mut self, o: &Bits) {
        for (a, b) in self.words_mut().iter_mut().zip(o.words()) {
            *a |= b;
        }
    }

    fn meets(&self, o: &Bits) -> bool {
        self.words().iter().zip(o.words()).any(|(a, b)| a & b != 0)
    }

    fn len(&self) -> usize {
        self.words().iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The classes in the set, ascending.
    pub fn classes(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for (i, &w) in self.words().iter().enumerate() {
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

/// What `Mdd::per_interval_pair` builds a leaf from: the blocks' representatives and the
/// orderings the pair of intervals allows (None: a side is null or absent).
type PairLeaf<'a, 's> = dyn FnMut(&mut Mdd<'s>, &Assign, Option<[bool; 3]>) -> Id + 'a;

/// The fixed inputs of one region's example search (`Mdd::example`).
struct Witness<'a> {
    /// Relation variables and the classes the region allows them.
    lits: &'a [(usize, Vec<u32>)],
    /// Per search depth, the literals (indices into `lits`) whose facts are all chosen there.
    due: &'a [Vec<usize>],
    /// The facts to choose, in diagram order.
    involved: &'a [usize],
    cube: &'a [Option<Bits>],
    tries: &'a mut usize,
}

/// Per variable, a set of classes (`None`: any class). A cube of the space.
pub type Cube = Vec<Option<Bits>>;

/// The diagram manager of one space.
pub struct Mdd<'s> {
    pub space: &'s Space,
    /// Level -> var (`usize::MAX`: an unused level).
    order: Vec<usize>,
    /// The levels in use, ascending.
    used: Vec<u32>,
    /// Var -> level.
    level: Vec<u32>,
    nodes: Vec<Node>,
    /// Per level: every class of its var.
    full: Vec<Bits>,
    /// Hash-consing: open addressing over node ids (a node is stored once, in `nodes`).
    unique: Vec<Id>,
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
    /// Relation variables (diagram var `space.vars.len() + k` is `rels[k]`).
    pub rels: Vec<Rel>,
    rel_index: HashMap<String, usize>,
    /// Per relation variable, where its value agrees with the facts: the orderings a pair of
    /// intervals allows; a predicate's value on the cells that decide it. Results are
    /// intersected with the ties of the variables they read before they are listed.
    ties: Vec<Option<Id>>,
    /// Per diagram var: its number of classes.
    ncls: Vec<usize>,
    /// Facts read by atoms some cell of which could not be decided exactly (evaluated at a
    /// A reusable memo for `holds_on` / `meets` (they are called per rule per region).
    scratch: std::cell::Cell<NodeMemo<bool>>,
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
        let terminal = |_: Id| Node {
            level: TERMINAL,
            edges: Box::new([]),
        };
        Mdd {
            space,
            full,
            order: by_level,
            used,
            level,
            nodes: vec![terminal(FALSE), terminal(TRUE)],
            unique: vec![EMPTY_SLOT; 1 << 16],
            apply_cache: HashMap::default(),
            not_cache: HashMap::default(),
            compiled: HashMap::default(),
            atoms: HashMap::default(),
            progs: Vec::new(),
            evaluations: 0,
            unknown: 0,
            vals: Vec::new(),
            scratch: std::cell::Cell::new(NodeMemo::default()),
            rels: Vec::new(),
            rel_index: HashMap::default(),
            ties: Vec::new(),
            ncls: space.vars.iter().map(|v| v.classes.len()).collect(),
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
        edges.retain(|e| !e.1.is_empty());
        edges.sort_by_key(|e| e.0);
        // Merge edges to the same child (in place).
        let mut w = 0;
        for r in 0..edges.len() {
            if w > 0 && edges[w - 1].0 == edges[r].0 {
                let b = edges[r].1.clone();
                edges[w - 1].1.or_with(&b);
            } else {
                edges.swap(w, r);
                w += 1;
            }
        }
        edges.truncate(w);
        if edges.len() == 1 {
            return edges[0].0;
        }
        let node = Node {
            level,
            edges: edges.into_boxed_slice(),
        };
        let mask = self.unique.len() - 1;
        let mut i = node_hash(&node) as usize & mask;
        while self.unique[i] != EMPTY_SLOT {
            let id = self.unique[i];
            if self.nodes[id as usize] == node {
                return id;
            }
            i = (i + 1) & mask;
        }
        if self.nodes.len() >= self.budget {
            // Out of budget: results from now on are meaningless, and flagged so.
            self.exhausted = true;
            return FALSE;
        }
        let id = self.nodes.len() as Id;
        self.nodes.push(node);
        self.unique[i] = id;
        if self.nodes.len() * 2 > self.unique.len() {
            self.grow_unique();
        }
        id
    }

    /// Doubles the hash-consing table (rehashing every node).
    fn grow_unique(&mut self) {
        let size = self.unique.len() * 2;
        let mut table = vec![EMPTY_SLOT; size];
        for (id, node) in self.nodes.iter().enumerate().skip(2) {
            let mut i = node_hash(node) as usize & (size - 1);
            while table[i] != EMPTY_SLOT {
                i = (i + 1) & (size - 1);
            }
            table[i] = id as Id;
        }
        self.unique = table;
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
        // Edges by index (a node below `level` is one edge over every class, `None`):
        // copying the edge lists dominated the allocator's time.
        let count = |m: &Self, x: Id| {
            let n = &m.nodes[x as usize];
            if n.level == level { n.edges.len() } else { 1 }
        };
        let edge = |m: &Self, x: Id, i: usize| {
            let n = &m.nodes[x as usize];
            if n.level == level {
                (n.edges[i].0, Some(n.edges[i].1.clone()))
            } else {
                (x, None)
            }
        };
        let (na, nb) = (count(self, a), count(self, b));
        let mut edges = Vec::with_capacity(na.max(nb));
        for i in 0..na {
            let (x, sx) = edge(self, a, i);
            for j in 0..nb {
                let (y, sy) = edge(self, b, j);
                let both = match (&sx, sy) {
                    (Some(p), Some(q)) => p.and(&q),
                    (Some(p), None) => Some(p.clone()),
                    (None, Some(q)) => Some(q),
                    (None, None) => Some(self.full[level as usize].clone()),
                };
                if let Some(both) = both {
                    edges.push((self.apply(op, x, y), both));
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
        let vars = self.atom_vars(prog, id);
        // The atom's own abstraction: classes it cannot tell apart form one block.
        let mut b = SpaceBuilder::new();
        b.root(&self.progs[prog], id);
        let own = b.build();
        if own.relational.is_empty() && own.inexact.is_empty() {
            // Constant on every block of its own abstraction: one evaluation per block.
            let blocks = self.blocks_of(&vars, &own, &[]);
            return self.enumerate(&vars, &blocks, &mut |m, a, _| m.eval_leaf(prog, id, a));
        }
        // A comparison between facts, or non-linear arithmetic: per-fact classes do not
        // decide it everywhere. Where they do not, the diagram tests a relation variable.
        if let Some(r) = self.ord_atom(prog, id, &vars) {
            return r;
        }
        self.predicate_atom(prog, id, &vars, &own)
    }

    /// The vars an atom reads (with their objects), in diagram order.
    fn atom_vars(&self, prog: usize, id: NodeId) -> Vec<usize> {
        let mut slots = Vec::new();
        slots_under(&self.progs[prog], id, &mut slots);
        let deps: Vec<usize> = slots
            .into_iter()
            .flat_map(|s| self.space.deps[s].iter().copied())
            .collect();
        self.with_objects_in_order(&deps)
    }

    /// `vars` with the objects they are members of, in diagram order, without repeats.
    fn with_objects_in_order(&self, vars: &[usize]) -> Vec<usize> {
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

    /// Per var, its classes grouped into the blocks `own` (an atom's abstraction) tells
    /// apart; vars in `per_class` get one block per class.
    fn blocks_of(&self, vars: &[usize], own: &Space, per_class: &[usize]) -> Vec<Vec<Vec<u32>>> {
        vars.iter()
            .map(|&v| {
                let var = &self.space.vars[v];
                if per_class.contains(&v) {
                    return (0..var.classes.len() as u32).map(|c| vec![c]).collect();
                }
                let sv = own.var_of(var.path);
                let mut groups: Vec<(usize, Vec<u32>)> = Vec::new();
                for (k, c) in var.classes.iter().enumerate() {
                    let image = sv
                        .and_then(|sv| own.class_of(sv, c.value))
                        .map_or(usize::MAX - k, |x| x);
                    match groups.iter_mut().find(|g| g.0 == image) {
                        Some(g) => g.1.push(k as u32),
                        None => groups.push((image, vec![k as u32])),
                    }
                }
                groups.into_iter().map(|g| g.1).collect()
            })
            .collect()
    }

    /// The atom's value at the blocks' representatives.
    fn eval_leaf(&mut self, prog: usize, id: NodeId, assign: &Assign) -> Id {
        self.evaluations += 1;
        let mut vals = std::mem::take(&mut self.vals);
        self.space.materialize(assign, &mut vals);
        let t = Truth::of(self.progs[prog].eval(id, &vals));
        self.vals = vals;
        match t {
            Truth::True => TRUE,
            Truth::False => FALSE,
            Truth::Unknown => {
                self.unknown += 1;
                FALSE
            }
        }
    }

    /// The diagram over `vars` (one edge per block) whose leaves `leaf` builds from the
    /// blocks' representatives and the block index per var (`usize::MAX`: the var's object
    /// is absent).
    fn enumerate(
        &mut self,
        vars: &[usize],
        blocks: &[Vec<Vec<u32>>],
        leaf: &mut dyn FnMut(&mut Self, &Assign, &[usize]) -> Id,
    ) -> Id {
        let mut assign: Assign = vec![None; self.space.vars.len()];
        let mut cell = vec![usize::MAX; vars.len()];
        self.enumerate_from(vars, blocks, 0, &mut assign, &mut cell, leaf)
    }

    fn enumerate_from(
        &mut self,
        vars: &[usize],
        blocks: &[Vec<Vec<u32>>],
        i: usize,
        assign: &mut Assign,
        cell: &mut Vec<usize>,
        leaf: &mut dyn FnMut(&mut Self, &Assign, &[usize]) -> Id,
    ) -> Id {
        if i == vars.len() {
            return leaf(self, assign, cell);
        }
        let v = vars[i];
        if !self.space.available(assign, v) {
            // A member of an absent object: it has no value (null) and no classes.
            return self.enumerate_from(vars, blocks, i + 1, assign, cell, leaf);
        }
        let n = self.ncls[v];
        let mut edges = Vec::with_capacity(blocks[i].len());
        for (k, block) in blocks[i].iter().enumerate() {
            assign[v] = Some(block[0]);
            cell[i] = k;
            let r = self.enumerate_from(vars, blocks, i + 1, assign, cell, leaf);
            let mut set = Bits::empty(n);
            for &c in block {
                set.insert(c);
            }
            edges.push((r, set));
        }
        assign[v] = None;
        cell[i] = usize::MAX;
        self.mk(self.level[v], edges)
    }

    /// Relation variable `k` restricted to classes `set` as (the facts it relates, an
    /// expression over them); None when `set` does not constrain it.
    pub fn rel_constraint(
        &self,
        k: usize,
        set: &[u32],
        cube: &[Option<Bits>],
    ) -> Option<(String, String)> {
        let path = |v: usize| self.space.vars[v].path;
        match &self.rels[k] {
            Rel::Ord { x, y } => {
                let op = match set {
                    [0] => "<",
                    [1] => "==",
                    [2] => ">",
                    [0, 1] => "<=",
                    [1, 2] => ">=",
                    [0, 2] => "!=",
                    _ => return None,
                };
                let (px, py) = (path(*x), path(*y));
                let mut text = format!("{px} {op} {py}");
                // Where a side is null no diagram tests the ordering: such inputs are in.
                let nulls: Vec<String> = [*x, *y]
                    .into_iter()
                    .filter(|&v| self.may_be_null(v, cube))
                    .map(|v| format!("{} == null", path(v)))
                    .collect();
                if !nulls.is_empty() {
                    text = format!("{} or {text}", nulls.join(" or "));
                }
                Some((format!("{px}, {py}"), text))
            }
            Rel::Pred { vars, text, .. } => {
                // Keyed by the facts it reads (objects left out: their members name them).
                let key: Vec<&str> = vars
                    .iter()
                    .filter(|&&v| !self.space.vars.iter().any(|u| u.parent == Some(v)))
                    .map(|&v| path(v))
                    .collect();
                let text = match set {
                    [1] => text.clone(),
                    [0] => format!("not ({text})"),
                    _ => return None,
                };
                Some((key.join(", "), text))
            }
        }
    }

    /// Whether var `v` (or its object) may be null inside the cube.
    fn may_be_null(&self, v: usize, cube: &[Option<Bits>]) -> bool {
        let null_in = |u: usize| {
            let classes = &self.space.vars[u].classes;
            (0..classes.len()).any(|c| {
                classes[c].value == Value::Null
                    && cube[u]
                        .as_ref()
                        .is_none_or(|s| s.classes().contains(&(c as u32)))
            })
        };
        null_in(v) || self.space.vars[v].parent.is_some_and(null_in)
    }

    /// Number of diagram vars (the space's facts, then the relation variables).
    pub fn nvars(&self) -> usize {
        self.level.len()
    }

    /// Adds a relation variable at the bottom of the order (no existing node lies below it,
    /// so every node built so far stays ordered).
    fn add_rel(&mut self, key: String, rel: Rel, classes: usize, below: &[usize]) -> usize {
        let v = self.level.len();
        // The first free level below the deepest of `below` (else a new one at the bottom).
        let deepest = below.iter().map(|&u| self.level[u]).max().unwrap_or(0);
        let free = (deepest + 1..(deepest / SPREAD + 1) * SPREAD)
            .find(|&l| self.order.get(l as usize) == Some(&usize::MAX));
        let at = match free {
            Some(l) => l,
            None => {
                self.order.push(usize::MAX);
                self.full.push(Bits::empty(0));
                self.order.len() as u32 - 1
            }
        };
        self.rel_index.insert(key, self.rels.len());
        self.rels.push(rel);
        self.ties.push(None);
        self.level.push(at);
        self.order[at as usize] = v;
        self.full[at as usize] = Bits::full(classes);
        self.ncls.push(classes);
        let pos = self.used.partition_point(|&l| l < at);
        self.used.insert(pos, at);
        v
    }

    /// The node testing relation variable `v`: class `c` leads to `to[c]`.
    fn rel_node(&mut self, v: usize, to: &[Id]) -> Id {
        let edges = to
            .iter()
            .enumerate()
            .map(|(c, &k)| {
                let mut b = Bits::empty(to.len());
                b.insert(c as u32);
                (k, b)
            })
            .collect();
        self.mk(self.level[v], edges)
    }

    /// The var holding integer fact `slot` itself (not a derived fact).
    fn plain_int_var(&self, slot: usize) -> Option<usize> {
        if self.space.schema.fields[slot].ty != crate::facts::schema::Ty::Int {
            return None;
        }
        self.space.vars.iter().position(|v| v.slot == slot)
    }

    /// `x < y`-style atoms between two integer facts, decided by the ordering variable of
    /// the pair. Per pair of classes only some orderings have members (`a in 1..4` is below
    /// `b in 9..12`); an impossible ordering leads where a possible one does ("canonical"),
    /// so every diagram takes the same value on it and no result rests on an ordering no
    /// input has: a path to true always holds an input.
    fn ord_atom(&mut self, prog: usize, id: NodeId, vars: &[usize]) -> Option<Id> {
        let p = &self.progs[prog];
        let PNode::Cmp(op, a, b) = p.nodes[id as usize] else {
            return None;
        };
        let (PNode::Slot(sa), PNode::Slot(sb)) = (p.nodes[a as usize], p.nodes[b as usize]) else {
            return None;
        };
        let (va, vb) = (
            self.plain_int_var(sa as usize)?,
            self.plain_int_var(sb as usize)?,
        );
        if va == vb {
            return None;
        }
        let (x, y, op) = if va < vb {
            (va, vb, op)
        } else {
            (vb, va, flip(op))
        };
        let r = self.ord_var(x, y);
        Some(
            self.per_interval_pair(vars, x, y, &mut |m, asg, possible| match possible {
                Some(possible) => {
                    let to: Vec<Id> = (0..3)
                        .map(|o| {
                            let o = canonical(&possible, o);
                            if cmp_for(op, o) { TRUE } else { FALSE }
                        })
                        .collect();
                    m.rel_node(r, &to)
                }
                // A null side: the comparison is false, whatever the other side.
                None => m.eval_leaf(prog, id, asg),
            }),
        )
    }

    /// The diagram over `vars` (which hold `x` and `y`) built per pair of intervals of `x`
    /// and `y` from the orderings their members allow (None: a side is null or absent).
    /// Per interval, not per residue class: residues could only rule out "equal", and
    /// splitting by them multiplies every diagram reading the pair by the moduli.
    fn per_interval_pair(
        &mut self,
        vars: &[usize],
        x: usize,
        y: usize,
        leaf: &mut PairLeaf<'_, 's>,
    ) -> Id {
        let blocks: Vec<Vec<Vec<u32>>> = vars.iter().map(|&v| self.interval_blocks(v)).collect();
        let (ix, iy) = (
            vars.iter().position(|&v| v == x).expect("x is read"),
            vars.iter().position(|&v| v == y).expect("y is read"),
        );
        self.enumerate(vars, &blocks, &mut |m, asg, cell| {
            let range = |m: &Self, i: usize, v: usize| {
                (cell[i] != usize::MAX)
                    .then(|| m.interval_hull(v, &blocks[i][cell[i]]))
                    .flatten()
            };
            let possible = match (range(m, ix, x), range(m, iy, y)) {
                (Some(rx), Some(ry)) => Some(member_orderings(rx, ry)),
                _ => None,
            };
            leaf(m, asg, possible)
        })
    }

    /// The smallest and largest members of some integer classes of var `v`, as a
    /// progression of step 1 (None: a class is not an integer class).
    fn interval_hull(&self, v: usize, classes: &[u32]) -> Option<(i64, i64, i64)> {
        let mut acc: Option<(i64, i64)> = None;
        for &c in classes {
            let (first, last, _) = self.space.int_members(v, c)?;
            acc = Some(acc.map_or((first, last), |(lo, hi)| (lo.min(first), hi.max(last))));
        }
        acc.map(|(lo, hi)| (lo, hi, 1))
    }

    /// A var's classes grouped by integer interval (other classes alone).
    fn interval_blocks(&self, v: usize) -> Vec<Vec<u32>> {
        let mut groups: Vec<(Option<usize>, Vec<u32>)> = Vec::new();
        for (c, class) in self.space.vars[v].classes.iter().enumerate() {
            let key = match class.desc {
                super::space::ClassDesc::Int { iv, .. } => Some(iv),
                _ => None,
            };
            match groups.iter_mut().find(|g| key.is_some() && g.0 == key) {
                Some(g) => g.1.push(c as u32),
                None => groups.push((key, vec![c as u32])),
            }
        }
        groups.into_iter().map(|g| g.1).collect()
    }

    /// The ordering variable of vars `x < y` (placed just below the deeper of the two).
    fn ord_var(&mut self, x: usize, y: usize) -> usize {
        let key = format!("ord {x} {y}");
        if let Some(&k) = self.rel_index.get(&key) {
            return self.space.vars.len() + k;
        }
        self.add_rel(key, Rel::Ord { x, y }, 3, &[x, y])
    }

    /// The tie of relation variable `v` (built on first use: only listed paths need it):
    /// where its value agrees with the facts. An ordering: the orderings each pair of
    /// intervals allows. A predicate: its value on every cell that decides it, cells being
    /// the classes of its facts (when their combinations are few; else its blocks).
    fn tie(&mut self, r: usize) -> Id {
        let k = r - self.space.vars.len();
        if let Some(t) = self.ties[k] {
            return t;
        }
        let t = match self.rels[k].clone() {
            Rel::Ord { x, y } => self.ord_tie(r, x, y),
            Rel::Pred {
                prog, node, vars, ..
            } => {
                let mut b = SpaceBuilder::new();
                b.root(&self.progs[prog], node);
                let own = b.build();
                let cells = vars
                    .iter()
                    .map(|&v| self.ncls[v])
                    .fold(1usize, |a, n| a.saturating_mul(n));
                let per_class: &[usize] = if cells <= TIE_CELL_LIMIT { &vars } else { &[] };
                let blocks = self.blocks_of(&vars, &own, per_class);
                self.enumerate(&vars, &blocks, &mut |m, asg, cell| match m
                    .decide_cell(prog, node, &vars, &blocks, asg, cell)
                {
                    Some(b) => m.rel_node(
                        r,
                        &[if b { FALSE } else { TRUE }, if b { TRUE } else { FALSE }],
                    ),
                    None => TRUE,
                })
            }
        };
        self.ties[k] = Some(t);
        t
    }

    /// The orderings of `x`, `y` that each pair of their intervals allows.
    fn ord_tie(&mut self, r: usize, x: usize, y: usize) -> Id {
        let vars = self.with_objects_in_order(&[x, y]);
        self.per_interval_pair(&vars, x, y, &mut |m, _, possible| match possible {
            Some(possible) => m.rel_node(r, &possible.map(|ok| if ok { TRUE } else { FALSE })),
            None => TRUE,
        })
    }

    /// An atom the facts' classes do not decide everywhere (non-linear arithmetic, a
    /// comparison of expressions of several facts): decided per block of its own abstraction
    /// where provably constant; elsewhere the diagram tests the atom's predicate variable
    /// (placed just below the deepest fact it reads), so no block is decided by a guess.
    fn predicate_atom(&mut self, prog: usize, id: NodeId, vars: &[usize], own: &Space) -> Id {
        let blocks = self.blocks_of(vars, own, &[]);
        let mut decided: Vec<Option<bool>> = Vec::new();
        self.enumerate(vars, &blocks, &mut |m, asg, cell| {
            decided.push(m.decide_cell(prog, id, vars, &blocks, asg, cell));
            FALSE
        });
        let undecided = decided.iter().any(Option::is_none);
        let r = undecided.then(|| {
            let text = self.progs[prog].render(id, self.space.schema);
            let key = format!("pred {}", self.progs[prog].fingerprint(id, false));
            let rel = Rel::Pred {
                prog,
                node: id,
                vars: vars.to_vec(),
                text,
            };
            self.add_rel(key, rel, 2, vars)
        });
        let mut it = decided.iter();
        self.enumerate(
            vars,
            &blocks,
            &mut |m, _, _| match it.next().copied().flatten() {
                Some(true) => TRUE,
                Some(false) => FALSE,
                None => m.rel_node(r.expect("a predicate variable"), &[FALSE, TRUE]),
            },
        )
    }

    /// Whether atom `id` is constant on a cell (per var, the classes of its block), and its
    /// value there; None when it is not, or not provably so.
    fn decide_cell(
        &mut self,
        prog: usize,
        id: NodeId,
        vars: &[usize],
        blocks: &[Vec<Vec<u32>>],
        asg: &Assign,
        cell: &[usize],
    ) -> Option<bool> {
        // Intervals and congruences first (cheap); undecided small cells are then
        // decided member by member.
        self.evaluations += 1;
        // Every fact's value is needed only for derived facts (`sm` -> compute capability).
        let all = std::cell::OnceCell::new();
        let single = |i: usize| {
            cell[i] == usize::MAX
                || (blocks[i][cell[i]].len() == 1
                    && self
                        .space
                        .int_members(vars[i], blocks[i][cell[i]][0])
                        .is_none_or(|(f, l, _)| f == l))
        };
        let fact = |s: usize| -> Abs {
            let deps = &self.space.deps[s];
            let pos = |v: usize| vars.iter().position(|&u| u == v);
            let plain = deps.last().filter(|&&v| self.space.vars[v].slot == s);
            if deps.iter().all(|&v| pos(v).is_none_or(single)) {
                return Abs::Exact(match (deps.is_empty(), plain) {
                    (true, _) => self.space.default_value(s),
                    (false, Some(&v)) => self.space.value_of(asg, v),
                    (false, None) => all.get_or_init(|| {
                        let mut vals = Vec::new();
                        self.space.materialize(asg, &mut vals);
                        vals
                    })[s],
                });
            }
            match plain {
                Some(&v) => match pos(v) {
                    Some(i) if cell[i] == usize::MAX => Abs::Exact(Value::Null),
                    Some(i) => self.hull(v, &blocks[i][cell[i]]),
                    None => Abs::Any,
                },
                None => Abs::Any,
            }
        };
        let t = super::cell::eval(&self.progs[prog], id, &fact).truth();
        if t.is_some() {
            return t;
        }
        // Small cells: every concrete member.
        let mut members: Vec<Vec<(u32, Option<i64>)>> = Vec::with_capacity(vars.len());
        let mut count: u128 = 1;
        let mut enumerable = true;
        for (i, &v) in vars.iter().enumerate() {
            if cell[i] == usize::MAX {
                members.push(Vec::new());
                continue;
            }
            let mut ms = Vec::new();
            for &c in &blocks[i][cell[i]] {
                match self.space.int_members(v, c) {
                    Some((first, last, step)) => {
                        let n = ((last - first) / step) as u128 + 1;
                        if n > BRUTE_FORCE_MEMBERS {
                            enumerable = false;
                            break;
                        }
                        ms.extend((0..n as i64).map(|k| (c, Some(first + k * step))));
                    }
                    None => {
                        if let super::space::ClassDesc::Ordered { lo, hi } =
                            &self.space.vars[v].classes[c as usize].desc
                            && lo != hi
                        {
                            enumerable = false;
                            break;
                        }
                        ms.push((c, None));
                    }
                }
            }
            count = count.saturating_mul(ms.len().max(1) as u128);
            if !enumerable || count > BRUTE_FORCE_MEMBERS {
                enumerable = false;
                break;
            }
            members.push(ms);
        }
        if enumerable {
            let mut seen = [false, false];
            let mut idx = vec![0usize; vars.len()];
            let mut a = asg.clone();
            let mut values: Vec<(usize, Value)> = Vec::new();
            let mut vals = std::mem::take(&mut self.vals);
            loop {
                values.clear();
                for (i, &v) in vars.iter().enumerate() {
                    if let Some(&(c, x)) = members[i].get(idx[i]) {
                        a[v] = Some(c);
                        if let Some(x) = x {
                            values.push((v, Value::Int(x)));
                        }
                    }
                }
                self.evaluations += 1;
                self.space.materialize_with(&a, &values, &mut vals);
                match Truth::of(self.progs[prog].eval(id, &vals)) {
                    Truth::True => seen[1] = true,
                    Truth::False => seen[0] = true,
                    Truth::Unknown => {
                        self.unknown += 1;
                        seen[0] = true;
                    }
                }
                if !next_combination(&mut idx, &members) || (seen[0] && seen[1]) {
                    break;
                }
            }
            self.vals = vals;
            return match seen {
                [true, true] => None,
                [_, t] => Some(t),
            };
        }
        None
    }

    /// The abstract value of var `v` over some of its classes.
    fn hull(&self, v: usize, classes: &[u32]) -> Abs {
        let var = &self.space.vars[v];
        let mut acc: Option<(i64, i64, i64, i64)> = None;
        for &c in classes {
            let Some((first, last, step)) = self.space.int_members(v, c) else {
                return if classes.len() == 1 && var.classes[c as usize].value == Value::Null {
                    Abs::Exact(Value::Null)
                } else if classes.len() == 1
                    && !matches!(
                        var.classes[c as usize].desc,
                        super::space::ClassDesc::Ordered { .. }
                    )
                {
                    Abs::Exact(var.classes[c as usize].value)
                } else {
                    Abs::Any
                };
            };
            let r = first.rem_euclid(step);
            acc = Some(match acc {
                None => (first, last, r, step),
                Some((lo, hi, r0, m)) => {
                    let g = gcd(m, (r - r0).abs());
                    (lo.min(first), hi.max(last), r0, if g == 0 { m } else { g })
                }
            });
        }
        match acc {
            Some((lo, hi, r, m)) => Abs::int(lo, hi, r, m),
            None => Abs::Any,
        }
    }

    /// Whether `x` is `want` in every class of the cube.
    fn everywhere(
        &self,
        x: Id,
        cube: &[Option<Bits>],
        want: bool,
        memo: &mut NodeMemo<bool>,
    ) -> bool {
        match x {
            TRUE => return want,
            FALSE => return !want,
            _ => {}
        }
        if let Some(r) = memo.get(x) {
            return r;
        }
        let n = &self.nodes[x as usize];
        let v = self.order[n.level as usize];
        let r = n.edges.iter().all(|(k, set)| {
            cube.get(v)
                .and_then(Option::as_ref)
                .is_some_and(|c| !c.meets(set))
                || self.everywhere(*k, cube, want, memo)
        });
        memo.set(x, r);
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
        memo.clear(self.nodes.len());
        let r = self.everywhere(x, cube, want, &mut memo);
        self.scratch.set(memo);
        r
    }

    /// A cover of `f` by cubes: their union is exactly `f` (they may overlap). Each cube is
    /// a path of what is still uncovered, widened per var as far as it stays inside `f`, so
    /// cubes come out large (the largest regions first). At most `limit` cubes; the flag says
    /// whether the cover is complete.
    pub fn cover(&mut self, f: Id, limit: usize) -> (Vec<Cube>, bool) {
        self.cover_within(f, limit, false)
    }

    /// A cover of `f` by disjoint cubes (each widened only inside what is still uncovered).
    pub fn cover_disjoint(&mut self, f: Id, limit: usize) -> (Vec<Cube>, bool) {
        self.cover_within(f, limit, true)
    }

    fn cover_within(&mut self, f: Id, limit: usize, disjoint: bool) -> (Vec<Cube>, bool) {
        let nv = self.space.vars.len();
        // Paths must hold an input: a relation variable on a path is first tied to the facts
        // (its tie is intersected with what is left), lazily, as paths meet it; intersecting
        // every tie up front made the gaps of the te pack too large. Cubes may still widen over
        // combinations no input has (outside the ties applied): they add no input.
        let mut applied: Vec<usize> = Vec::new();
        let mut ties = TRUE;
        let mut rest = f;
        let mut out = Vec::new();
        loop {
            if rest == FALSE || self.exhausted {
                return (out, true);
            }
            let mut cube = self.widest_path(rest);
            let untied: Vec<usize> = (nv..self.nvars())
                .filter(|&v| cube[v].is_some() && !applied.contains(&(v - nv)))
                .map(|v| v - nv)
                .collect();
            if !untied.is_empty() {
                for k in untied {
                    let t = self.tie(nv + k);
                    ties = self.and(ties, t);
                    rest = self.and(rest, t);
                    applied.push(k);
                }
                continue;
            }
            // A predicate the path constrains may be decided, class by class, against it on
            // the path's own classes (its tie is per block when the classes are many): those
            // combinations hold no input; remove them and take another path.
            let mut refined = false;
            for v in nv..self.nvars() {
                let Some(set) = cube[v].clone() else { continue };
                if let Some(bad) = self.contrary_on_path(v, &set, &cube) {
                    let nb = self.not(bad);
                    ties = self.and(ties, nb);
                    rest = self.and(rest, nb);
                    refined = true;
                }
            }
            if !refined && let Some(bad) = self.jointly_contrary(&cube) {
                let nb = self.not(bad);
                ties = self.and(ties, nb);
                rest = self.and(rest, nb);
                refined = true;
            }
            if refined {
                continue;
            }
            if out.len() >= limit {
                return (out, false);
            }
            let outside = self.not(ties);
            let care = self.or(if disjoint { rest } else { f }, outside);
            self.expand(care, &mut cube);
            let c = self.cube(&cube);
            rest = self.minus(rest, c);
            out.push(cube);
        }
    }

    /// For predicate variable `r` restricted to `set` on a path (`cube`): the combinations of
    /// the path's classes of its facts where the predicate is decided against `set`, with
    /// `r` in `set` (None: there are none, or too many combinations to look at).
    fn contrary_on_path(&mut self, r: usize, set: &Bits, cube: &Cube) -> Option<Id> {
        let Rel::Pred {
            prog, node, vars, ..
        } = self.rels[r - self.space.vars.len()].clone()
        else {
            return None;
        };
        let want = set.classes();
        if want.len() != 1 {
            return None;
        }
        let want = want[0] == 1;
        let blocks = self.path_blocks(&vars, cube)?;
        let mut any = false;
        let bad = self.enumerate(&vars, &blocks, &mut |m, asg, cell| {
            let on_path = on_path(&vars, &blocks, cell, cube);
            if !on_path {
                return FALSE;
            }
            match m.decide_cell(prog, node, &vars, &blocks, asg, cell) {
                Some(b) if b != want => {
                    any = true;
                    let hit = if want { [FALSE, TRUE] } else { [TRUE, FALSE] };
                    m.rel_node(r, &hit)
                }
                _ => FALSE,
            }
        });
        any.then_some(bad)
    }

    /// Two predicates a path constrains that read common facts, and whose required values no
    /// member of the path's classes meets together (`b * h > 64` and not `b * h > 40`): the
    /// combinations of those classes with those values, which hold no input. Only cells small
    /// enough to enumerate every member are looked at.
    fn jointly_contrary(&mut self, cube: &Cube) -> Option<Id> {
        let nv = self.space.vars.len();
        let lits: Vec<(usize, bool)> = (nv..self.nvars())
            .filter_map(|v| {
                let c = cube[v].as_ref()?.classes();
                (matches!(self.rels[v - nv], Rel::Pred { .. }) && c.len() == 1)
                    .then_some((v, c[0] == 1))
            })
            .collect();
        let reads = |m: &Self, v: usize| match &m.rels[v - nv] {
            Rel::Pred { vars, .. } => vars.clone(),
            Rel::Ord { .. } => Vec::new(),
        };
        for i in 0..lits.len() {
            for j in i + 1..lits.len() {
                let (a, b) = (lits[i], lits[j]);
                let (va, vb) = (reads(self, a.0), reads(self, b.0));
                if !va.iter().any(|v| vb.contains(v)) {
                    continue;
                }
                if self.same_expression_contrary(a, b) {
                    // No value of the shared expression meets both: contrary everywhere.
                    let (first, second) = if self.level[a.0] < self.level[b.0] {
                        (a, b)
                    } else {
                        (b, a)
                    };
                    let lit =
                        |want: bool, then: Id| if want { [FALSE, then] } else { [then, FALSE] };
                    let inner = self.rel_node(second.0, &lit(second.1, TRUE));
                    return Some(self.rel_node(first.0, &lit(first.1, inner)));
                }
                let mut vars: Vec<usize> = va.iter().chain(&vb).copied().collect();
                vars.sort_by_key(|&v| self.level[v]);
                vars.dedup();
                if let Some(bad) = self.contrary_pair(&vars, a, b, cube) {
                    return Some(bad);
                }
            }
        }
        None
    }

    /// Whether two predicates compare the same expression with integer constants
    /// (`e > 64`, `e > 40`) in a way no value of it (null included) meets with the wanted
    /// truth values.
    fn same_expression_contrary(&self, a: (usize, bool), b: (usize, bool)) -> bool {
        let nv = self.space.vars.len();
        let side = |m: &Self, v: usize| -> Option<(String, crate::lang::ast::CmpOp, i64)> {
            let Rel::Pred { prog, node, .. } = &m.rels[v - nv] else {
                return None;
            };
            let p = &m.progs[*prog];
            let PNode::Cmp(op, x, y) = p.nodes[*node as usize] else {
                return None;
            };
            match (p.nodes[x as usize], p.nodes[y as usize]) {
                (_, PNode::Const(Value::Int(c))) => Some((p.fingerprint(x, false), op, c)),
                (PNode::Const(Value::Int(c)), _) => Some((p.fingerprint(y, false), flip(op), c)),
                _ => None,
            }
        };
        let (Some((ea, oa, ca)), Some((eb, ob, cb))) = (side(self, a.0), side(self, b.0)) else {
            return false;
        };
        if ea != eb {
            return false;
        }
        // The truth of each comparison changes only at its constant: these points (and null,
        // which makes every comparison false) stand for every value.
        let mut points: Vec<Value> = [ca, cb]
            .iter()
            .flat_map(|&c| [c.saturating_sub(1), c, c.saturating_add(1)])
            .map(Value::Int)
            .collect();
        points.extend([Value::Int(i64::MIN), Value::Int(i64::MAX), Value::Null]);
        !points.iter().any(|&e| {
            crate::eval::program::compare(oa, e, Value::Int(ca)) == a.1
                && crate::eval::program::compare(ob, e, Value::Int(cb)) == b.1
        })
    }

    /// See [`Mdd::jointly_contrary`]: the contrary cells of one pair of literals.
    fn contrary_pair(
        &mut self,
        vars: &[usize],
        a: (usize, bool),
        b: (usize, bool),
        cube: &Cube,
    ) -> Option<Id> {
        let nv = self.space.vars.len();
        let atom = |m: &Self, v: usize| match &m.rels[v - nv] {
            Rel::Pred { prog, node, .. } => (*prog, *node),
            Rel::Ord { .. } => unreachable!("predicates only"),
        };
        let (pa, pb) = (atom(self, a.0), atom(self, b.0));
        let blocks = self.path_blocks(vars, cube)?;
        // The literal pair in diagram order (deeper variable inside).
        let (first, second) = if self.level[a.0] < self.level[b.0] {
            (a, b)
        } else {
            (b, a)
        };
        let mut any = false;
        let bad = self.enumerate(vars, &blocks, &mut |m, asg, cell| {
            let on_path = on_path(vars, &blocks, cell, cube);
            if !on_path || !m.no_member_meets(vars, asg, &[(pa, a.1), (pb, b.1)]) {
                return FALSE;
            }
            any = true;
            let lit = |want: bool, then: Id| if want { [FALSE, then] } else { [then, FALSE] };
            let inner = m.rel_node(second.0, &lit(second.1, TRUE));
            m.rel_node(first.0, &lit(first.1, inner))
        });
        any.then_some(bad)
    }

    /// Whether no member of the classes `asg` gives `vars` makes every atom take its wanted
    /// value; false also when the members are too many to enumerate.
    fn no_member_meets(
        &mut self,
        vars: &[usize],
        asg: &Assign,
        atoms: &[((usize, NodeId), bool)],
    ) -> bool {
        let mut members: Vec<Vec<Option<i64>>> = Vec::with_capacity(vars.len());
        let mut count: u128 = 1;
        for &v in vars {
            let Some(c) = asg[v] else {
                members.push(vec![None]);
                continue;
            };
            let ms: Vec<Option<i64>> = match self.space.int_members(v, c) {
                Some((first, last, step)) => {
                    let n = ((last - first) / step) as u128 + 1;
                    if n > JOINT_MEMBERS {
                        return false;
                    }
                    (0..n as i64).map(|k| Some(first + k * step)).collect()
                }
                None => {
                    if let super::space::ClassDesc::Ordered { lo, hi } =
                        &self.space.vars[v].classes[c as usize].desc
                        && lo != hi
                    {
                        return false;
                    }
                    vec![None]
                }
            };
            count = count.saturating_mul(ms.len() as u128);
            if count > JOINT_MEMBERS {
                return false;
            }
            members.push(ms);
        }
        let mut idx = vec![0usize; vars.len()];
        let mut values: Vec<(usize, Value)> = Vec::new();
        let mut vals = std::mem::take(&mut self.vals);
        let mut met = false;
        loop {
            values.clear();
            for (i, &v) in vars.iter().enumerate() {
                if let Some(x) = members[i][idx[i]] {
                    values.push((v, Value::Int(x)));
                }
            }
            self.space.materialize_with(asg, &values, &mut vals);
            if atoms.iter().all(|&((prog, node), want)| {
                (Truth::of(self.progs[prog].eval(node, &vals)) == Truth::True) == want
            }) {
                met = true;
                break;
            }
            if !next_combination(&mut idx, &members) {
                break;
            }
        }
        self.vals = vals;
        !met
    }

    /// Per var, each class the path (`cube`) allows as a block of its own and the other
    /// classes as one block; None when the path's cells are too many to look at.
    fn path_blocks(&self, vars: &[usize], cube: &Cube) -> Option<Vec<Vec<Vec<u32>>>> {
        let mut cells = 1usize;
        let blocks: Vec<Vec<Vec<u32>>> = vars
            .iter()
            .map(|&v| {
                let allowed = cube[v]
                    .as_ref()
                    .map_or_else(|| self.full_of(v), Bits::classes);
                cells = cells.saturating_mul(allowed.len());
                let mut b: Vec<Vec<u32>> = allowed.iter().map(|&c| vec![c]).collect();
                let others: Vec<u32> = (0..self.ncls[v] as u32)
                    .filter(|c| !allowed.contains(c))
                    .collect();
                if !others.is_empty() {
                    b.push(others);
                }
                b
            })
            .collect();
        (cells <= TIE_CELL_LIMIT).then_some(blocks)
    }

    /// Every class of var `v`.
    fn full_of(&self, v: usize) -> Vec<u32> {
        (0..self.ncls[v] as u32).collect()
    }

    /// A path of `x` to true, taking at each node the edge with the most classes.
    fn widest_path(&self, mut x: Id) -> Cube {
        let mut cube = vec![None; self.nvars()];
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
        let mut levels: Vec<usize> = self
            .used
            .iter()
            .map(|&l| l as usize)
            .filter(|&l| cube[self.order[l]].is_some())
            .collect();
        levels.sort_by_key(|&l| std::cmp::Reverse(self.full[l].len()));
        // Reused (cleared) between vars: allocating fresh tables dominated the run time.
        let (mut memo, mut inside) = ((NodeMemo::default(), Vec::new()), NodeMemo::default());
        for free_only in [true, false] {
            for &l in &levels {
                let v = self.order[l];
                if cube[v].is_none() {
                    continue;
                }
                memo.0.clear(self.nodes.len());
                memo.1.clear();
                inside.clear(self.nodes.len());
                let mut good = self.allowed(f, l as u32, cube, &mut memo, &mut inside);
                // An object whose members are constrained stays present: a member's
                // constraint cannot be written for an absent object.
                if v < self.space.vars.len()
                    && self
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
        memo: &mut (NodeMemo<u32>, Vec<Bits>),
        inside: &mut NodeMemo<bool>,
    ) -> Bits {
        let full = &self.full[level as usize];
        let n = &self.nodes[x as usize];
        if n.level > level {
            return if self.everywhere(x, cube, true, inside) {
                full.clone()
            } else {
                Bits::empty(self.ncls[self.order[level as usize]])
            };
        }
        if let Some(i) = memo.0.get(x) {
            return memo.1[i as usize].clone();
        }
        let r = if n.level == level {
            let mut r = Bits::empty(self.ncls[self.order[level as usize]]);
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
        memo.0.set(x, memo.1.len() as u32);
        memo.1.push(r.clone());
        r
    }

    /// The diagram of a cube.
    pub fn cube(&mut self, cube: &Cube) -> Id {
        let mut x = TRUE;
        for &l in self.used.clone().iter().rev() {
            let l = l as usize;
            if let Some(set) = &cube[self.order[l]] {
                let other = self.full[l].minus(set);
                x = self.mk(l as u32, vec![(x, set.clone()), (FALSE, other)]);
            }
        }
        x
    }

    /// An input inside the cube, as a class per constrained fact plus the values of some
    /// integer facts: the first class of each constrained fact; where the cube constrains
    /// relation variables, members found by a bounded search that satisfy them. Free facts
    /// stay unassigned (they keep their defaults). None when the search found no input (the
    /// cube may hold none: relation variables of atoms sharing facts are not tied together).
    pub fn example(&mut self, cube: &[Option<Bits>]) -> Option<(Assign, Vec<(usize, Value)>)> {
        let nv = self.space.vars.len();
        let mut assign: Assign = (0..nv)
            .map(|v| cube[v].as_ref().map(|s| s.classes()[0]))
            .collect();
        let lits: Vec<(usize, Vec<u32>)> = (0..self.rels.len())
            .filter_map(|k| {
                let set = cube.get(nv + k)?.as_ref()?;
                (set.len() < self.ncls[nv + k]).then(|| (k, set.classes()))
            })
            .collect();
        if lits.is_empty() {
            return Some((assign, Vec::new()));
        }
        let reads: Vec<Vec<usize>> = lits.iter().map(|(k, _)| self.rel_vars(*k)).collect();
        let mut involved: Vec<usize> = reads.iter().flatten().copied().collect();
        involved.sort_by_key(|&v| self.level[v]);
        involved.dedup();
        // Per depth of the search: the literals whose facts are all chosen from there on.
        let mut due: Vec<Vec<usize>> = vec![Vec::new(); involved.len() + 1];
        for (l, r) in reads.iter().enumerate() {
            let last = r
                .iter()
                .filter_map(|v| involved.iter().position(|u| u == v))
                .max()
                .map_or(0, |i| i + 1);
            due[last].push(l);
        }
        let mut values = Vec::new();
        let mut tries = 0;
        let mut search = Witness {
            lits: &lits,
            due: &due,
            involved: &involved,
            cube,
            tries: &mut tries,
        };
        let ok = self.witness(&mut search, 0, &mut assign, &mut values);
        ok.then_some((assign, values))
    }

    /// The space vars relation variable `k` reads (objects included).
    fn rel_vars(&self, k: usize) -> Vec<usize> {
        match &self.rels[k] {
            Rel::Ord { x, y } => self.with_objects_in_order(&[*x, *y]),
            Rel::Pred { vars, .. } => self.with_objects_in_order(vars),
        }
    }

    /// Depth-first search for classes and members of `involved[i..]` satisfying the literals.
    fn witness(
        &mut self,
        w: &mut Witness,
        i: usize,
        assign: &mut Assign,
        values: &mut Vec<(usize, Value)>,
    ) -> bool {
        // Literals whose facts are now all chosen.
        for &l in &w.due[i] {
            let (k, set) = &w.lits[l];
            *w.tries += 1;
            if !self.literal_holds(*k, set, assign, values) {
                return false;
            }
        }
        let (lits, involved, cube) = (w.lits, w.involved, w.cube);
        if i == involved.len() {
            return true;
        }
        let v = involved[i];
        let before = assign[v];
        for (c, x) in self.candidates(v, cube, lits, values) {
            if *w.tries >= WITNESS_TRIES {
                break;
            }
            assign[v] = Some(c);
            if let Some(x) = x {
                values.push((v, Value::Int(x)));
            }
            if self.witness(w, i + 1, assign, values) {
                return true;
            }
            if x.is_some() {
                values.pop();
            }
        }
        assign[v] = before;
        false
    }

    /// Whether relation `k` takes one of the classes `set` for this input.
    fn literal_holds(
        &mut self,
        k: usize,
        set: &[u32],
        assign: &Assign,
        values: &[(usize, Value)],
    ) -> bool {
        let mut vals = std::mem::take(&mut self.vals);
        self.space.materialize_with(assign, values, &mut vals);
        let class = match &self.rels[k] {
            Rel::Ord { x, y } => {
                match (
                    vals[self.space.vars[*x].slot],
                    vals[self.space.vars[*y].slot],
                ) {
                    (Value::Int(a), Value::Int(b)) => Some(a.cmp(&b) as i32 + 1),
                    // No diagram tests the ordering where a side is null.
                    (Value::Null, _) | (_, Value::Null) => {
                        self.vals = vals;
                        return true;
                    }
                    _ => None,
                }
            }
            Rel::Pred { prog, node, .. } => match Truth::of(self.progs[*prog].eval(*node, &vals)) {
                Truth::True => Some(1),
                Truth::False => Some(0),
                Truth::Unknown => None,
            },
        };
        self.vals = vals;
        class.is_some_and(|c| set.contains(&(c as u32)))
    }

    /// Classes (and members, for integers) to try for var `v`: values near those already
    /// chosen first (equal, off by one, doubled, halved: what relations between facts
    /// need), then a few members of every class the cube allows.
    fn candidates(
        &self,
        v: usize,
        cube: &[Option<Bits>],
        lits: &[(usize, Vec<u32>)],
        values: &[(usize, Value)],
    ) -> Vec<(u32, Option<i64>)> {
        let var = &self.space.vars[v];
        let allowed: Vec<u32> = match &cube[v] {
            Some(s) => s.classes(),
            None => (0..var.classes.len() as u32).collect(),
        };
        if self.space.int_members(v, allowed[0]).is_none()
            && allowed
                .iter()
                .all(|&c| self.space.int_members(v, c).is_none())
        {
            // Objects present first (their members carry the relation).
            let mut out: Vec<(u32, Option<i64>)> = allowed.iter().map(|&c| (c, None)).collect();
            out.sort_by_key(|&(c, _)| var.classes[c as usize].value == Value::Null);
            return out;
        }
        let mut out: Vec<(u32, Option<i64>)> = Vec::new();
        let push = |x: i64, out: &mut Vec<(u32, Option<i64>)>| {
            if let Some(c) = self.space.class_of(v, Value::Int(x))
                && allowed.contains(&(c as u32))
                && !out.iter().any(|o| o.1 == Some(x))
            {
                out.push((c as u32, Some(x)));
            }
        };
        // An ordering with a fact already chosen (value w): per allowed class, the member
        // nearest to w on the required side (or w itself), so the literal holds at once; no
        // other member could do better for it.
        let mut directed = false;
        for (k, set) in lits {
            let Rel::Ord { x, y } = self.rels[*k] else {
                continue;
            };
            let (other, v_is_y) = match (x == v, y == v) {
                (true, _) => (y, false),
                (_, true) => (x, true),
                _ => continue,
            };
            let Some(&(_, Value::Int(w))) = values.iter().find(|e| e.0 == other) else {
                continue;
            };
            directed = true;
            for &c in &allowed {
                let Some((first, last, step)) = self.space.int_members(v, c) else {
                    continue;
                };
                for &o in set {
                    // Ordering o of (x, y): v above w when (v is y and x < y) or (v is x and x > y).
                    let above = (o == 0 && v_is_y) || (o == 2 && !v_is_y);
                    let below = (o == 2 && v_is_y) || (o == 0 && !v_is_y);
                    let m = if above {
                        let t = w.saturating_add(1).max(first);
                        Some(t + (first - t).rem_euclid(step))
                    } else if below {
                        let t = w.saturating_sub(1).min(last);
                        Some(t - (t - first).rem_euclid(step))
                    } else {
                        Some(w)
                    };
                    if let Some(m) = m.filter(|&m| first <= m && m <= last) {
                        push(m, &mut out);
                    }
                }
            }
        }
        if directed {
            return out;
        }
        for &(_, w) in values {
            if let Value::Int(w) = w {
                for x in [
                    w,
                    w - 1,
                    w + 1,
                    2 * w,
                    w / 2,
                    3 * w,
                    w / 3,
                    4 * w,
                    w / 4,
                    w + 2,
                    w - 2,
                ] {
                    push(x, &mut out);
                }
            }
        }
        for &c in &allowed {
            match self.space.int_members(v, c) {
                Some((first, last, step)) => {
                    for k in [0i64, 1, 2, 3, 4, 8, 16] {
                        let x = first.saturating_add(k.saturating_mul(step));
                        if x <= last {
                            push(x, &mut out);
                        }
                    }
                    // Doublings (kept small: examples should read like real inputs).
                    let mut t = first.max(1);
                    while t < last / 2 && t < 1 << 30 {
                        t *= 2;
                        push(t + (first - t).rem_euclid(step), &mut out);
                    }
                    push(last, &mut out);
                }
                None => out.push((c, None)),
            }
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

    /// `acc and` backend `b` is eligible and every other backend is not: only `b` serves.
    pub fn only_within(&self, m: &mut Mdd, b: usize, acc: Id) -> Id {
        let mut out = self.eligible_within(m, b, acc);
        let others: Vec<u16> = (0..self.app.len() as u16)
            .filter(|&x| x as usize != b)
            .collect();
        for other in self.fewest_rules_first(&others) {
            if out == FALSE {
                break;
            }
            out = self.declined_within(m, other, out);
        }
        out
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

    /// Within `acc`, where the pack selects each outcome ((backend, variant); None: nothing)
    /// as disjoint diagrams covering `acc`, empty ones left out. Mirrors the decision: the
    /// first preference entry that applies, in its order the first backend with an eligible
    /// variant, its first eligible variant.
    pub fn outcomes_within(
        &self,
        m: &mut Mdd,
        p: &crate::policy::Policy,
        acc: Id,
    ) -> Vec<(Option<(u16, usize)>, Id)> {
        let mut out: Vec<(Option<(u16, usize)>, Id)> = Vec::new();
        let mut add = |m: &mut Mdd, o: Option<(u16, usize)>, d: Id| {
            if d == FALSE {
                return;
            }
            match out.iter_mut().find(|e| e.0 == o) {
                Some(e) => e.1 = m.or(e.1, d),
                None => out.push((o, d)),
            }
        };
        let none = m.and(acc, self.no_pref);
        add(m, None, none);
        for (i, e) in p.preference.iter().enumerate() {
            let mut part = m.and(acc, self.first_pref[i]);
            for &b in &e.order {
                for v in 0..self.app[b as usize].len() {
                    if part == FALSE {
                        break;
                    }
                    let out_v = self.variant_out(m, b as usize, v, part);
                    let chosen = m.minus(part, out_v);
                    add(m, Some((b, v)), chosen);
                    part = out_v;
                }
            }
            add(m, None, part);
        }
        out
    }

    /// Whether backend `b` is selected for some input: for some preference entry listing it,
    /// some input where that entry applies, `b` is eligible and every backend before it is
    /// declined (computed inside `b`'s eligible region, which stays small).
    pub fn selectable(&self, m: &mut Mdd, p: &crate::policy::Policy, b: usize, within: Id) -> bool {
        for (i, e) in p.preference.iter().enumerate() {
            let Some(pos) = e.order.iter().position(|&x| x as usize == b) else {
                continue;
            };
            let entry = m.and(within, self.first_pref[i]);
            let mut acc = self.eligible_within(m, b, entry);
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

fn gcd(a: i64, b: i64) -> i64 {
    let (mut a, mut b) = (a.abs(), b.abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The comparison with its operands swapped (`a < b` is `b > a`).
fn flip(op: crate::lang::ast::CmpOp) -> crate::lang::ast::CmpOp {
    use crate::lang::ast::CmpOp::*;
    match op {
        Lt => Gt,
        Gt => Lt,
        Le => Ge,
        Ge => Le,
        other => other,
    }
}

/// The integer facts an expression can be, directly or as a branch of `if`.
fn branch_slots(schema: &crate::facts::Schema, p: &Program, id: NodeId, out: &mut Vec<usize>) {
    match p.nodes[id as usize] {
        PNode::Slot(s) if schema.fields[s as usize].ty == crate::facts::schema::Ty::Int => {
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

/// Which of less / equal / greater two integer classes' members (`(first, last, step)`)
/// allow: exact, "equal" included (a common member of both progressions in the overlap).
fn member_orderings(x: (i64, i64, i64), y: (i64, i64, i64)) -> [bool; 3] {
    let ((fx, lx, sx), (fy, ly, sy)) = (x, y);
    let lt = fx < ly;
    let gt = lx > fy;
    let (lo, hi) = (fx.max(fy), lx.min(ly));
    let mut eq = false;
    if lo <= hi {
        // The first member of x's progression at or above `lo`, then x's members in turn
        // until one is also y's (at most sy / gcd steps).
        let mut z = lo + (fx - lo).rem_euclid(sx);
        for _ in 0..(sy / gcd(sx, sy)).max(1) {
            if z > hi {
                break;
            }
            if (z - fy).rem_euclid(sy) == 0 {
                eq = true;
                break;
            }
            z += sx;
        }
    }
    [lt, eq, gt]
}

/// Ordering `o` if possible, else the first possible of equal, less, greater (every
/// pair of classes allows at least one).
fn canonical(possible: &[bool; 3], o: usize) -> usize {
    if possible[o] {
        return o;
    }
    [1, 0, 2].into_iter().find(|&k| possible[k]).unwrap_or(o)
}

/// Whether a cell of [`Mdd::path_blocks`] lies on the path (each var at a class it allows).
fn on_path(vars: &[usize], blocks: &[Vec<Vec<u32>>], cell: &[usize], cube: &Cube) -> bool {
    cell.iter().enumerate().all(|(i, &k)| {
        k == usize::MAX
            || cube[vars[i]]
                .as_ref()
                .is_none_or(|s| blocks[i][k].len() == 1 && s.classes().contains(&blocks[i][k][0]))
    })
}

/// Advances `idx` to the next combination of one member per list (an odometer); false after
/// the last one.
fn next_combination<T>(idx: &mut [usize], members: &[Vec<T>]) -> bool {
    for (i, list) in members.iter().enumerate() {
        idx[i] += 1;
        if idx[i] < list.len() {
            return true;
        }
        idx[i] = 0;
    }
    false
}
