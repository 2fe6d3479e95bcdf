//! The node store, the hash-consing (unique) table, the operation memos and the boolean
//! operations on diagrams.
//!
//! Invariants (see the module root for what a node id means):
//! - `nodes[0]` / `nodes[1]` are the terminals ([`FALSE`] / [`TRUE`], level `TERMINAL`);
//!   every other node is in canonical form and was created by [`Mdd::mk`], which is the only
//!   place that pushes to `nodes`.
//! - `unique` is an open-addressing table of node ids (`EMPTY_SLOT` for a free slot), its
//!   size a power of two at least twice the number of nodes; a node is found by hashing the
//!   node itself, so equal nodes are stored once.
//! - `apply_cache` is keyed by `(op, min(a, b), max(a, b))` (both operations commute);
//!   `not_cache` holds both directions of each negation (`not` is an involution). Entries
//!   stay valid forever (nodes are never freed).
//! - [`NodeMemo`] is a per-traversal memo over node ids, cleared in O(1) by a generation stamp;
//!   `clear(n)` must be called with `n` at least the number of nodes before `get` / `set`.
//!
//! Complexity: `mk` is O(edges) plus a hash probe; `apply(a, b)` visits each pair of nodes of
//! `a` and `b` reachable together at most once (memoised), each visit intersecting two edge
//! partitions (O(edges(a) * edges(b)) set operations); `not(a)` is O(size of `a`).

use super::{Bits, FALSE, Id, Mdd, TRUE};

/// The level of the terminals: below every variable.
pub(super) const TERMINAL: u32 = u32::MAX;

/// An empty slot of the hash-consing table.
pub(super) const EMPTY_SLOT: Id = u32::MAX;

fn node_hash(n: &Node) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::default().hash_one(n)
}

/// A node: a var (by level) and a partition of its classes into edges, one per distinct
/// child, sorted by child (so equal functions have equal nodes).
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct Node {
    pub(super) level: u32,
    pub(super) edges: Box<[(Id, Bits)]>,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Op {
    And,
    Or,
}

/// A memo over node ids, cleared in O(1): a generation stamp per node (the traversals of
/// `cover` visit most of a large diagram once per var; hashing dominated them).
pub(super) struct NodeMemo<T: Copy + Default> {
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
    pub(super) fn clear(&mut self, nodes: usize) {
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

    pub(super) fn get(&self, x: Id) -> Option<T> {
        (self.stamp[x as usize] == self.generation).then(|| self.val[x as usize])
    }

    pub(super) fn set(&mut self, x: Id, v: T) {
        self.stamp[x as usize] = self.generation;
        self.val[x as usize] = v;
    }
}

impl<'s> Mdd<'s> {
    /// Number of nodes created (a measure of the work done).
    pub fn size(&self) -> usize {
        self.nodes.len()
    }

    /// The node for `level` with these edges (merging edges to the same child).
    pub(super) fn mk(&mut self, level: u32, mut edges: Vec<(Id, Bits)>) -> Id {
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

    pub(super) fn apply(&mut self, op: Op, a: Id, b: Id) -> Id {
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
}
