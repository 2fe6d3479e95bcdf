//! Deciding an atom cell by cell without the manager: [`CellDecider`] reads only the space,
//! the program and the classes' member counts (all shared, never changed), so the cells of
//! a large predicate are decided on two threads ([`Mdd::decide_cells`]) before its diagram
//! is built from the answers.
//!
//! Invariants: [`CellDecider::decide`] answers exactly what the manager's `decide_cell`
//! answered (that method now calls it) and counts the same evaluations; [`each_cell`] visits
//! the cells in the order `Mdd::enumerate` builds them (so answers listed in that order are
//! read back by the build in step); the counts of a parallel pass are the sums of its parts,
//! so `evaluations` / `unknown` (the reports' "classes examined") do not depend on how the
//! cells were split.

use crate::cell::Abs;
use crate::space::{Assign, ClassDesc, Space};
use attn_policy::eval::program::{NodeId, Program, Truth};
use attn_policy::facts::Value;

use super::manager::Mdd;

/// A cell whose concrete members number at most this is decided by evaluating each of them.
pub(super) const BRUTE_FORCE_MEMBERS: u128 = 64;

/// [`Mdd::count_members`] of a class whose members cannot be listed.
pub(super) const UNCOUNTABLE: u128 = u128::MAX;

/// A concrete member of a class: (class, integer member; None for a one-value class).
pub(super) type Member = (u32, Option<i64>);

/// Cells of one atom from which its cells are decided on two threads (below, the second
/// thread costs more than it saves).
const PARALLEL_CELLS: usize = 50_000;

/// Evaluations made while deciding cells (added to the manager's counters).
#[derive(Default, Clone, Copy)]
pub(super) struct Tally {
    pub(super) evaluations: u64,
    pub(super) unknown: u64,
}

/// What deciding atom `id` on cells reads: per var of `vars`, its blocks, their hulls and
/// whether each is one member; the classes' member counts.
pub(super) struct CellDecider<'a> {
    pub(super) space: &'a Space,
    pub(super) prog: &'a Program,
    pub(super) id: NodeId,
    pub(super) vars: &'a [usize],
    pub(super) blocks: &'a [Vec<Vec<u32>>],
    pub(super) hulls: &'a [Vec<Abs>],
    pub(super) counts: &'a [Box<[u128]>],
    /// Per var, per block: one class of one member (its value is exact).
    single: Vec<Vec<bool>>,
    /// Per slot the atom reads that is a var of `vars` with no object: its abstract value
    /// per block (what `decide`'s general lookup answers there, made once per atom).
    plain: Vec<(usize, usize, Vec<Abs>)>,
    /// Per var, per block: its members' count when at most `BRUTE_FORCE_MEMBERS` and
    /// countable (None: the cell is not brute-forced, as [`members_of`] would find).
    block_members: Vec<Vec<Option<u128>>>,
}

