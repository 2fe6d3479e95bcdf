//! Combinations no input has, found along one path of the cover.
//!
//! A tie decides a predicate per block when its facts have too many combinations of classes,
//! and the ties of two predicates are independent; a path of the cover may then constrain
//! predicate variables in a way no concrete input meets. Before a path becomes a region,
//! `cover` removes such combinations:
//!
//! - [`Mdd::contrary_on_path`]: one predicate decided against its required value on the
//!   path's own classes (per class, not per block);
//! - [`Mdd::jointly_contrary`]: two predicates over common facts whose required values no
//!   member meets together: recognised symbolically when both compare the same expression
//!   with constants (`e > 64` and not `e > 40`), else member by member on cells of at most
//!   `JOINT_MEMBERS` concrete members.
//!
//! Invariants: every diagram returned here holds only combinations that contain no input (so
//! removing it from a result removes no input) and meets the path (so removing it makes
//! progress). None means nothing was found, or the cells were too many to look at
//! (`TIE_CELL_LIMIT` cells per path).

use crate::space::Assign;
use attn_policy::eval::program::{Node as PNode, NodeId, Truth};
use attn_policy::facts::Value;

use super::bits::Bits;
use super::manager::{Cube, Mdd, TIE_CELL_LIMIT};
use super::rel::Rel;
use super::relations::flip;
use super::store::{FALSE, Id, TRUE};

/// Members enumerated per cell when looking for a member two predicates agree on.
const JOINT_MEMBERS: u128 = 4096;

/// What `Mdd::contrary_cells` asks of each cell on the path: the cell's representatives and
/// block index per var; the contrary combinations there, if any.
type CellTest<'a, 's> = dyn FnMut(&mut Mdd<'s>, &Assign, &[usize]) -> Option<Id> + 'a;

impl<'s> Mdd<'s> {
    /// For predicate variable `r` restricted to `set` on a path (`cube`): the combinations of
    /// the path's classes of its facts where the predicate is decided against `set`, with
    /// `r` in `set` (None: there are none, or too many combinations to look at).
    pub(super) fn contrary_on_path(&mut self, r: usize, set: &Bits, cube: &Cube) -> Option<Id> {
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
        let hulls = self.block_hulls(&vars, &blocks);
        self.contrary_cells(&vars, &blocks, cube, &mut |m, asg, cell| {
            let decided = m.decide_cell(prog, node, &vars, &blocks, &hulls, asg, cell)?;
            (decided != want).then(|| m.literal(r, want, TRUE))
        })
    }

    /// Two predicates a path constrains that read common facts, and whose required values no
    /// member of the path's classes meets together (`b * h > 64` and not `b * h > 40`): the
    /// combinations of those classes with those values, which hold no input. Only cells small
    /// enough to enumerate every member are looked at.
    pub(super) fn jointly_contrary(&mut self, cube: &Cube) -> Option<Id> {
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
                    return Some(self.both_literals(a, b));
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
        let side = |m: &Self, v: usize| -> Option<(String, attn_policy::lang::ast::CmpOp, i64)> {
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
            attn_policy::eval::program::compare(oa, e, Value::Int(ca)) == a.1
                && attn_policy::eval::program::compare(ob, e, Value::Int(cb)) == b.1
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
        self.contrary_cells(vars, &blocks, cube, &mut |m, asg, _| {
            m.no_member_meets(vars, asg, &[(pa, a.1), (pb, b.1)])
                .then(|| m.both_literals(a, b))
        })
    }

    /// The diagram over `vars` (blocks of [`Mdd::path_blocks`]) that is what `contrary`
    /// answers on the path's cells, false elsewhere; None when it answers nowhere.
    fn contrary_cells(
        &mut self,
        vars: &[usize],
        blocks: &[Vec<Vec<u32>>],
        cube: &Cube,
        contrary: &mut CellTest<'_, 's>,
    ) -> Option<Id> {
        let mut any = false;
        let bad = self.enumerate(vars, blocks, &mut |m, asg, cell| {
            if !on_path(vars, blocks, cell, cube) {
                return FALSE;
            }
            match contrary(m, asg, cell) {
                Some(hit) => {
                    any = true;
                    hit
                }
                None => FALSE,
            }
        });
        any.then_some(bad)
    }

    /// Where predicate variable `r` is `want`, continuing to `then` (false elsewhere).
    fn literal(&mut self, r: usize, want: bool, then: Id) -> Id {
        self.rel_node(r, &if want { [FALSE, then] } else { [then, FALSE] })
    }

    /// Where both literals (predicate variable, wanted value) hold, in diagram order.
    fn both_literals(&mut self, a: (usize, bool), b: (usize, bool)) -> Id {
        let (first, second) = if self.level[a.0] < self.level[b.0] {
            (a, b)
        } else {
            (b, a)
        };
        let inner = self.literal(second.0, second.1, TRUE);
        self.literal(first.0, first.1, inner)
    }

    /// Whether no member of the classes `asg` gives `vars` makes every atom take its wanted
    /// value; false also when the members are too many to enumerate.
    fn no_member_meets(
        &mut self,
        vars: &[usize],
        asg: &Assign,
        atoms: &[((usize, NodeId), bool)],
    ) -> bool {
        let one_class: Vec<Option<[u32; 1]>> = vars.iter().map(|&v| asg[v].map(|c| [c])).collect();
        let classes = |i: usize| one_class[i].as_ref().map(|c| c.as_slice());
        let Some(members) = self.cell_members(vars, &classes, JOINT_MEMBERS) else {
            return false;
        };
        let mut met = false;
        self.for_each_member(vars, asg, &members, &mut |m, vals| {
            met = atoms.iter().all(|&((prog, node), want)| {
                (Truth::of(m.progs[prog].eval(node, vals)) == Truth::True) == want
            });
            met
        });
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
