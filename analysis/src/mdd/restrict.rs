//! Cofactors and supports: diagrams with some vars fixed to one class each (the cells of
//! `attn-policy matrix`, see `crate::matrix::grid`), the vars a diagram still tests, and the
//! value of a relation variable where the facts it reads are fixed.
//!
//! Invariants: [`Mdd::restrict_all`] returns, per diagram, the cofactor: the function with
//! every pinned var replaced by its class, a diagram that tests no pinned var. A reduced,
//! canonical diagram tests exactly the vars its function depends on, so [`Mdd::support`] of a
//! cofactor is the set of vars that can change it (over the classes: relation variables count
//! as variables here; `matrix::grid` resolves those the cell decides first).
//!
//! Complexity: `restrict_all` visits each node reachable from its inputs once (one memo for
//! all of them); `support` likewise.

use crate::space::ClassDesc;
use attn_policy::eval::program::Truth;
use attn_policy::facts::Value;

use super::bits::Bits;
use super::manager::Mdd;
use super::rel::Rel;
use super::store::{FALSE, HashMap, Id, TRUE};

/// Cubes of an outcome's cover tried for an example before it is reported unverified.
const EXAMPLE_CUBES: usize = 16;

/// Per diagram var, the class it is fixed to (`None`: free). Indexed like a [`super::Cube`].
pub type Pins = [Option<u32>];

impl<'s> Mdd<'s> {
    /// The cofactors of `xs`: each var `v` with `pins[v] == Some(c)` fixed to class `c`.
    pub fn restrict_all(&mut self, xs: &[Id], pins: &Pins) -> Vec<Id> {
        let mut memo: HashMap<Id, Id> = HashMap::default();
        xs.iter()
            .map(|&x| self.restrict_in(x, pins, &mut memo))
            .collect()
    }

    fn restrict_in(&mut self, x: Id, pins: &Pins, memo: &mut HashMap<Id, Id>) -> Id {
        if x <= TRUE {
            return x;
        }
        if let Some(&r) = memo.get(&x) {
            return r;
        }
        let level = self.node_level(x);
        let v = self.order[level as usize];
        let r = match pins.get(v).copied().flatten() {
            Some(c) => {
                let child = self
                    .edges(x)
                    .find(|(_, set)| set[(c / 64) as usize] & (1 << (c % 64)) != 0)
                    .map_or(FALSE, |e| e.0);
                self.restrict_in(child, pins, memo)
            }
            None => {
                let edges: Vec<(Id, Bits)> = self
                    .edges(x)
                    .map(|(k, set)| (k, Bits::from_words(set)))
                    .collect();
                let mut out = Vec::with_capacity(edges.len());
                for (k, set) in edges {
                    out.push((self.restrict_in(k, pins, memo), set));
                }
                self.mk(level, out)
            }
        };
        memo.insert(x, r);
        r
    }

    /// The diagram vars some of `xs` tests, ascending.
    pub fn support(&self, xs: &[Id]) -> Vec<usize> {
        let mut seen = std::collections::HashSet::new();
        let mut vars = std::collections::BTreeSet::new();
        let mut stack: Vec<Id> = xs.iter().copied().filter(|&x| x > TRUE).collect();
        while let Some(x) = stack.pop() {
            if !seen.insert(x) {
                continue;
            }
            vars.insert(self.order[self.node_level(x) as usize]);
            stack.extend(self.edges(x).map(|e| e.0).filter(|&k| k > TRUE));
        }
        vars.into_iter().collect()
    }

    /// The space vars relation variable `r` (a diagram var) reads, objects included.
    pub fn relation_facts(&self, r: usize) -> Vec<usize> {
        self.rel_vars(r - self.space.vars.len())
    }

    /// Whether class `c` of fact var `v` holds one value (a point), so that a relation over
    /// it can be evaluated.
    fn is_point(&self, v: usize, c: u32) -> bool {
        match &self.space.vars[v].classes[c as usize].desc {
            ClassDesc::Int { .. } => self
                .space
                .int_members(v, c)
                .is_some_and(|(first, last, _)| first == last),
            ClassDesc::Ordered { lo, hi } => matches!(
                (lo, hi),
                (Some((a, true)), Some((b, true))) if a == b
            ),
            _ => true,
        }
    }

