//! Cube queries and diagrams as covers by cubes (the regions of `gaps` and `diff`).
//!
//! A [`Cube`] has one entry per diagram var (facts, then relation variables): the classes it
//! allows, `None` for any class.
//!
//! [`Mdd::cover`] / [`Mdd::cover_disjoint`] list cubes whose union, *in inputs*, is exactly
//! `f`: every input in `f` lies in some cube and every input in a cube lies in `f`. Loop
//! invariants of `cover_within`: `rest` is the part of `f` not yet covered, intersected with
//! the ties applied so far and with the complements of the contrary combinations removed
//! (neither removes an input); a cube starts as the widest path of `rest` and is widened only
//! inside `care` = (`rest` for a disjoint cover, else `f`) or not `ties`, so it never adds an
//! input outside `f` (it may widen over combinations no input has). A path is listed only
//! after every relation variable it tests has its tie applied and no contrary combination is
//! found on it, so each listed path holds an input (up to the limits of `contrary`). Disjoint
//! covers widen inside `rest`, so their cubes do not overlap on inputs.
//!
//! Determinism: paths pick the edge with the most classes, ties broken by the lowest class,
//! never by node ids, so the cover depends only on the function and the order.
//!
//! Complexity: `holds_on` / `meets` are O(nodes of `x`) with a reusable memo; `expand` (in
//! `widen`) runs `allowed` once per constrained var, each a traversal memoised per node.

use attn_policy::facts::Value;

use super::bits::Bits;
use super::bits::{words_first, words_len, words_meet};
use super::manager::{Cube, Mdd};
use super::memos::PairMemos;
use super::store::{FALSE, HashMap, Id, NodeMemo, TRUE};

/// Satisfiability questions [`Mdd::widest_path_and`] may ask before it gives up.
const LAZY_SAT_CALLS: usize = 50_000;

/// Steps of the first, bounded, try at each question of `conjunctions_equal`.
const QUICK_SAT_STEPS: u64 = 2_000;

impl<'s> Mdd<'s> {
    /// Whether the input with slot values `vals` lies in the cube: each fact's class is among
    /// the cube's, and so is each relation variable's value (an ordering or predicate
    /// evaluated on `vals`; a relation that reads a null or unknown value constrains nothing).
    pub fn holds_point(&self, cube: &[Option<Bits>], vals: &[Value]) -> bool {
        let nv = self.space.vars.len();
        for (i, allowed) in cube.iter().enumerate() {
            let Some(allowed) = allowed else { continue };
            let class = if i < nv {
                match self.fact_class(i, vals) {
                    Some(c) => c,
                    None => return false,
                }
            } else {
                self.relation_on(i - nv, vals)
            };
            if class.is_some_and(|c| !allowed.has(c)) {
                return false;
            }
        }
        true
    }

    /// The cube of one input: each fact's class and each relation variable's value on `vals`
    /// (a relation it cannot evaluate left open). None when a value is in no class.
    pub fn point_cube(&self, vals: &[Value]) -> Option<Cube> {
        let nv = self.space.vars.len();
        let mut cube = Vec::with_capacity(self.nvars());
        for i in 0..self.nvars() {
            let class = if i < nv {
                self.fact_class(i, vals)?
            } else {
                self.relation_on(i - nv, vals)
            };
            cube.push(class.map(|c| {
                let mut b = Bits::empty(self.ncls[i]);
                b.insert(c);
                b
            }));
        }
        Some(cube)
    }

    /// The path of `f` that the input of `point` (a [`Mdd::point_cube`]) follows, as a cube:
    /// per var it tests, the class set of the edge taken (where `point` leaves a var open,
    /// the first edge that does not lead to false). None when that path ends in false.
    pub fn path_cube(&self, f: Id, point: &Cube) -> Option<Cube> {
        let mut cube: Cube = vec![None; self.nvars()];
        let mut x = f;
        while x != TRUE && x != FALSE {
            let v = self.order[self.node_level(x) as usize];
            let (next, set) = self.edges(x).find(|(k, set)| match &point[v] {
                Some(p) => words_meet(p.words(), set),
                None => *k != FALSE,
            })?;
            cube[v] = Some(Bits::from_words(set));
            x = next;
        }
        (x == TRUE).then_some(cube)
    }