impl<'a> CellDecider<'a> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        space: &'a Space,
        prog: &'a Program,
        id: NodeId,
        vars: &'a [usize],
        blocks: &'a [Vec<Vec<u32>>],
        hulls: &'a [Vec<Abs>],
        counts: &'a [Box<[u128]>],
    ) -> CellDecider<'a> {
        let single = vars
            .iter()
            .zip(blocks)
            .map(|(&v, bs)| {
                bs.iter()
                    .map(|b| {
                        b.len() == 1 && space.int_members(v, b[0]).is_none_or(|(f, l, _)| f == l)
                    })
                    .collect()
            })
            .collect::<Vec<Vec<bool>>>();
        let mut slots = Vec::new();
        crate::space::slots_under(prog, id, &mut slots);
        slots.sort_unstable();
        slots.dedup();
        let plain = slots
            .into_iter()
            .filter_map(|s| {
                // A fact that is its own var, without an object: single blocks read their
                // class's value, others the block's hull.
                let [v] = space.deps[s][..] else { return None };
                if space.vars[v].slot != s || space.vars[v].parent.is_some() {
                    return None;
                }
                let i = vars.iter().position(|&u| u == v)?;
                let abs = blocks[i]
                    .iter()
                    .enumerate()
                    .map(|(k, b)| {
                        if single[i][k] {
                            Abs::Exact(space.vars[v].classes[b[0] as usize].value)
                        } else {
                            hulls[i][k]
                        }
                    })
                    .collect();
                Some((s, i, abs))
            })
            .collect();
        let block_members = vars
            .iter()
            .zip(blocks)
            .map(|(&v, bs)| {
                bs.iter()
                    .map(|b| members_within(&counts[v], b, BRUTE_FORCE_MEMBERS))
                    .collect()
            })
            .collect();
        CellDecider {
            space,
            prog,
            id,
            vars,
            blocks,
            hulls,
            counts,
            single,
            plain,
            block_members,
        }
    }

    /// Whether the atom is constant on a cell (per var, the classes of its block), and its
    /// value there; None when it is not, or not provably so. Intervals and congruences
    /// first (cheap); undecided small cells are then decided member by member.
    pub(super) fn decide(
        &self,
        asg: &Assign,
        cell: &[usize],
        tally: &mut Tally,
        vals: &mut Vec<Value>,
    ) -> Option<bool> {
        tally.evaluations += 1;
        let (space, vars) = (self.space, self.vars);
        // Every fact's value is needed only for derived facts (`sm` -> compute capability).
        let all = std::cell::OnceCell::new();
        let single = |i: usize| cell[i] == usize::MAX || self.single[i][cell[i]];
        let fact = |s: usize| -> Abs {
            if let Some((_, i, abs)) = self.plain.iter().find(|p| p.0 == s) {
                return abs[cell[*i]];
            }
            let deps = &space.deps[s];
            let pos = |v: usize| vars.iter().position(|&u| u == v);
            let plain = deps.last().filter(|&&v| space.vars[v].slot == s);
            if deps.iter().all(|&v| pos(v).is_none_or(single)) {
                return Abs::Exact(match (deps.is_empty(), plain) {
                    (true, _) => space.default_value(s),
                    (false, Some(&v)) => space.value_of(asg, v),
                    (false, None) => all.get_or_init(|| {
                        let mut vals = Vec::new();
                        space.materialize(asg, &mut vals);
                        vals
                    })[s],
                });
            }
            match plain {
                Some(&v) => match pos(v) {
                    Some(i) if cell[i] == usize::MAX => Abs::Exact(Value::Null),
                    Some(i) => self.hulls[i][cell[i]],
                    None => Abs::Any,
                },
                None => Abs::Any,
            }
        };
        let t = crate::cell::eval(self.prog, self.id, &fact).truth();
        if t.is_some() {
            return t;
        }
        // Small cells: every concrete member. Most cells are too large: the count per
        // block, made once, says so without listing.
        let mut count: u128 = 1;
        for (i, &k) in cell.iter().enumerate() {
            if k == usize::MAX {
                continue;
            }
            count = count.saturating_mul(self.block_members[i][k]?.max(1));
            if count > BRUTE_FORCE_MEMBERS {
                return None;
            }
        }
        let classes =
            |i: usize| (cell[i] != usize::MAX).then(|| self.blocks[i][cell[i]].as_slice());
        let members = members_of(space, self.counts, vars, &classes, BRUTE_FORCE_MEMBERS)?;
        let mut seen = [false, false];
        each_member(space, vars, asg, &members, vals, &mut |vals| {
            tally.evaluations += 1;
            match Truth::of(self.prog.eval(self.id, vals)) {
                Truth::True => seen[1] = true,
                Truth::False => seen[0] = true,
                Truth::Unknown => {
                    tally.unknown += 1;
                    seen[0] = true;
                }
            }
            seen[0] && seen[1]
        });
        match seen {
            [true, true] => None,
            [_, t] => Some(t),
        }
    }
}

impl<'s> Mdd<'s> {
    /// The [`CellDecider`] of atom `id` of program `prog` over `vars` / `blocks`.
    pub(super) fn cell_decider<'a>(
        &'a self,
        prog: usize,
        id: NodeId,
        vars: &'a [usize],
        blocks: &'a [Vec<Vec<u32>>],
        hulls: &'a [Vec<Abs>],
    ) -> CellDecider<'a> {
        let counts = self.member_counts.get_or_init(|| self.count_members());
        CellDecider::new(
            self.space,
            &self.progs[prog],
            id,
            vars,
            blocks,
            hulls,
            counts,
        )
    }

    /// Adds a [`Tally`] to the manager's evaluation counts.
    pub(super) fn count(&mut self, tally: Tally) {
        self.evaluations += tally.evaluations;
        self.unknown += tally.unknown;
    }

    /// [`CellDecider::decide`] of every cell `enumerate` visits over `vars` / `blocks`, in
    /// that order; the evaluations counted as one `decide_cell` per cell would. Large atoms
    /// (TE's per-step lengths over the cp sizes: 68^3 cells) are split over two threads.
    pub(super) fn decide_cells(
        &mut self,
        prog: usize,
        id: NodeId,
        vars: &[usize],
        blocks: &[Vec<Vec<u32>>],
        hulls: &[Vec<Abs>],
    ) -> Vec<Option<bool>> {
        let mut n = 0usize;
        each_cell(self.space, vars, blocks, &mut |_, _| {
            n += 1;
            true
        });
        let d = self.cell_decider(prog, id, vars, blocks, hulls);
        let part = |from: usize, to: usize| {
            let (mut out, mut tally, mut vals) =
                (Vec::with_capacity(to - from), Tally::default(), Vec::new());
            let mut at = 0usize;
            each_cell(d.space, vars, blocks, &mut |asg, cell| {
                if at >= from {
                    out.push(d.decide(asg, cell, &mut tally, &mut vals));
                }
                at += 1;
                at < to
            });
            (out, tally)
        };
        let (decided, tally) = if n < PARALLEL_CELLS {
            part(0, n)
        } else {
            std::thread::scope(|s| {
                let second = s.spawn(|| part(n / 2, n));
                let (mut out, a) = part(0, n / 2);
                let (rest, b) = second.join().expect("deciding cells does not panic");
                out.extend(rest);
                let tally = Tally {
                    evaluations: a.evaluations + b.evaluations,
                    unknown: a.unknown + b.unknown,
                };
                (out, tally)
            })
        };
        self.count(tally);
        decided
    }
}

