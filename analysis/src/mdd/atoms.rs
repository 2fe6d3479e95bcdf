//! Atoms and their evaluation on blocks of classes.
//!
//! An atom's *own abstraction* (a [`Space`] built from the atom alone) groups the classes of
//! the manager's space into blocks the atom cannot tell apart. An atom reading no relational
//! or inexact fact is constant on every block, so its diagram is built by evaluating it once
//! per combination of blocks of the vars it reads, at the blocks' representatives (the first
//! class of each block), with every other fact unassigned (Kleene logic). Other atoms go to
//! `relations` (an ordering variable, or a predicate variable where no block decides them).
//!
//! [`Mdd::decide_cell`] says whether an atom is constant on a cell (per var, a set of classes)
//! and its value: first by abstract evaluation over intervals and congruences
//! ([`super::super::cell`]), then, for cells of at most `BRUTE_FORCE_MEMBERS` concrete members,
//! by evaluating every member. It answers a value only when that value is proven for the
//! whole cell.
//!
//! Invariants: `enumerate` builds a diagram over `vars` (in diagram order) with one edge per
//! block, so blocks must partition each var's classes; a var whose object is absent on a path
//! is skipped there (its value is null). Every evaluation increments `evaluations` (the
//! "classes examined" of the reports); an evaluation that stays unknown with every fact it
//! reads assigned increments `unknown` and reads false.
//!
//! Complexity: one evaluation per combination of blocks (the product of the block counts of
//! the vars the atom reads), never per combination of the whole space.

use crate::cell::Abs;
use crate::space::{Assign, ClassDesc, Space, SpaceBuilder, slots_under};
use attn_policy::eval::program::{NodeId, Truth};
use attn_policy::facts::Value;

use super::bits::Bits;
use super::decide::{Member, Tally, UNCOUNTABLE, each_member, members_of};
use super::manager::Mdd;
use super::store::{FALSE, Id, TRUE};