    /// The class of fact var `i` on `vals`: Some(None) for a member of an absent object (it
    /// has no value to constrain), None for a value in no class.
    fn fact_class(&self, i: usize, vals: &[Value]) -> Option<Option<u32>> {
        let var = &self.space.vars[i];
        let v = vals[var.slot];
        if v == Value::Null && var.parent.is_some() {
            return Some(None);
        }
        self.space.class_of(i, v).map(|c| Some(c as u32))
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
        memo.clear(self.size());
        let r = self.everywhere(x, cube, want, &mut memo);
        self.scratch.set(memo);
        r
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
        let level = self.node_level(x);
        let v = self.order[level as usize];
        let c = cube.get(v).and_then(Option::as_ref);
        let r = self.all_children_meeting(x, level, c, |k| self.everywhere(k, cube, want, memo));
        memo.set_at(x, level, r);
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

    /// The first cube of [`Mdd::cover`] of `f` (None when `f` holds no input), for much less
    /// work: `cover`'s loop up to its first cube, without what is left to cover (`rest`, the
    /// ties intersected with `f`) ever built. Each path is the widest path of `f and ties`,
    /// walked on the pair ([`Mdd::widest_path_and`]), the same path as on the diagram of the
    /// conjunction; the ties and the contrary combinations are built as `cover` builds them
    /// (small diagrams), and the path is widened inside `f or not ties` as there. `check`'s
    /// W-NO-EXECUTOR example: intersecting its 300k-node `f` with two ties was most of `check`.
    /// The nodes it builds differ from `cover`'s, so not for `gaps` / `diff` (they print the
    /// count).
    pub fn first_cube(&mut self, f: Id) -> Option<Cube> {
        let nv = self.space.vars.len();
        let mut applied: Vec<usize> = Vec::new();
        let mut ties = TRUE;
        loop {
            if self.exhausted || !self.satisfiable(&[(f, true), (ties, true)]) {
                return None;
            }
            let mut cube = if ties == TRUE {
                self.widest_path(f)
            } else {
                match self.widest_path_and(f, ties) {
                    Some(cube) => cube,
                    None => {
                        let rest = self.and(f, ties);
                        self.widest_path(rest)
                    }
                }
            };
            let untied = self.untied(&cube, nv, &applied);
            if !untied.is_empty() {
                for k in untied {
                    let t = self.tie(nv + k);
                    ties = self.and(ties, t);
                    applied.push(k);
                }
                continue;
            }
            let mut refined = false;
            for v in nv..self.nvars() {
                let Some(set) = cube[v].clone() else { continue };
                if let Some(bad) = self.contrary_on_path(v, &set, &cube) {
                    let nb = self.not(bad);
                    ties = self.and(ties, nb);
                    refined = true;
                }
            }
            if !refined && let Some(bad) = self.jointly_contrary(&cube) {
                let nb = self.not(bad);
                ties = self.and(ties, nb);
                refined = true;
            }
            if refined {
                continue;
            }
            self.expand(f, ties, &mut cube);
            return Some(cube);
        }
    }

    /// [`Mdd::widest_path`] of `f and t` (which holds somewhere), walked on the pair without
    /// building the conjunction. At each level the pairs of edges whose children meet are
    /// grouped by the function of the children's conjunction (two are equal when neither
    /// differs from the other anywhere: [`Mdd::satisfiable`] on the literals), exactly the
    /// edges the conjunction's node has; a level where one group covers every class is one
    /// the conjunction does not test. So the path, and its classes, are those of
    /// `widest_path(and(f, t))`. None when the walk needed more than `LAZY_SAT_CALLS`
    /// satisfiability questions (the caller then builds the conjunction).
    pub(super) fn widest_path_and(&mut self, f: Id, t: Id) -> Option<Cube> {
        let mut cube: Cube = vec![None; self.nvars()];
        let mut calls = 0usize;
        let (mut x, mut y) = (f, t);
        loop {
            // One side true: the other is the conjunction, a diagram already.
            if x == TRUE || y == TRUE {
                let tail = self.widest_path(if x == TRUE { y } else { x });
                for (v, set) in tail.into_iter().enumerate() {
                    if set.is_some() {
                        cube[v] = set;
                    }
                }
                return Some(cube);
            }
            let level = self.node_level(x).min(self.node_level(y));
            let side = |m: &Self, z: Id| -> Vec<(Id, Bits)> {
                if m.node_level(z) == level {
                    m.edges(z).map(|(k, s)| (k, Bits::from_words(s))).collect()
                } else {
                    vec![(z, m.full[level as usize].clone())]
                }
            };
            let (ex, ey) = (side(self, x), side(self, y));
            // Per distinct child function: a representative pair and its classes.
            let mut groups: Vec<(Id, Id, Bits)> = Vec::new();
            for (kx, sx) in &ex {
                for (ky, sy) in &ey {
                    let Some(set) = sx.and(sy) else { continue };
                    let (kx, ky) = (*kx, *ky);
                    if kx == FALSE || ky == FALSE {
                        continue;
                    }
                    if kx != TRUE && ky != TRUE {
                        calls += 1;
                        if !self.satisfiable(&[(kx, true), (ky, true)]) {
                            continue;
                        }
                    }
                    let mut found = None;
                    for (g, &(gx, gy, _)) in groups.iter().enumerate() {
                        if self.conjunctions_equal((kx, ky), (gx, gy), &mut calls) {
                            found = Some(g);
                            break;
                        }
                    }
                    match found {
                        Some(g) => groups[g].2.or_words(set.words()),
                        None => groups.push((kx, ky, set)),
                    }
                    if calls > LAZY_SAT_CALLS {
                        return None;
                    }
                }
            }
            let covered: usize = groups.iter().map(|g| g.2.len()).sum();
            let Some(&(gx, gy, ref set)) = groups
                .iter()
                .max_by_key(|g| (g.2.len(), std::cmp::Reverse(words_first(g.2.words()))))
            else {
                // `f and t` holds somewhere (the caller asked), so some pair meets.
                return None;
            };
            if !(groups.len() == 1 && covered == self.full[level as usize].len()) {
                cube[self.order[level as usize]] = Some(set.clone());
            }
            (x, y) = (gx, gy);
        }
    }

    /// Whether `a.0 and a.1` and `b.0 and b.1` are the same function (neither holds where the
    /// other does not), counting the satisfiability questions asked in `calls`.
    fn conjunctions_equal(&mut self, a: (Id, Id), b: (Id, Id), calls: &mut usize) -> bool {
        if a == b {
            return true;
        }
        // Canonical diagrams: equal functions are equal ids.
        if a.1 == b.1 && (a.1 == TRUE || a.0 == b.0) {
            return a.0 == b.0;
        }
        if a.0 == b.0 && a.0 == TRUE {
            return a.1 == b.1;
        }
        // `p and not z` for each side `p` and each diagram `z` of the other: the functions
        // differ iff one of these holds somewhere. A difference is usually found in a few
        // steps, a proof of none walks the whole product: every question is first asked with
        // a few steps, so one that finds a difference spares the others' proofs.
        let questions: Vec<[(Id, bool); 3]> = [(a, b), (b, a)]
            .into_iter()
            .flat_map(|(p, q)| [q.0, q.1].map(|z| [(p.0, true), (p.1, true), (z, false)]))
            .filter(|q| q[2].0 != TRUE)
            .collect();
        let mut open = Vec::new();
        for q in questions {
            *calls += 1;
            match self.satisfiable_within(&q, QUICK_SAT_STEPS) {
                Some(true) => return false,
                Some(false) => {}
                None => open.push(q),
            }
        }
        for q in open {
            *calls += 1;
            if self.satisfiable(&q) {
                return false;
            }
        }
        true
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
            let untied = self.untied(&cube, nv, &applied);
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
                    self.exclude(bad, &mut ties, &mut rest);
                    refined = true;
                }
            }
            if !refined && let Some(bad) = self.jointly_contrary(&cube) {
                self.exclude(bad, &mut ties, &mut rest);
                refined = true;
            }
            if refined {
                continue;
            }
            if out.len() >= limit {
                return (out, false);
            }
            // Widened inside `care or not ties`, walked on the pair: building that `or` cost
            // more than the rest of the cover (check's W-NO-EXECUTOR example).
            let care = if disjoint { rest } else { f };
            self.expand(care, ties, &mut cube);
            let c = self.cube(&cube);
            rest = self.minus(rest, c);
            out.push(cube);
        }
    }

    /// Removes `bad` (combinations that hold no input) from the applied ties and from what
    /// is left to cover.
    fn exclude(&mut self, bad: Id, ties: &mut Id, rest: &mut Id) {
        let nb = self.not(bad);
        *ties = self.and(*ties, nb);
        *rest = self.and(*rest, nb);
    }

    /// A path of `x` to true, taking at each node the edge with the most classes.
    /// The predicates (numbered from the first predicate variable `nv`) that `cube` constrains
    /// and whose tie is not applied yet.
    fn untied(&self, cube: &Cube, nv: usize, applied: &[usize]) -> Vec<usize> {
        (nv..self.nvars())
            .filter(|&v| cube[v].is_some() && !applied.contains(&(v - nv)))
            .map(|v| v - nv)
            .collect()
    }

    fn widest_path(&self, mut x: Id) -> Cube {
        let mut cube = vec![None; self.nvars()];
        while x > TRUE {
            let (k, set) = self
                .edges(x)
                .filter(|e| e.0 != FALSE)
                // Ties go to the lowest class, not the child's id: the cover then depends
                // only on the function, not on the order its nodes were built in.
                .max_by_key(|e| (words_len(e.1), std::cmp::Reverse(words_first(e.1))))
                .expect("a non-false node has a non-false edge");
            cube[self.order[self.node_level(x) as usize]] = Some(Bits::from_words(set));
            x = k;
        }
        cube
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
}