    /// The class of relation variable `r` (a diagram var) when every fact it reads is pinned
    /// to a one-value class: the ordering of the two values, or the predicate's truth. None
    /// when some fact is free, or a side is null (no diagram tests the relation there).
    pub fn relation_at(&mut self, r: usize, pins: &Pins) -> Option<u32> {
        let facts = self.relation_facts(r);
        let mut assign = vec![None; self.space.vars.len()];
        for &v in &facts {
            let c = pins.get(v).copied().flatten()?;
            if !self.is_point(v, c) {
                return None;
            }
            assign[v] = Some(c);
        }
        let mut vals = Vec::new();
        self.space.materialize(&assign, &mut vals);
        self.relation_on(r - self.space.vars.len(), &vals)
    }

    /// The class of relation `k` (an index into `rels`) on slot values `vals`; None where it
    /// reads a null or its predicate is unknown.
    pub(super) fn relation_on(&self, k: usize, vals: &[Value]) -> Option<u32> {
        match self.rels[k].clone() {
            Rel::Ord { x, y } => {
                let (Value::Int(a), Value::Int(b)) =
                    (vals[self.space.vars[x].slot], vals[self.space.vars[y].slot])
                else {
                    return None;
                };
                Some(match a.cmp(&b) {
                    std::cmp::Ordering::Less => 0,
                    std::cmp::Ordering::Equal => 1,
                    std::cmp::Ordering::Greater => 2,
                })
            }
            Rel::Pred { prog, node, .. } => match Truth::of(self.progs[prog].eval(node, vals)) {
                Truth::True => Some(1),
                Truth::False => Some(0),
                Truth::Unknown => None,
            },
        }
    }

    /// The class of relation variable `r` that its tie allows under `pins`, when it allows
    /// only one (the pinned facts decide the relation although some fact it reads is free).
    pub fn forced_relation(&mut self, r: usize, pins: &Pins) -> Option<u32> {
        let tie = self.tie(r);
        let tie = self.restrict_all(&[tie], pins)[0];
        let mut allowed = Vec::new();
        for c in 0..self.ncls[r] as u32 {
            let mut one = pins.to_vec();
            one.resize(self.nvars(), None);
            one[r] = Some(c);
            if self.restrict_all(&[tie], &one)[0] != FALSE {
                allowed.push(c);
            }
        }
        match allowed[..] {
            [c] => Some(c),
            _ => None,
        }
    }
}

impl<'s> Mdd<'s> {
    /// The diagram of the cube the pins describe (pinned vars at their class, others free).
    pub fn pins_cube(&mut self, pins: &Pins) -> Id {
        let cube: super::manager::Cube = (0..self.nvars())
            .map(|v| {
                pins.get(v).copied().flatten().map(|c| {
                    let mut b = super::bits::Bits::empty(self.ncls[v]);
                    b.insert(c);
                    b
                })
            })
            .collect();
        self.cube(&cube)
    }

    /// An input of `f` (none when `f` holds none): per cube of `f`'s cover in turn (relation
    /// variables tied to the facts on the way; at most `EXAMPLE_CUBES`), each fact it
    /// constrains at the class of `near` when that class is allowed and no relation in the
    /// cube reads the fact, then a bounded search for members (see `witness`); the cube as it
    /// is when that finds none. A cube may hold no input (two predicates over the same facts
    /// that only the members tell apart); another cube of the cover may. None when no cube
    /// gave an input.
    pub fn example_near(
        &mut self,
        f: Id,
        near: &Pins,
    ) -> Option<(crate::space::Assign, Vec<(usize, Value)>)> {
        let (cubes, _) = self.cover(f, EXAMPLE_CUBES);
        let nv = self.space.vars.len();
        for cube in cubes {
            let mut literal_reads: Vec<usize> = Vec::new();
            for (r, set) in cube.iter().enumerate().take(self.nvars()).skip(nv) {
                if set.as_ref().is_some_and(|s| s.len() < self.ncls[r]) {
                    literal_reads.extend(self.relation_facts(r));
                }
            }
            let mut narrowed = cube.clone();
            for v in 0..nv {
                let (Some(set), Some(c)) = (&cube[v], near.get(v).copied().flatten()) else {
                    continue;
                };
                if set.classes().contains(&c) && set.len() > 1 && !literal_reads.contains(&v) {
                    let mut b = super::bits::Bits::empty(self.ncls[v]);
                    b.insert(c);
                    narrowed[v] = Some(b);
                }
            }
            if let Some(found) = self.example(&narrowed).or_else(|| self.example(&cube)) {
                return Some(found);
            }
        }
        None
    }
}
