//! Node creation over the node store (hash-consing) and the boolean operations on diagrams.
//! The store's and the memos' data types are in `store`; this file holds the `Mdd` methods
//! that maintain them.
//!
//! Invariants (see the module root for what a node id means):
//! - Node `x` is `store.hdr[x]` (its level, its number of edges, where its edges start in
//!   the arena). Ids 0 / 1 are the terminals ([`FALSE`] / [`TRUE`], level `TERMINAL`, no
//!   edges); every other node is in canonical form and was created by [`Mdd::mk_top`], the
//!   only place that appends nodes.
//! - A node's edges are stored once, in `store.arena`: its `len` children packed two per
//!   word, then its class sets. A set of a var of at most 64 classes is its word, stored
//!   inline; a wider set (`wpl[level]` words, the words of [`Bits`] for that var) is stored
//!   once in the set table (`SetTable`, hash-consed like the nodes) and the node holds its
//!   id (packed two per word). No node owns an allocation: a node costs 16 bytes plus about
//!   8 per edge, where boxed edges of `(Id, Bits)` took 40 bytes each (and a wide node's
//!   sets repeat the same few partitions of a head dim's 712 classes).
//! - `store.unique` is an open-addressing table (linear probing) of `tag << 32 | id` (`EMPTY`
//!   for a free slot), its size a power of two, at most 70% full; `tag` is the high half of
//!   the node's hash and picks the slot (multiply-shift), so the table grows without
//!   rehashing and a probe compares a node only when its tag matches. Equal nodes are stored
//!   once. A node's hash is computed from its sets' words, so it does not depend on set ids.
//!   Nodes from `store.flushed` on are in `store.recent` instead (the same layout, small enough
//!   to stay in cache), every older one in `store.unique`: a node is looked up in `recent`,
//!   and in `unique` only when none of its children is from `flushed` on (a node is newer
//!   than its children). `recent` is moved into `unique` when half full. Which table holds
//!   a node never changes which node an edge list finds, so ids do not depend on it.
//! - Memory latency, not instructions, bounds `apply`: its memo probes and node lookups land
//!   in tables far larger than the cache. So `apply` lists the pairs of children it will
//!   combine and prefetches their memo slots before recursing into the first (same pairs,
//!   same order), and `not` its children's; a prefetch is only a hint (`store::prefetch`).
//! - `and_memo` / `or_memo` are keyed by `(min(a, b), max(a, b))` (both operations commute);
//!   `not_memo` holds both directions of each negation (`not` is an involution). Entries stay
//!   valid forever (nodes are never freed). The memos are exact (an entry is never dropped),
//!   so which nodes are created, and in which order, depends only on the operations asked.
//! - Nodes under construction live on an edge stack (`ek` children, `ew` their sets' words,
//!   `wpl[level]` words an edge): an operation pushes its edges above those of the
//!   operations it is nested in and [`Mdd::mk_top`] pops them, so building a node allocates
//!   nothing.
//! - `NodeMemo` (in `store`) is a per-traversal memo over node ids, cleared in O(1) by a
//!   generation stamp; `clear(n)` must be called with `n` at least the number of nodes before
//!   `get` / `set`.
//!
//! Complexity: `mk` is O(edges) plus a hash probe; `apply(a, b)` visits each pair of nodes of
//! `a` and `b` reachable together at most once (memoised), each visit intersecting two edge
//! partitions (O(edges(a) * edges(b)) set operations); `not(a)` is O(size of `a`).

use super::bits::{Bits, words_meet};
use super::manager::Mdd;
use super::store::{
    EMPTY, Edges, FALSE, HashSet, INSERTION_SORT_EDGES, Id, Op, TRUE, node_hash, tag_slot,
};

impl<'s> Mdd<'s> {
    /// Number of nodes created (a measure of the work done).
    pub fn size(&self) -> usize {
        self.store.hdr.len()
    }

    /// The level node `x` tests (`TERMINAL` for the terminals).
    pub(super) fn node_level(&self, x: Id) -> u32 {
        self.store.hdr[x as usize].level
    }