impl<'s> Mdd<'s> {
    /// Whether `f or not valid` holds in every class of the cube. Walked on the pair of
    /// diagrams: building `f or not valid` cost as much as building `f` (the te pack's gaps).
    pub(super) fn holds_unless(&self, f: Id, valid: Id, cube: &[Option<Bits>]) -> bool {
        let mut memo = self.pair_memos.take();
        // The walk of `f` alone (once `valid` is true) shares `holds_on`'s memo.
        let mut single = self.scratch.take();
        memo.first.clear(self.size());
        memo.more.clear();
        single.clear(self.size());
        let r = self.unless(f, valid, cube, &mut memo, &mut single);
        self.scratch.set(single);
        self.pair_memos.set(memo);
        r
    }

    /// [`Mdd::allowed`] of `f or not valid`, walked on the pair.
    pub(super) fn allowed_unless(&self, f: Id, valid: Id, level: u32, cube: &Cube) -> Bits {
        let mut memo = self.pair_memos.take();
        let mut single = self.scratch.take();
        memo.first.clear(self.size());
        memo.more.clear();
        single.clear(self.size());
        let mut classes = HashMap::default();
        let r = self.allowed_pair(f, valid, level, cube, &mut classes, &mut memo, &mut single);
        self.scratch.set(single);
        self.pair_memos.set(memo);
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn allowed_pair(
        &self,
        f: Id,
        valid: Id,
        level: u32,
        cube: &Cube,
        classes: &mut HashMap<(Id, Id), Bits>,
        memo: &mut PairMemos,
        single: &mut NodeMemo<bool>,
    ) -> Bits {
        let full = &self.full[level as usize];
        let nl = self.node_level(f).min(self.node_level(valid));
        if f == TRUE || valid == FALSE || nl > level {
            return if self.unless(f, valid, cube, memo, single) {
                full.clone()
            } else {
                Bits::empty(self.ncls[self.order[level as usize]])
            };
        }
        if let Some(r) = classes.get(&(f, valid)) {
            return r.clone();
        }
        // The edges of `x` at level `nl` (one edge over every class when it tests a deeper var).
        let at = |x: Id| -> Vec<(Id, &[u64])> {
            if self.node_level(x) == nl {
                self.edges(x).collect()
            } else {
                vec![(x, self.full[nl as usize].words())]
            }
        };
        let (ef, ev) = (at(f), at(valid));
        let r = if nl == level {
            let mut r = Bits::empty(self.ncls[self.order[level as usize]]);
            for &(kf, sf) in &ef {
                for &(kv, sv) in &ev {
                    if words_meet(sf, sv) && self.unless(kf, kv, cube, memo, single) {
                        let both: Vec<u64> = sf.iter().zip(sv).map(|(a, b)| a & b).collect();
                        r.or_words(&both);
                    }
                }
            }
            r
        } else {
            let c = cube[self.order[nl as usize]].as_ref().map(Bits::words);
            let mut r = full.clone();
            'pairs: for &(kf, sf) in &ef {
                for &(kv, sv) in &ev {
                    let meet = match c {
                        Some(c) => c.iter().zip(sf).zip(sv).any(|((c, x), y)| c & x & y != 0),
                        None => words_meet(sf, sv),
                    };
                    if !meet {
                        continue;
                    }
                    let a = self.allowed_pair(kf, kv, level, cube, classes, memo, single);
                    match r.and(&a) {
                        Some(both) => r = both,
                        None => {
                            r = Bits::empty(full.capacity());
                            break 'pairs;
                        }
                    }
                }
            }
            r
        };
        classes.insert((f, valid), r.clone());
        r
    }