impl<'s> Mdd<'s> {
    /// The diagram of an atom with no numeric `if` left in it: evaluated per block of its own
    /// abstraction when that decides it; else an ordering or predicate variable decides it
    /// where the blocks do not (see `relations`).
    pub(super) fn enumerate_atom(&mut self, prog: usize, id: NodeId) -> Id {
        let vars = self.atom_vars(prog, id);
        // The atom's own abstraction: classes it cannot tell apart form one block.
        let mut b = SpaceBuilder::for_schema(self.space.schema);
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

    /// Per var, its classes grouped into the blocks `own` (an atom's abstraction) tells
    /// apart; vars in `per_class` get one block per class.
    pub(super) fn blocks_of(
        &self,
        vars: &[usize],
        own: &Space,
        per_class: &[usize],
    ) -> Vec<Vec<Vec<u32>>> {
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
    pub(super) fn eval_leaf(&mut self, prog: usize, id: NodeId, assign: &Assign) -> Id {
        self.evaluations += 1;
        let mut vals = std::mem::take(&mut self.vals);
        self.space.materialize(assign, &mut vals);
        let t = Truth::of(self.progs[prog].eval(id, &vals));
        self.vals = vals;
        self.terminal(t)
    }

    /// A truth value as a terminal: unknown reads false (and is counted in `unknown`).
    pub(super) fn terminal(&mut self, t: Truth) -> Id {
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
    pub(super) fn enumerate(
        &mut self,
        vars: &[usize],
        blocks: &[Vec<Vec<u32>>],
        leaf: &mut dyn FnMut(&mut Self, &Assign, &[usize]) -> Id,
    ) -> Id {
        let mut assign: Assign = vec![None; self.space.vars.len()];
        let mut cell = vec![usize::MAX; vars.len()];
        // Each block's class set, made once (not once per node of the var).
        let sets: Vec<Vec<Bits>> = vars
            .iter()
            .zip(blocks)
            .map(|(&v, bs)| {
                bs.iter()
                    .map(|block| {
                        let mut set = Bits::empty(self.ncls[v]);
                        for &c in block {
                            set.insert(c);
                        }
                        set
                    })
                    .collect()
            })
            .collect();
        self.enumerate_from(vars, blocks, &sets, 0, &mut assign, &mut cell, leaf)
    }

    #[allow(clippy::too_many_arguments)]
    fn enumerate_from(
        &mut self,
        vars: &[usize],
        blocks: &[Vec<Vec<u32>>],
        sets: &[Vec<Bits>],
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
            return self.enumerate_from(vars, blocks, sets, i + 1, assign, cell, leaf);
        }
        // Edges go on the edge stack (as `apply`'s): nested calls push and pop above them.
        let (ks, ws) = (self.ek.len(), self.ew.len());
        for (k, block) in blocks[i].iter().enumerate() {
            assign[v] = Some(block[0]);
            cell[i] = k;
            let r = self.enumerate_from(vars, blocks, sets, i + 1, assign, cell, leaf);
            self.ek.push(r);
            self.ew.extend_from_slice(sets[i][k].words());
        }
        assign[v] = None;
        cell[i] = usize::MAX;
        self.mk_top(self.level[v], ks, ws)
    }

    /// Per var of `vars`, per block, the abstract value of the var over the block's classes
    /// (what [`Mdd::decide_cell`] reads for a block of several classes: computed once per
    /// atom, not once per cell).
    pub(super) fn block_hulls(&self, vars: &[usize], blocks: &[Vec<Vec<u32>>]) -> Vec<Vec<Abs>> {
        vars.iter()
            .zip(blocks)
            .map(|(&v, bs)| bs.iter().map(|b| self.hull(v, b)).collect())
            .collect()
    }

    /// Whether atom `id` is constant on a cell (per var, the classes of its block), and its
    /// value there; None when it is not, or not provably so. `hulls`: the blocks'
    /// [`Mdd::block_hulls`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decide_cell(
        &mut self,
        prog: usize,
        id: NodeId,
        vars: &[usize],
        blocks: &[Vec<Vec<u32>>],
        hulls: &[Vec<Abs>],
        asg: &Assign,
        cell: &[usize],
    ) -> Option<bool> {
        let mut vals = std::mem::take(&mut self.vals);
        let mut tally = Tally::default();
        let r = self
            .cell_decider(prog, id, vars, blocks, hulls)
            .decide(asg, cell, &mut tally, &mut vals);
        self.vals = vals;
        self.count(tally);
        r
    }

    /// Per space var, per class: how many concrete members it has (`UNCOUNTABLE` for an
    /// interval of floats or versions), for [`Mdd::cell_members`].
    pub(super) fn count_members(&self) -> Vec<Box<[u128]>> {
        let space = self.space;
        (0..space.vars.len())
            .map(|v| {
                (0..space.vars[v].classes.len() as u32)
                    .map(|c| match space.int_members(v, c) {
                        Some((first, last, step)) => ((last - first) / step) as u128 + 1,
                        None => match &space.vars[v].classes[c as usize].desc {
                            ClassDesc::Ordered { lo, hi } if lo != hi => UNCOUNTABLE,
                            _ => 1,
                        },
                    })
                    .collect()
            })
            .collect()
    }

    /// The concrete members of a cell, per var of `vars`: (class, member) pairs, the member
    /// None for a class that is one value (not an integer class); no pair for a var without a
    /// class (`classes` gives None: its object is absent). None when some class is an interval
    /// of floats or versions, or the cell has more than `limit` members.
    pub(super) fn cell_members<'c>(
        &self,
        vars: &[usize],
        classes: &dyn Fn(usize) -> Option<&'c [u32]>,
        limit: u128,
    ) -> Option<Vec<Vec<Member>>> {
        // The classes' counts are made once per manager (three divisions a class, per cell,
        // were a twelfth of check).
        let counts = self.member_counts.get_or_init(|| self.count_members());
        members_of(self.space, counts, vars, classes, limit)
    }

    /// Calls `visit` with the fact values of each combination of one member per var of
    /// [`Mdd::cell_members`] (the other facts as `asg` gives them), until it answers true.
    pub(super) fn for_each_member(
        &mut self,
        vars: &[usize],
        asg: &Assign,
        members: &[Vec<Member>],
        visit: &mut dyn FnMut(&mut Self, &[Value]) -> bool,
    ) {
        let mut vals = std::mem::take(&mut self.vals);
        let space = self.space;
        each_member(space, vars, asg, members, &mut vals, &mut |v| {
            visit(self, v)
        });
        self.vals = vals;
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
                    && !matches!(var.classes[c as usize].desc, ClassDesc::Ordered { .. })
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
}

pub(super) fn gcd(a: i64, b: i64) -> i64 {
    let (mut a, mut b) = (a.abs(), b.abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}
