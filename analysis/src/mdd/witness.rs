//! A concrete input inside a region: the example `gaps` and `diff` print for it.
//!
//! Facts the cube constrains take their first allowed class; free facts keep their defaults.
//! Where the cube constrains relation variables (*literals*), a depth-first search chooses
//! classes and members of the facts they read, in diagram order, checking each literal as soon
//! as all its facts are chosen (`due`), and trying values near those already chosen first
//! (equal, off by one, doubled, halved: what relations between facts need); when that finds
//! nothing, once more with numbers of many divisors last (what several remainders need
//! together).
//!
//! Invariants: an answer satisfies every literal of the cube (each is evaluated on the
//! concrete input); no answer means the search gave up after `WITNESS_TRIES` literal checks
//! or found none: it is not a proof that the region is empty. The search never changes the
//! diagrams; it only evaluates (and does not count into `evaluations`).

use crate::space::Assign;
use attn_policy::eval::program::Truth;
use attn_policy::facts::Value;

use super::bits::Bits;
use super::manager::Mdd;
use super::rel::Rel;

/// Candidate assignments tried when looking for a region's example.
const WITNESS_TRIES: usize = 200_000;

/// Integer candidates tried after all others: numbers divisible by every small number up to
/// 10 and beyond (the highly composite numbers up to 5040).
const HIGHLY_COMPOSITE: [i64; 12] = [12, 24, 36, 48, 60, 120, 180, 240, 360, 720, 2520, 5040];

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
    /// Also try members with many divisors ([`HIGHLY_COMPOSITE`]).
    composite: bool,
}

impl<'s> Mdd<'s> {
    /// An input inside the cube, as a class per constrained fact plus the values of some
    /// integer facts: the first class of each constrained fact; where the cube constrains
    /// relation variables, members found by a bounded search that satisfy them. Free facts
    /// stay unassigned (they keep their defaults). None when the search found no input (the
    /// cube may hold none: relation variables of atoms sharing facts are not tied together).
    pub fn example(&mut self, cube: &[Option<Bits>]) -> Option<(Assign, Vec<(usize, Value)>)> {
        let nv = self.space.vars.len();
        let assign: Assign = (0..nv)
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
        // A second search, with members of many divisors among the candidates, only when the
        // first finds nothing (the first's answers stay what they were).
        for composite in [false, true] {
            let mut values = Vec::new();
            let mut tries = 0;
            let mut search = Witness {
                lits: &lits,
                due: &due,
                involved: &involved,
                cube,
                tries: &mut tries,
                composite,
            };
            let mut trial = assign.clone();
            if self.witness(&mut search, 0, &mut trial, &mut values) {
                return Some((trial, values));
            }
        }
        None
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
        for (c, x) in self.candidates(v, cube, lits, values, w.composite) {
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
        composite: bool,
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
        if self.ordered_candidates(v, &allowed, lits, values, &mut out) {
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
                    self.push_member(v, &allowed, x, &mut out);
                }
            }
        }
        for &c in &allowed {
            match self.space.int_members(v, c) {
                Some((first, last, step)) => {
                    for k in [0i64, 1, 2, 3, 4, 8, 16] {
                        let x = first.saturating_add(k.saturating_mul(step));
                        if x <= last {
                            self.push_member(v, &allowed, x, &mut out);
                        }
                    }
                    // Doublings (kept small: examples should read like real inputs).
                    let mut t = first.max(1);
                    while t < last / 2 && t < 1 << 30 {
                        t *= 2;
                        self.push_member(v, &allowed, t + (first - t).rem_euclid(step), &mut out);
                    }
                    self.push_member(v, &allowed, last, &mut out);
                }
                None => out.push((c, None)),
            }
        }
        // Last (in the second search), members with many divisors: remainders by several
        // facts (`h % g == 0` and `h % cp == 0` together) need a common multiple, which the
        // members above rarely are.
        if composite {
            for x in HIGHLY_COMPOSITE {
                self.push_member(v, &allowed, x, &mut out);
            }
        }
        out
    }

    /// Candidates for integer var `v` from orderings with a fact already chosen (value w):
    /// per allowed class, the member nearest to w on the required side (or w itself), so the
    /// literal holds at once; no other member could do better for it. False when no ordering
    /// relates `v` to a chosen fact (then `out` is unchanged).
    fn ordered_candidates(
        &self,
        v: usize,
        allowed: &[u32],
        lits: &[(usize, Vec<u32>)],
        values: &[(usize, Value)],
        out: &mut Vec<(u32, Option<i64>)>,
    ) -> bool {
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
            for &c in allowed {
                let Some((first, last, step)) = self.space.int_members(v, c) else {
                    continue;
                };
                for &o in set {
                    // Ordering o of (x, y): v above w when (v is y and x < y) or
                    // (v is x and x > y).
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
                        self.push_member(v, allowed, m, out);
                    }
                }
            }
        }
        directed
    }

    /// Adds member `x` of var `v` as a candidate when a class the cube allows holds it and it
    /// is not a candidate yet.
    fn push_member(&self, v: usize, allowed: &[u32], x: i64, out: &mut Vec<(u32, Option<i64>)>) {
        if let Some(c) = self.space.class_of(v, Value::Int(x))
            && allowed.contains(&(c as u32))
            && !out.iter().any(|o| o.1 == Some(x))
        {
            out.push((c as u32, Some(x)));
        }
    }
}
