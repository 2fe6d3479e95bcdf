//! Relation variables: diagram variables that are not facts but the truth of a condition the
//! facts' classes do not decide, and their *ties* to the facts.
//!
//! - An **ordering** variable `Rel::Ord { x, y }` (`x < y`, classes less / equal / greater)
//!   decides comparisons between two integer facts. Per pair of intervals of `x` and `y` only
//!   some orderings have members; an atom's diagram sends an impossible ordering where a
//!   possible one goes (the *canonical* choice, `canonical`), so no result rests on an
//!   ordering no input has.
//! - A **predicate** variable `Rel::Pred` (classes false / true) stands for an atom on the
//!   blocks where it is not provably constant (non-linear arithmetic, expressions of several
//!   facts); blocks that decide it are decided in the atom's diagram, never guessed.
//!
//! Invariants: `rels[k]` is diagram var `space.vars.len() + k`, registered once per key in
//! `rel_index` (`"ord x y"`, `"pred <fingerprint>"`), at a level below every fact it reads
//! (`add_rel`). `ties[k]`, built on first use by [`Mdd::tie`], is the diagram of where
//! relation `k`'s value agrees with the facts: for an ordering, the orderings each pair of
//! intervals allows (exact); for a predicate, its value on each cell that decides it (cells
//! per class when the combinations are at most `TIE_CELL_LIMIT`, else per block), true
//! elsewhere. A result is intersected with the ties of the variables a listed path tests
//! before it is listed (see `cover`).

use crate::cell::cmp_for;
use crate::space::{Assign, ClassDesc, Space, SpaceBuilder};
use attn_policy::eval::program::{Node as PNode, NodeId};
use attn_policy::facts::Value;

use super::atoms::gcd;
use super::bits::Bits;
use super::manager::{Mdd, SPREAD, TIE_CELL_LIMIT};
use super::rel::Rel;
use super::store::{FALSE, Id, TRUE};