    /// The edges of node `x`.
    pub(super) fn edges(&self, x: Id) -> Edges<'_> {
        let h = self.store.hdr[x as usize];
        let w = if h.len == 0 { 0 } else { self.store.w(h.level) };
        Edges {
            store: &self.store,
            h,
            w,
            i: 0,
        }
    }

    /// Whether `rec` holds for every child of node `x` (at `level`) whose edge meets the
    /// classes `c` (`None`: every class). One-word sets (most vars) are read as words, as
    /// `apply` does. The single-node walks of `everywhere` (cover) and of the widening walk
    /// (widen), which differ only in what they recurse into.
    #[inline]
    pub(super) fn all_children_meeting(
        &self,
        x: Id,
        level: u32,
        c: Option<&Bits>,
        mut rec: impl FnMut(Id) -> bool,
    ) -> bool {
        if self.store.w(level) == 1 {
            let h = self.store.hdr[x as usize];
            let at = self.store.sets_at(h);
            let cw = c.map_or(u64::MAX, |c| c.words()[0]);
            (0..h.len as usize)
                .all(|i| cw & self.store.word(at + i) == 0 || rec(self.store.kid(h, i)))
        } else {
            self.edges(x)
                .all(|(k, set)| c.is_some_and(|c| !words_meet(c.words(), set)) || rec(k))
        }
    }

    /// The node for `level` with these edges (merging edges to the same child).
    pub(super) fn mk(&mut self, level: u32, edges: Vec<(Id, Bits)>) -> Id {
        let (ks, ws) = (self.ek.len(), self.ew.len());
        for (k, b) in &edges {
            debug_assert_eq!(b.words().len(), self.store.w(level));
            self.ek.push(*k);
            self.ew.extend_from_slice(b.words());
        }
        self.mk_top(level, ks, ws)
    }

    /// The node for `level` whose edges are those on the edge stack from `ks` (children) /
    /// `ws` (their sets' words): empty sets dropped, sorted by child, edges to the same child
    /// merged; one edge left is its child. Pops them.
    pub(super) fn mk_top(&mut self, level: u32, ks: usize, ws: usize) -> Id {
        let w = self.store.w(level);
        let n = self.normalize(ks, ws, w);
        self.ek.truncate(ks + n);
        self.ew.truncate(ws + n * w);
        let r = if n == 1 {
            self.ek[ks]
        } else {
            self.find_or_add(level, ks, ws, w)
        };
        self.ek.truncate(ks);
        self.ew.truncate(ws);
        r
    }

    /// The id of the node on top of the edge stack (added when new and within budget).
    fn find_or_add(&mut self, level: u32, ks: usize, ws: usize, w: usize) -> Id {
        let (kids, words) = (&self.ek[ks..], &self.ew[ws..]);
        let st = &mut self.store;
        let tag = (node_hash(level, kids, words) >> 32) as u32;
        // Nodes created since the last flush first (a table in cache); the older ones only
        // when every child is older too (else the node is newer than the flush).
        let find = |table: &[u64]| -> Result<Id, usize> {
            let mask = table.len() - 1;
            let mut i = tag_slot(tag, table.len());
            loop {
                let e = table[i];
                if e == EMPTY {
                    return Err(i);
                }
                if (e >> 32) as u32 == tag && st.same(e as Id, level, kids, words, w) {
                    return Ok(e as Id);
                }
                i = (i + 1) & mask;
            }
        };
        let slot = match find(&st.recent) {
            Ok(id) => return id,
            Err(slot) => slot,
        };
        if kids.iter().all(|&k| k < st.flushed)
            && let Ok(id) = find(&st.unique)
        {
            return id;
        }
        if st.hdr.len() >= self.budget {
            // Out of budget: results from now on are meaningless, and flagged so.
            self.exhausted = true;
            return FALSE;
        }
        let id = st.push(level, kids, words, w);
        st.add_recent(slot, tag, id);
        id
    }

    /// Drops the empty sets of the edges on the stack from `ks` / `ws`, sorts them by child
    /// and merges edges to the same child; returns how many are left (the stack above them
    /// is left over: truncate it).
    fn normalize(&mut self, ks: usize, ws: usize, w: usize) -> usize {
        if w == 1 {
            return self.normalize_one_word(ks, ws);
        }
        let n = self.ek.len() - ks;
        let (ek, ew) = (&mut self.ek, &mut self.ew);
        let mut m = 0;
        for r in 0..n {
            let at = ws + r * w;
            if ew[at..at + w].iter().all(|&x| x == 0) {
                continue;
            }
            if m != r {
                ek[ks + m] = ek[ks + r];
                ew.copy_within(at..at + w, ws + m * w);
            }
            m += 1;
        }
        let sorted = ek[ks..ks + m].windows(2).all(|p| p[0] <= p[1]);
        if !sorted {
            if m <= INSERTION_SORT_EDGES {
                for i in 1..m {
                    let mut j = i;
                    while j > 0 && ek[ks + j - 1] > ek[ks + j] {
                        ek.swap(ks + j - 1, ks + j);
                        for t in 0..w {
                            ew.swap(ws + (j - 1) * w + t, ws + j * w + t);
                        }
                        j -= 1;
                    }
                }
            } else {
                let mut perm: Vec<usize> = (0..m).collect();
                perm.sort_by_key(|&i| ek[ks + i]);
                let kids: Vec<Id> = perm.iter().map(|&i| ek[ks + i]).collect();
                let mut words = Vec::with_capacity(m * w);
                for &i in &perm {
                    words.extend_from_slice(&ew[ws + i * w..ws + (i + 1) * w]);
                }
                ek[ks..ks + m].copy_from_slice(&kids);
                ew[ws..ws + m * w].copy_from_slice(&words);
            }
        }
        // Merge edges to the same child (in place).
        let mut out = 0;
        for r in 0..m {
            if out > 0 && ek[ks + out - 1] == ek[ks + r] {
                for t in 0..w {
                    let x = ew[ws + r * w + t];
                    ew[ws + (out - 1) * w + t] |= x;
                }
            } else {
                if out != r {
                    ek[ks + out] = ek[ks + r];
                    ew.copy_within(ws + r * w..ws + (r + 1) * w, ws + out * w);
                }
                out += 1;
            }
        }
        out
    }

    /// [`Mdd::normalize`] for one-word sets (most vars): the same edges, each set a word.
    fn normalize_one_word(&mut self, ks: usize, ws: usize) -> usize {
        let n = self.ek.len() - ks;
        let (ek, ew) = (&mut self.ek[ks..], &mut self.ew[ws..]);
        let mut m = 0;
        for r in 0..n {
            if ew[r] != 0 {
                ek[m] = ek[r];
                ew[m] = ew[r];
                m += 1;
            }
        }
        if !ek[..m].windows(2).all(|p| p[0] <= p[1]) {
            if m <= INSERTION_SORT_EDGES {
                for i in 1..m {
                    let mut j = i;
                    while j > 0 && ek[j - 1] > ek[j] {
                        ek.swap(j - 1, j);
                        ew.swap(j - 1, j);
                        j -= 1;
                    }
                }
            } else {
                let mut pairs: Vec<(Id, u64)> = (0..m).map(|i| (ek[i], ew[i])).collect();
                pairs.sort_by_key(|p| p.0);
                for (i, (k, x)) in pairs.into_iter().enumerate() {
                    ek[i] = k;
                    ew[i] = x;
                }
            }
        }
        // Edges to the same child merged (their sets joined).
        let mut out = 0;
        for r in 0..m {
            if out > 0 && ek[out - 1] == ek[r] {
                ew[out - 1] |= ew[r];
            } else {
                ek[out] = ek[r];
                ew[out] = ew[r];
                out += 1;
            }
        }
        out
    }

    pub fn not(&mut self, a: Id) -> Id {
        match a {
            FALSE => return TRUE,
            TRUE => return FALSE,
            _ => {}
        }
        if let Some(r) = self.not_memo.get(a, 0) {
            return r;
        }
        self.steps += 1;
        let h = self.store.hdr[a as usize];
        let w = self.store.w(h.level);
        let (ks, ws) = (self.ek.len(), self.ew.len());
        // The children's memo slots announced together (as `apply`'s pairs).
        for i in 0..h.len as usize {
            self.not_memo.prefetch(self.store.kid(h, i), 0);
        }
        for i in 0..h.len as usize {
            let k = self.store.kid(h, i);
            let r = self.not(k);
            self.ek.push(r);
            self.ew.extend_from_slice(self.store.set(h, i, w));
        }
        self.not_memo.prefetch(a, 0);
        let r = self.mk_top(h.level, ks, ws);
        self.not_memo.insert(a, 0, r);
        self.not_memo.insert(r, 0, a);
        r
    }

    pub(super) fn apply(&mut self, op: Op, a: Id, b: Id) -> Id {
        match op {
            Op::And | Op::Or => {
                let (zero, one) = if op == Op::And {
                    (FALSE, TRUE)
                } else {
                    (TRUE, FALSE)
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
            }
            Op::Diff => {
                if a == FALSE || b == TRUE || a == b {
                    return FALSE;
                }
                if b == FALSE {
                    return a;
                }
                if a == TRUE {
                    return self.not(b);
                }
            }
        }
        // `and` / `or` commute: one entry for both operand orders.
        let (lo, hi) = if op == Op::Diff {
            (a, b)
        } else {
            (a.min(b), a.max(b))
        };
        let memo = match op {
            Op::And => &self.and_memo,
            Op::Or => &self.or_memo,
            Op::Diff => &self.diff_memo,
        };
        if let Some(r) = memo.get(lo, hi) {
            return r;
        }
        self.steps += 1;
        let (ha, hb) = (self.store.hdr[a as usize], self.store.hdr[b as usize]);
        let level = ha.level.min(hb.level);
        let w = self.store.w(level);
        // A node below `level` is one edge over every class (its own id).
        let (at_a, at_b) = (ha.level == level, hb.level == level);
        let na = if at_a { ha.len as usize } else { 1 };
        let nb = if at_b { hb.len as usize } else { 1 };
        let (ks, ws) = (self.ek.len(), self.ew.len());
        // The pairs of children that meet, in the order they are combined: listed first and
        // their memo slots announced, so the memo's cache misses overlap instead of being
        // paid one after the other (same pairs, same order, same nodes as combining each
        // pair as it is found).
        let base = self.pend.len();
        if w == 1 {
            // One word a set (vars of at most 64 classes, most of them): the sets read as
            // words, their offsets computed once.
            let one = u64::MAX;
            let (sa, sb) = (self.store.sets_at(ha), self.store.sets_at(hb));
            for i in 0..na {
                let (x, wa) = if at_a {
                    (self.store.kid(ha, i), self.store.word(sa + i))
                } else {
                    (a, one)
                };
                // `b`'s sets partition the classes: once `wa`'s are all met, no later edge
                // of `b` meets it.
                let mut left = wa;
                for j in 0..nb {
                    let (y, wb) = if at_b {
                        (self.store.kid(hb, j), self.store.word(sb + j))
                    } else {
                        (b, one)
                    };
                    let both = left & wb;
                    if both == 0 {
                        continue;
                    }
                    left &= !wb;
                    self.announce(op, x, y);
                    self.pend.push((x, y, both));
                    if left == 0 {
                        break;
                    }
                }
            }
            for p in base..self.pend.len() {
                let (x, y, both) = self.pend[p];
                let r = self.apply(op, x, y);
                self.ek.push(r);
                self.ew.push(both);
            }
        } else {
            for i in 0..na {
                let x = if at_a { self.store.kid(ha, i) } else { a };
                for j in 0..nb {
                    let y = if at_b { self.store.kid(hb, j) } else { b };
                    if at_a
                        && at_b
                        && !words_meet(self.store.set(ha, i, w), self.store.set(hb, j, w))
                    {
                        continue;
                    }
                    self.announce(op, x, y);
                    self.pend.push((x, y, (i as u64) << 32 | j as u64));
                }
            }
            for p in base..self.pend.len() {
                let (x, y, ij) = self.pend[p];
                let (i, j) = ((ij >> 32) as usize, ij as u32 as usize);
                let r = self.apply(op, x, y);
                self.ek.push(r);
                let (st, ew) = (&self.store, &mut self.ew);
                match (at_a, at_b) {
                    (true, true) => ew.extend(
                        st.set(ha, i, w)
                            .iter()
                            .zip(st.set(hb, j, w))
                            .map(|(p, q)| p & q),
                    ),
                    (true, false) => ew.extend_from_slice(st.set(ha, i, w)),
                    (false, true) => ew.extend_from_slice(st.set(hb, j, w)),
                    (false, false) => unreachable!("one operand tests the top level"),
                }
            }
        }
        self.pend.truncate(base);
        // The slot probed on entry has likely left the cache in the recursion: announced
        // again, it is fetched while the node is built.
        self.announce(op, a, b);
        let r = self.mk_top(level, ks, ws);
        self.memo_insert(op, lo, hi, r);
        r
    }

    /// Announces the memo slot `apply(op, a, b)` will probe (see [`super::store::OpMemo::prefetch`]);
    /// nothing for the pairs it answers without the memo.
    #[inline(always)]
    fn announce(&self, op: Op, a: Id, b: Id) {
        if a <= TRUE || b <= TRUE || a == b {
            return;
        }
        match op {
            Op::And => self.and_memo.prefetch(a.min(b), a.max(b)),
            Op::Or => self.or_memo.prefetch(a.min(b), a.max(b)),
            Op::Diff => self.diff_memo.prefetch(a, b),
        }
    }

    fn memo_insert(&mut self, op: Op, lo: Id, hi: Id, r: Id) {
        match op {
            Op::And => self.and_memo.insert(lo, hi, r),
            Op::Or => self.or_memo.insert(lo, hi, r),
            Op::Diff => self.diff_memo.insert(lo, hi, r),
        }
    }

    pub fn and(&mut self, a: Id, b: Id) -> Id {
        self.apply(Op::And, a, b)
    }

    pub fn or(&mut self, a: Id, b: Id) -> Id {
        self.apply(Op::Or, a, b)
    }

    /// `a and not b`.
    pub fn minus(&mut self, a: Id, b: Id) -> Id {
        // Directly: `not b` would copy all of `b` (most of it outside `a`).
        self.apply(Op::Diff, a, b)
    }

    /// Whether `a` implies `b` (every class where `a` holds has `b`): `a and not b` is
    /// unsatisfiable, walked without building it ([`Mdd::satisfiable`]).
    pub fn implies(&mut self, a: Id, b: Id) -> bool {
        !self.satisfiable(&[(a, true), (b, false)])
    }

    pub fn any<I: IntoIterator<Item = Id>>(&mut self, xs: I) -> Id {
        xs.into_iter().fold(FALSE, |acc, x| self.or(acc, x))
    }

    /// [`Mdd::any`], the smallest diagrams first (same function): a large operand joined
    /// early is copied again by every later `or` (FusedAttention's decliners: 930k nodes
    /// built in pack order, 470k smallest first). The order depends only on the functions.
    pub fn any_smallest_first(&mut self, xs: &[Id]) -> Id {
        let mut by_size: Vec<(usize, Id)> = xs.iter().map(|&x| (self.nodes_in(x), x)).collect();
        by_size.sort_by_key(|e| e.0);
        self.any(by_size.into_iter().map(|e| e.1))
    }

    /// The number of inner nodes of `x`.
    pub fn nodes_in(&self, x: Id) -> usize {
        let mut seen = self.scratch.take();
        seen.clear(self.size());
        let mut stack = vec![x];
        let mut n = 0;
        while let Some(y) = stack.pop() {
            if y <= TRUE || seen.get(y).is_some() {
                continue;
            }
            seen.set(y, true);
            n += 1;
            stack.extend(self.edges(y).map(|e| e.0));
        }
        self.scratch.set(seen);
        n
    }

    /// Whether the conjunction of the literals (a diagram, and whether it holds or its
    /// negation) is true for some combination of classes. Same answer as building the
    /// conjunction and comparing it with [`FALSE`], but builds no node and stops at the first
    /// satisfying path; combinations found unsatisfiable are remembered for the manager's
    /// life (nodes never change), so the many questions of `check` share them.
    pub fn satisfiable(&mut self, lits: &[(Id, bool)]) -> bool {
        self.satisfiable_within(lits, u64::MAX)
            .expect("an unbounded walk always answers")
    }

    /// [`Mdd::satisfiable`], giving up (None) after `steps` combinations walked. What a walk
    /// proved unsatisfiable before it gave up stays remembered (it is proved).
    pub(super) fn satisfiable_within(&mut self, lits: &[(Id, bool)], steps: u64) -> Option<bool> {
        let key: Vec<u32> = lits.iter().map(|&(x, pos)| lit(x, pos)).collect();
        let mut walk = SatWalk {
            dead: std::mem::take(&mut self.sat_dead),
            steps,
            gave_up: false,
        };
        let r = self.sat_walk(key, &mut walk);
        self.sat_dead = walk.dead;
        (!walk.gave_up).then_some(r)
    }

    fn sat_walk(&self, mut key: Vec<u32>, walk: &mut SatWalk) -> bool {
        // Terminals: a satisfied literal is dropped, a violated one ends the walk.
        let mut violated = false;
        key.retain(|&l| {
            let (x, pos) = (l >> 1, l & POS != 0);
            if x > TRUE {
                return true;
            }
            violated |= (x == TRUE) != pos;
            false
        });
        if violated {
            return false;
        }
        key.sort_unstable();
        key.dedup();
        // `x and not x` (adjacent once sorted: the polarity is the low bit).
        if key.windows(2).any(|p| p[0] >> 1 == p[1] >> 1) {
            return false;
        }
        // A single inner node is neither constant, so both it and its negation hold somewhere.
        if key.len() <= 1 {
            return true;
        }
        if walk.dead.contains(&key) {
            return false;
        }
        if walk.steps == 0 {
            walk.gave_up = true;
            return false;
        }
        walk.steps -= 1;
        let level = key
            .iter()
            .map(|&l| self.node_level(l >> 1))
            .min()
            .expect("non-empty");
        let w = self.store.w(level);
        let at: Vec<usize> = (0..key.len())
            .filter(|&i| self.node_level(key[i] >> 1) == level)
            .collect();
        let mut cur = key.clone();
        let found = self.sat_split(&key, &at, 0, &[], w, &mut cur, walk);
        if !found && !walk.gave_up {
            walk.dead.insert(key);
        }
        found
    }

    /// The edges of the nodes `at` of `key` at one level, intersected one node after the
    /// other (`set`: the classes still shared): `cur` holds the children chosen so far.
    #[allow(clippy::too_many_arguments)]
    fn sat_split(
        &self,
        key: &[u32],
        at: &[usize],
        j: usize,
        set: &[u64],
        w: usize,
        cur: &mut Vec<u32>,
        walk: &mut SatWalk,
    ) -> bool {
        if j == at.len() {
            return self.sat_walk(cur.clone(), walk);
        }
        let i = at[j];
        let (x, pol) = (key[i] >> 1, key[i] & POS);
        let h = self.store.hdr[x as usize];
        for e in 0..h.len as usize {
            let s = self.store.set(h, e, w);
            let meet: Vec<u64> = if j == 0 {
                s.to_vec()
            } else {
                if !words_meet(set, s) {
                    continue;
                }
                set.iter().zip(s).map(|(p, q)| p & q).collect()
            };
            cur[i] = self.store.kid(h, e) << 1 | pol;
            if self.sat_split(key, at, j + 1, &meet, w, cur, walk) {
                return true;
            }
            if walk.gave_up {
                return false;
            }
        }
        false
    }
}

/// The state of one [`Mdd::satisfiable_within`] walk: the combinations known unsatisfiable,
/// the steps left, and whether it gave up (then a false answer proves nothing, and the
/// combinations it was walking are not remembered as unsatisfiable).
struct SatWalk {
    dead: HashSet<Vec<u32>>,
    steps: u64,
    gave_up: bool,
}

/// The polarity bit of a literal of [`Mdd::satisfiable`]'s walk (the id shifted left).
const POS: u32 = 1;

fn lit(x: Id, pos: bool) -> u32 {
    debug_assert!(x < 1 << 31, "node ids fit 31 bits");
    x << 1 | pos as u32
}