    fn unless(
        &self,
        f: Id,
        valid: Id,
        cube: &[Option<Bits>],
        memo: &mut PairMemos,
        single: &mut NodeMemo<bool>,
    ) -> bool {
        if f == TRUE || valid == FALSE {
            return true;
        }
        if valid == TRUE {
            return self.everywhere(f, cube, true, single);
        }
        // Most nodes of `f` meet one node of `valid` (a small diagram): a dense memo per node
        // of `f` (`valid << 1 | answer`), other pairs hashed.
        match memo.first.get(f) {
            Some(e) if e >> 1 == valid => return e & 1 == 1,
            Some(_) => {
                if let Some(&(r, g, l)) = memo.more.get(&(f, valid))
                    && memo.first.live_at(g, l)
                {
                    return r;
                }
            }
            None => {}
        }
        let (lf, lv) = (self.node_level(f), self.node_level(valid));
        let level = lf.min(lv);
        // `f` false is walked as a terminal: down `valid` to where it is false everywhere.
        let c = cube
            .get(self.order[level as usize])
            .and_then(Option::as_ref)
            .map(Bits::words);
        let r = if self.store.w(level) == 1 {
            self.store.all_one_word_pairs(
                f,
                valid,
                (lf, lv),
                c.map_or(u64::MAX, |c| c[0]),
                |a, b| self.unless(a, b, cube, memo, single),
            )
        } else {
            if lf == lv {
                self.edges(f).all(|(kf, sf)| {
                    self.edges(valid).all(|(kv, sv)| {
                        let meet = match c {
                            Some(c) => c.iter().zip(sf).zip(sv).any(|((c, x), y)| c & x & y != 0),
                            None => words_meet(sf, sv),
                        };
                        !meet || self.unless(kf, kv, cube, memo, single)
                    })
                })
            } else if lf < lv {
                self.edges(f).all(|(kf, sf)| {
                    c.is_some_and(|c| !words_meet(c, sf))
                        || self.unless(kf, valid, cube, memo, single)
                })
            } else {
                self.edges(valid).all(|(kv, sv)| {
                    c.is_some_and(|c| !words_meet(c, sv)) || self.unless(f, kv, cube, memo, single)
                })
            }
        };
        if memo.first.get(f).is_none() {
            memo.first.set_at(f, level, valid << 1 | r as u32);
        } else {
            let g = memo.first.now();
            memo.more.insert((f, valid), (r, g, level));
        }
        r
    }
}

/// Whether every class of `inner` is a class of `outer`, var by var (`None`: every class).
pub fn cube_within(inner: &Cube, outer: &Cube) -> bool {
    inner.iter().zip(outer).all(|(i, o)| match (i, o) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some(i), Some(o)) => i.minus(o).is_empty(),
    })
}