/// What `Mdd::per_interval_pair` builds a leaf from: the blocks' representatives and the
/// orderings the pair of intervals allows (None: a side is null or absent).
type PairLeaf<'a, 's> = dyn FnMut(&mut Mdd<'s>, &Assign, Option<[bool; 3]>) -> Id + 'a;

impl<'s> Mdd<'s> {
    /// Adds a relation variable at the first free level below the deepest var of `below`
    /// (else at a new level at the bottom). No node built so far tests a free level, so every
    /// node stays ordered.
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
        let words = self.full[at as usize].words().len() as u32;
        self.store.set_level_words(at as usize, words);
        self.ncls.push(classes);
        let pos = self.used.partition_point(|&l| l < at);
        self.used.insert(pos, at);
        v
    }

    /// The node testing relation variable `v`: class `c` leads to `to[c]`.
    pub(super) fn rel_node(&mut self, v: usize, to: &[Id]) -> Id {
        // Straight onto the edge stack (as `mk` would put them): this runs once per cell of
        // every predicate and ordering, so a list of edges per call was an allocation each.
        let level = self.level[v];
        let w = to.len().div_ceil(64);
        debug_assert_eq!(w, self.store.w(level));
        let (ks, ws) = (self.ek.len(), self.ew.len());
        for (c, &k) in to.iter().enumerate() {
            self.ek.push(k);
            let at = self.ew.len();
            self.ew.resize(at + w, 0);
            self.ew[at + c / 64] |= 1 << (c % 64);
        }
        self.mk_top(level, ks, ws)
    }

    /// The space vars relation variable `k` reads (objects included).
    pub(super) fn rel_vars(&self, k: usize) -> Vec<usize> {
        match &self.rels[k] {
            Rel::Ord { x, y } => self.with_objects_in_order(&[*x, *y]),
            Rel::Pred { vars, .. } => self.with_objects_in_order(vars),
        }
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

    /// The var holding integer fact `slot` itself (not a derived fact).
    fn plain_int_var(&self, slot: usize) -> Option<usize> {
        if self.space.schema.fields[slot].ty != attn_policy::facts::schema::Ty::Int {
            return None;
        }
        self.space.vars.iter().position(|v| v.slot == slot)
    }

    /// The ordering variable of vars `x < y` (placed just below the deeper of the two).
    fn ord_var(&mut self, x: usize, y: usize) -> usize {
        let key = format!("ord {x} {y}");
        if let Some(&k) = self.rel_index.get(&key) {
            return self.space.vars.len() + k;
        }
        self.add_rel(key, Rel::Ord { x, y }, 3, &[x, y])
    }

    /// `x < y`-style atoms between two integer facts, decided by the ordering variable of
    /// the pair. Per pair of classes only some orderings have members (`a in 1..4` is below
    /// `b in 9..12`); an impossible ordering leads where a possible one does ("canonical"),
    /// so every diagram takes the same value on it and no result rests on an ordering no
    /// input has: a path to true always holds an input.
    pub(super) fn ord_atom(&mut self, prog: usize, id: NodeId, vars: &[usize]) -> Option<Id> {
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
                ClassDesc::Int { iv, .. } => Some(iv),
                _ => None,
            };
            match groups.iter_mut().find(|g| key.is_some() && g.0 == key) {
                Some(g) => g.1.push(c as u32),
                None => groups.push((key, vec![c as u32])),
            }
        }
        groups.into_iter().map(|g| g.1).collect()
    }

    /// An atom the facts' classes do not decide everywhere (non-linear arithmetic, a
    /// comparison of expressions of several facts): decided per block of its own abstraction
    /// where provably constant; elsewhere the diagram tests the atom's predicate variable
    /// (placed just below the deepest fact it reads), so no block is decided by a guess.
    pub(super) fn predicate_atom(
        &mut self,
        prog: usize,
        id: NodeId,
        vars: &[usize],
        own: &Space,
    ) -> Id {
        let blocks = self.blocks_of(vars, own, &[]);
        let hulls = self.block_hulls(vars, &blocks);
        // Every cell decided first (on two threads when many), in the order the build
        // below reads them.
        let decided = self.decide_cells(prog, id, vars, &blocks, &hulls);
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
        // Every undecided cell is the same node: made at the first (where it was always
        // made, so node ids stay as they were), then reused (a node made per cell was a
        // fourteenth of compiling the te pack).
        let mut literal = None;
        self.enumerate(
            vars,
            &blocks,
            &mut |m, _, _| match it.next().copied().flatten() {
                Some(true) => TRUE,
                Some(false) => FALSE,
                None => *literal.get_or_insert_with(|| {
                    m.rel_node(r.expect("a predicate variable"), &[FALSE, TRUE])
                }),
            },
        )
    }

    /// The tie of relation variable `v` (built on first use: only listed paths need it):
    /// where its value agrees with the facts. An ordering: the orderings each pair of
    /// intervals allows. A predicate: its value on every cell that decides it, cells being
    /// the classes of its facts (when their combinations are few; else its blocks).
    pub(super) fn tie(&mut self, r: usize) -> Id {
        let k = r - self.space.vars.len();
        if let Some(t) = self.ties[k] {
            return t;
        }
        let t = match self.rels[k].clone() {
            Rel::Ord { x, y } => self.ord_tie(r, x, y),
            Rel::Pred {
                prog, node, vars, ..
            } => {
                let mut b = SpaceBuilder::for_schema(self.space.schema);
                b.root(&self.progs[prog], node);
                let own = b.build();
                let cells = vars
                    .iter()
                    .map(|&v| self.ncls[v])
                    .fold(1usize, |a, n| a.saturating_mul(n));
                let per_class: &[usize] = if cells <= TIE_CELL_LIMIT { &vars } else { &[] };
                let blocks = self.blocks_of(&vars, &own, per_class);
                let hulls = self.block_hulls(&vars, &blocks);
                let decided = self.decide_cells(prog, node, &vars, &blocks, &hulls);
                let mut it = decided.into_iter();
                // The two literals, each made where first needed (as `predicate_atom`'s).
                let mut literal: [Option<Id>; 2] = [None, None];
                self.enumerate(&vars, &blocks, &mut |m, _, _| match it
                    .next()
                    .expect("a decision per cell")
                {
                    Some(b) => *literal[b as usize].get_or_insert_with(|| {
                        m.rel_node(
                            r,
                            &[if b { FALSE } else { TRUE }, if b { TRUE } else { FALSE }],
                        )
                    }),
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

/// The comparison with its operands swapped (`a < b` is `b > a`).
pub(super) fn flip(op: attn_policy::lang::ast::CmpOp) -> attn_policy::lang::ast::CmpOp {
    use attn_policy::lang::ast::CmpOp::*;
    match op {
        Lt => Gt,
        Gt => Lt,
        Le => Ge,
        Ge => Le,
        other => other,
    }
}
