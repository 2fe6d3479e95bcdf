//! [`Mdd::widen_inside`] (the EXPAND step of `gaps` / `diff` regions) and the memos of its
//! walks, kept for the manager's life and keyed by what the walks read.
//!
//! A walk of `f or not valid` under a cube, from a pair of nodes at level `l`, reads only the
//! cube's classes of the vars at levels `l` and below: its *suffix* there. Suffixes are
//! interned (`WidenMemos::at`: per level, the id of the current cube's suffix from that
//! level; equal ids iff equal suffixes, for the manager's life), and an answer is remembered
//! with the id of the suffix it read. So an answer is reused exactly when it is still valid:
//! after a var is restored (its old answers are valid again), and across the calls of a
//! `gaps` run, whose cubes share most of their deeper classes (the same walks were made
//! afresh per listed cube before: about half of the widening work of the te pack's gaps).
//!
//! Invariants: `sets` and `suffixes` only grow (ids are never reused while answers keyed by
//! them are remembered; all are dropped together when the tables grow too large); `at[l]`
//! and `set_of[v]` describe the cube of the walk in progress; suffix ids are >= 1 (0 marks
//! an empty memo slot); node ids never change, so answers keyed by them stay valid.

use attn_policy::facts::Value;

use super::bits::{Bits, words_meet};
use super::manager::{Cube, Mdd};
use super::memos::WidenMemos;
use super::store::{FALSE, Id, TRUE};

/// Suffixes or pair answers beyond which the memos are dropped (memory, not correctness).
const MAX_SUFFIXES: usize = 1 << 20;
const MAX_MORE: usize = 1 << 22;
const MAX_ALLOWED_WORDS: usize = 1 << 22;

/// The set id of a var the cube leaves open.
const OPEN: u32 = u32::MAX;

impl WidenMemos {
    /// Ready for a walk of `cube` in manager `m`: sized for its nodes and levels, every
    /// var's set and every level's suffix made.
    fn start(&mut self, m: &Mdd, cube: &Cube) {
        if self.suffixes.len() > MAX_SUFFIXES
            || self.more.len() > MAX_MORE
            || self.allowed_sets.len() > MAX_ALLOWED_WORDS
        {
            *self = WidenMemos::default();
        }
        if self.first.len() < m.size() {
            self.first.resize(m.size(), (0, 0));
            self.single.resize(m.size(), 0);
            self.allowed.resize(m.size(), (0, 0, 0));
        }
        self.at.clear();
        self.at.resize(m.order.len() + 1, 0);
        self.set_of = (0..m.nvars()).map(|v| self.set_id(cube, v)).collect();
        self.resuffix(m, m.order.len().saturating_sub(1));
    }

    fn set_id(&mut self, cube: &Cube, v: usize) -> u32 {
        let Some(set) = &cube[v] else { return OPEN };
        if let Some(&id) = self.sets.get(set.words()) {
            return id;
        }
        let id = self.sets.len() as u32;
        self.sets.insert(set.words().into(), id);
        id
    }

    /// Var `v`'s entry of `cube` changed: its set and the suffixes from its level up.
    fn changed(&mut self, m: &Mdd, cube: &Cube, v: usize) {
        self.set_of[v] = self.set_id(cube, v);
        self.resuffix(m, m.level[v] as usize);
    }

    /// The suffix ids of levels `0..=top`, from those below.
    fn resuffix(&mut self, m: &Mdd, top: usize) {
        for l in (0..=top).rev() {
            let below = self.at[l + 1];
            self.at[l] = match m.order[l] {
                usize::MAX => below,
                v => {
                    let key = (l as u32, self.set_of[v], below);
                    let next = self.suffixes.len() as u32 + 1;
                    *self.suffixes.entry(key).or_insert(next)
                }
            };
        }
    }

    /// Whether the entry of `first` for `f` was made under the current cube.
    fn first_live(&self, m: &Mdd, f: Id) -> bool {
        let (sid, e) = self.first[f as usize];
        sid != 0 && {
            let level = m.node_level(f).min(m.node_level(e >> 1));
            self.at[level as usize] == sid
        }
    }
}