/// Visits the cells over `vars` (one block per var; `usize::MAX` where the var's object is
/// absent) in the order `Mdd::enumerate` builds them, with the blocks' representatives
/// assigned, until `visit` answers false.
pub(super) fn each_cell(
    space: &Space,
    vars: &[usize],
    blocks: &[Vec<Vec<u32>>],
    visit: &mut dyn FnMut(&Assign, &[usize]) -> bool,
) {
    let mut assign: Assign = vec![None; space.vars.len()];
    let mut cell = vec![usize::MAX; vars.len()];
    each_cell_from(space, vars, blocks, 0, &mut assign, &mut cell, visit);
}

fn each_cell_from(
    space: &Space,
    vars: &[usize],
    blocks: &[Vec<Vec<u32>>],
    i: usize,
    assign: &mut Assign,
    cell: &mut Vec<usize>,
    visit: &mut dyn FnMut(&Assign, &[usize]) -> bool,
) -> bool {
    if i == vars.len() {
        return visit(assign, cell);
    }
    let v = vars[i];
    if !space.available(assign, v) {
        return each_cell_from(space, vars, blocks, i + 1, assign, cell, visit);
    }
    let mut go = true;
    for (k, block) in blocks[i].iter().enumerate() {
        assign[v] = Some(block[0]);
        cell[i] = k;
        go = each_cell_from(space, vars, blocks, i + 1, assign, cell, visit);
        if !go {
            break;
        }
    }
    assign[v] = None;
    cell[i] = usize::MAX;
    go
}

/// How many concrete members `classes` of a var have together (`counts`: the var's per-class
/// counts); None when one is uncountable or the sum passes `limit`.
#[inline]
fn members_within(counts: &[u128], classes: &[u32], limit: u128) -> Option<u128> {
    let mut n: u128 = 0;
    for &c in classes {
        match counts[c as usize] {
            UNCOUNTABLE => return None,
            k => n += k,
        }
        if n > limit {
            return None;
        }
    }
    Some(n)
}

/// The concrete members of a cell, per var of `vars`: (class, member) pairs, the member
/// None for a class that is one value (not an integer class); no pair for a var without a
/// class (`classes` gives None: its object is absent). None when some class is an interval
/// of floats or versions, or the cell has more than `limit` members. `counts`: per var, per
/// class, its members' count.
pub(super) fn members_of<'c>(
    space: &Space,
    counts: &[Box<[u128]>],
    vars: &[usize],
    classes: &dyn Fn(usize) -> Option<&'c [u32]>,
    limit: u128,
) -> Option<Vec<Vec<Member>>> {
    // Counted first, without allocating: most cells are too large (this runs per cell of
    // every relational atom; building the lists first dominated compiling the te pack).
    let mut count: u128 = 1;
    for (i, &v) in vars.iter().enumerate() {
        let Some(classes) = classes(i) else { continue };
        let n = members_within(&counts[v], classes, limit)?;
        count = count.saturating_mul(n.max(1));
        if count > limit {
            return None;
        }
    }
    let mut members: Vec<Vec<Member>> = Vec::with_capacity(vars.len());
    let mut count: u128 = 1;
    for (i, &v) in vars.iter().enumerate() {
        let Some(classes) = classes(i) else {
            members.push(Vec::new());
            continue;
        };
        let mut ms = Vec::new();
        for &c in classes {
            match space.int_members(v, c) {
                Some((first, last, step)) => {
                    let n = ((last - first) / step) as u128 + 1;
                    if n > limit {
                        return None;
                    }
                    ms.extend((0..n as i64).map(|k| (c, Some(first + k * step))));
                    // The count is at least this var's members: stop early.
                    if ms.len() as u128 > limit {
                        return None;
                    }
                }
                None => {
                    if let ClassDesc::Ordered { lo, hi } = &space.vars[v].classes[c as usize].desc
                        && lo != hi
                    {
                        return None;
                    }
                    ms.push((c, None));
                    if ms.len() as u128 > limit {
                        return None;
                    }
                }
            }
        }
        count = count.saturating_mul(ms.len().max(1) as u128);
        if count > limit {
            return None;
        }
        members.push(ms);
    }
    Some(members)
}

/// Calls `visit` with the fact values of each combination of one member per var of
/// [`members_of`] (the other facts as `asg` gives them), until it answers true. `vals` is
/// scratch space.
pub(super) fn each_member(
    space: &Space,
    vars: &[usize],
    asg: &Assign,
    members: &[Vec<Member>],
    vals: &mut Vec<Value>,
    visit: &mut dyn FnMut(&[Value]) -> bool,
) {
    let mut idx = vec![0usize; vars.len()];
    let mut a = asg.clone();
    let mut values: Vec<(usize, Value)> = Vec::new();
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
        space.materialize_with(&a, &values, vals);
        if visit(vals) || !next_combination(&mut idx, members) {
            break;
        }
    }
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