impl<'s> Mdd<'s> {
    /// The EXPAND step of two-level minimisation on a listed cube, exact (a diagram check,
    /// never sampled): each var the cube constrains is widened to its whole domain when the
    /// widened cube still lies inside `f or not valid` (`cube(widened) and valid and not f`
    /// is false; asked of the pair, never built), else restored: the widened cube then holds
    /// no valid input outside `f`.
    ///
    /// Order (fixed, so the result depends only on the diagrams): relation variables first
    /// (in their index order), then members of objects, then the other facts, each group in
    /// the space's var order. A fact some still-constrained relation variable of the cube
    /// reads is kept (the relation is stated over it), and so is an object whose members are
    /// still constrained (a member's constraint cannot be written for an absent object).
    /// Widening a relation variable also admits its values that no input has with the cube's
    /// facts, so the check is, if anything, stricter than needed: sound, possibly not minimal.
    pub fn widen_inside(&self, f: Id, valid: Id, cube: &Cube) -> Cube {
        let nv = self.space.vars.len();
        let mut out = cube.clone();
        let members = (0..nv).filter(|&v| self.space.vars[v].parent.is_some());
        let objects_and_plain = (0..nv).filter(|&v| self.space.vars[v].parent.is_none());
        let order: Vec<usize> = (nv..self.nvars())
            .chain(members)
            .chain(objects_and_plain)
            .collect();
        // One walk per var; answers are kept with the cube suffix they read (see the module
        // docs), across vars and calls.
        let mut memo = self.widen_memos.take();
        memo.start(self, &out);
        for v in order {
            let Some(set) = out[v].take() else { continue };
            let held = v < nv
                && ((0..self.rels.len())
                    .any(|k| out[nv + k].is_some() && self.rel_vars(k).contains(&v))
                    || (0..nv).any(|u| self.space.vars[u].parent == Some(v) && out[u].is_some()));
            if held {
                out[v] = Some(set);
                continue;
            }
            memo.changed(self, &out, v);
            if !self.unless_keyed(f, valid, &out, &mut memo) {
                out[v] = Some(set);
                memo.changed(self, &out, v);
            }
        }
        self.widen_memos.set(memo);
        out
    }

    /// Widens `cube` inside `f or not valid`: first frees every var that can take any class
    /// (largest domains first: they read worst), then widens the rest to every class that
    /// keeps the cube inside it. Where `valid` is true (no tie applied) the walks use the
    /// keyed memos of [`WidenMemos`] (kept across vars and calls); else the pair walks.
    pub(super) fn expand(&self, f: Id, valid: Id, cube: &mut Cube) {
        let mut levels: Vec<usize> = self
            .used
            .iter()
            .map(|&l| l as usize)
            .filter(|&l| cube[self.order[l]].is_some())
            .collect();
        levels.sort_by_key(|&l| std::cmp::Reverse(self.full[l].len()));
        let mut memo = self.widen_memos.take();
        memo.start(self, cube);
        for free_only in [true, false] {
            for &l in &levels {
                let v = self.order[l];
                if cube[v].is_none() {
                    continue;
                }
                // An object whose members are constrained stays present: a member's
                // constraint cannot be written for an absent object.
                let keep_present = v < self.space.vars.len()
                    && self
                        .space
                        .vars
                        .iter()
                        .enumerate()
                        .any(|(u, x)| x.parent == Some(v) && cube[u].is_some());
                if free_only {
                    // Only "every class" frees the var: one walk that stops at the first
                    // path leaving `f`, not the allowed classes (the same answer).
                    let nullable =
                        self.space.vars.get(v).is_some_and(|x| {
                            x.classes.iter().any(|class| class.value == Value::Null)
                        });
                    if keep_present && nullable {
                        continue;
                    }
                    let set = cube[v].take();
                    memo.changed(self, cube, v);
                    let holds = if valid == TRUE {
                        self.everywhere_keyed(f, cube, &mut memo)
                    } else {
                        self.holds_unless(f, valid, cube)
                    };
                    if !holds {
                        cube[v] = set;
                        memo.changed(self, cube, v);
                    }
                    continue;
                }
                let mut good = if valid == TRUE {
                    // The var's own classes are not read: left open in the suffixes, so
                    // the answers hold whatever its classes are.
                    let set = cube[v].take();
                    memo.changed(self, cube, v);
                    let mut acc = self.full[l].clone();
                    self.allowed_keyed(f, l as u32, cube, &mut memo, &mut acc);
                    cube[v] = set;
                    acc
                } else {
                    self.allowed_unless(f, valid, l as u32, cube)
                };
                if keep_present {
                    for (c, class) in self.space.vars[v].classes.iter().enumerate() {
                        if class.value == Value::Null {
                            good.remove(c as u32);
                        }
                    }
                }
                if good.len() == self.full[l].len() {
                    cube[v] = None;
                } else {
                    cube[v] = Some(good);
                }
                memo.changed(self, cube, v);
            }
        }
        self.widen_memos.set(memo);
    }

    /// Narrows `acc` to the classes of the var at `level` for which `cube` (with that var
    /// replaced by the class) lies inside `x` (`Mdd::allowed`, keyed memos).
    fn allowed_keyed(&self, x: Id, level: u32, cube: &Cube, memo: &mut WidenMemos, acc: &mut Bits) {
        let nl = self.node_level(x);
        if nl > level {
            if !self.everywhere_keyed(x, cube, memo) {
                acc.clear();
            }
            return;
        }
        let w = acc.words().len();
        let sid = memo.at[nl as usize];
        let (s, l, i) = memo.allowed[x as usize];
        if s == sid && l == level {
            let i = i as usize;
            acc.and_words(&memo.allowed_sets[i..i + w]);
            return;
        }
        let r = if nl == level {
            let mut r = Bits::empty(self.ncls[self.order[level as usize]]);
            for (k, set) in self.edges(x) {
                if self.everywhere_keyed(k, cube, memo) {
                    r.or_words(set);
                }
            }
            r
        } else {
            let v = self.order[nl as usize];
            let mut r = self.full[level as usize].clone();
            for (k, set) in self.edges(x) {
                if cube[v].as_ref().is_none_or(|c| words_meet(c.words(), set)) {
                    self.allowed_keyed(k, level, cube, memo, &mut r);
                    if r.is_empty() {
                        break;
                    }
                }
            }
            r
        };
        acc.and_words(r.words());
        memo.allowed[x as usize] = (sid, level, memo.allowed_sets.len() as u32);
        memo.allowed_sets.extend_from_slice(r.words());
    }

    /// Whether `f or not valid` holds in every class of the cube (`Mdd::unless` with the
    /// memos of [`WidenMemos`]).
    fn unless_keyed(&self, f: Id, valid: Id, cube: &Cube, memo: &mut WidenMemos) -> bool {
        if f == TRUE || valid == FALSE {
            return true;
        }
        if valid == TRUE {
            return self.everywhere_keyed(f, cube, memo);
        }
        let (lf, lv) = (self.node_level(f), self.node_level(valid));
        let level = lf.min(lv);
        let sid = memo.at[level as usize];
        let (s0, e0) = memo.first[f as usize];
        if s0 != 0 {
            if s0 == sid && e0 >> 1 == valid {
                return e0 & 1 == 1;
            }
            if let Some(&r) = memo.more.get(&(f, valid, sid)) {
                return r;
            }
        }
        let c = cube[self.order[level as usize]].as_ref().map(|c| c.words());
        let st = &self.store;
        let r = if st.w(level) == 1 {
            st.all_one_word_pairs(f, valid, (lf, lv), c.map_or(u64::MAX, |c| c[0]), |a, b| {
                self.unless_keyed(a, b, cube, memo)
            })
        } else if lf == lv {
            self.edges(f).all(|(kf, sf)| {
                self.edges(valid).all(|(kv, sv)| {
                    let meet = match c {
                        Some(c) => c.iter().zip(sf).zip(sv).any(|((c, x), y)| c & x & y != 0),
                        None => words_meet(sf, sv),
                    };
                    !meet || self.unless_keyed(kf, kv, cube, memo)
                })
            })
        } else if lf < lv {
            self.edges(f).all(|(kf, sf)| {
                c.is_some_and(|c| !words_meet(c, sf)) || self.unless_keyed(kf, valid, cube, memo)
            })
        } else {
            self.edges(valid).all(|(kv, sv)| {
                c.is_some_and(|c| !words_meet(c, sv)) || self.unless_keyed(f, kv, cube, memo)
            })
        };
        if memo.first_live(self, f) {
            memo.more.insert((f, valid, sid), r);
        } else {
            memo.first[f as usize] = (sid, valid << 1 | r as u32);
        }
        r
    }

    /// Whether `x` holds in every class of the cube (`Mdd::everywhere`, keyed memo).
    fn everywhere_keyed(&self, x: Id, cube: &Cube, memo: &mut WidenMemos) -> bool {
        match x {
            TRUE => return true,
            FALSE => return false,
            _ => {}
        }
        let level = self.node_level(x);
        let sid = memo.at[level as usize];
        let e = memo.single[x as usize];
        if e >> 1 == sid {
            return e & 1 == 1;
        }
        let c = cube[self.order[level as usize]].as_ref();
        let r = self.all_children_meeting(x, level, c, |k| self.everywhere_keyed(k, cube, memo));
        memo.single[x as usize] = sid << 1 | r as u32;
        r
    }
}
