//! The incremental branch-and-bound engine behind `gaps`, `diff` and the pack-wide lints.
//!
//! Every condition the analysis cares about (rule conditions, variant applicability, preference
//! conditions, a `--where` restriction, possibly of several programs) is registered once. A
//! search node carries the three-valued truth of every condition; a child node re-evaluates
//! only the conditions that were still unknown *and* read a fact the newly assigned variable
//! determines (Kleene evaluation is monotone: assigning more facts never turns a known truth
//! into another one). Pack definitions are memoised within one evaluation.
//!
//! The judge sees the truths and answers: prune, a leaf (the whole region below has this
//! outcome), or "split" with the unknown conditions that matter. The engine then branches on
//! the variable read by the most of those conditions (ties: fewer classes), so the search is
//! driven by what is still open, not by a static order.

use crate::eval::program::{Program, Truth};
use crate::facts::Value;
use crate::policy::Policy;

use super::search::{Cond, Stats, agreed};
use super::space::{Assign, SlotMask, Space, SpaceBuilder, mask_of};

/// A condition in one of the engine's programs.
#[derive(Clone, Copy, Debug)]
pub struct CondRef {
    pub prog: usize,
    pub cond: Cond,
}

/// The judge's answer at a node.
pub enum Judged<T> {
    /// Nothing to report anywhere below.
    Prune,
    /// The whole region below has this outcome.
    Leaf(T),
    /// Undetermined: split on a variable one of these (unknown) conditions reads.
    Split(Vec<usize>),
    /// Like `Split`, with a cache key: the judge's verdict anywhere below depends only on
    /// `key` (an abstraction of the known truths) and the conditions `open` (all unknown
    /// here). Nodes with equal keys whose `open` conditions' vars have equal class sets have
    /// the same subtree, so the second one replays the first one's leaves.
    SplitKeyed(Vec<usize>, Vec<u32>, Vec<usize>),
}

/// A leaf below a cached node: what changed relative to it.
struct CachedLeaf {
    vars: Vec<(u32, Option<u32>, Option<Vec<u32>>)>,
    truths: Vec<(u32, Truth)>,
}

struct CacheEntry {
    leaves: Vec<CachedLeaf>,
    classes: u64,
}

/// A leaf as logged during the search (for building cache entries).
struct LoggedLeaf {
    assign: Assign,
    sets: Vec<Option<Vec<u32>>>,
    truths: Vec<Truth>,
}

/// Condition indices of one policy inside an engine.
#[derive(Clone, Debug)]
pub struct PolicyConds {
    /// Per rule: its condition (None: its layer is disabled, the rule never fires).
    pub rule: Vec<Option<usize>>,
    /// Per backend, per variant (one implicit variant when none): applicability (None: always).
    pub app: Vec<Vec<Option<usize>>>,
    /// Per preference entry: its condition (None: always).
    pub pref: Vec<Option<usize>>,
    /// Per backend: its rule indices.
    pub by_backend: Vec<Vec<usize>>,
}

fn truth_of(t: &[Truth], c: Option<usize>) -> Truth {
    c.map_or(Truth::True, |i| t[i])
}

impl PolicyConds {
    /// Whether a rule of backend `b` surely declines variant `v`; rules still unknown are
    /// appended to `rel` (the caller truncates them when the variant is declined).
    fn variant_declined(
        &self,
        p: &Policy,
        b: usize,
        v: usize,
        t: &[Truth],
        rel: &mut Vec<usize>,
    ) -> bool {
        for &r in &self.by_backend[b] {
            if p.rules[r].variants & (1u64 << v.min(63)) == 0 {
                continue;
            }
            match truth_of_rule(t, self.rule[r]) {
                Truth::True => return true,
                Truth::Unknown => rel.push(self.rule[r].expect("unknown rule is enabled")),
                Truth::False => {}
            }
        }
        false
    }

    /// Variant `v` of backend `b` under `t`: surely declined (or not applicable), surely
    /// eligible, or open (the unknown conditions that could settle it appended to `rel`).
    fn variant_status(
        &self,
        p: &Policy,
        b: usize,
        v: usize,
        t: &[Truth],
        rel: &mut Vec<usize>,
    ) -> Truth {
        let app = self.app[b][v];
        let a = truth_of(t, app);
        if a == Truth::False {
            return Truth::False;
        }
        let mark = rel.len();
        if self.variant_declined(p, b, v, t, rel) {
            rel.truncate(mark);
            return Truth::False;
        }
        if a == Truth::True && rel.len() == mark {
            return Truth::True;
        }
        if a == Truth::Unknown {
            rel.push(app.expect("unknown applicability"));
        }
        Truth::Unknown
    }

    /// Whether backend `b` has some applicable, undeclined variant. Unknown conditions that
    /// could settle it are appended to `rel`.
    pub fn eligible(&self, p: &Policy, b: usize, t: &[Truth], rel: &mut Vec<usize>) -> Truth {
        let mark = rel.len();
        let mut unknown = false;
        for v in 0..self.app[b].len() {
            match self.variant_status(p, b, v, t, rel) {
                Truth::False => {}
                Truth::True => {
                    rel.truncate(mark);
                    return Truth::True;
                }
                Truth::Unknown => unknown = true,
            }
        }
        if unknown {
            Truth::Unknown
        } else {
            rel.truncate(mark);
            Truth::False
        }
    }

    /// The variant backend `b` would run: `Ok(Some(v))` the first eligible variant, `Ok(None)`
    /// none eligible, `Err(Open)` undetermined (unknown conditions appended to `rel`).
    pub fn variant(
        &self,
        p: &Policy,
        b: usize,
        t: &[Truth],
        rel: &mut Vec<usize>,
    ) -> Result<Option<usize>, Open> {
        for v in 0..self.app[b].len() {
            match self.variant_status(p, b, v, t, rel) {
                Truth::False => {}
                Truth::True => return Ok(Some(v)),
                Truth::Unknown => return Err(Open),
            }
        }
        Ok(None)
    }

    /// A cache key for judges whose verdict depends only on which backends (variants) are
    /// eligible and on the preference: per preference entry its truth, per backend and
    /// variant its applicability, whether some rule declines it, and its unknown rules.
    /// `open` receives every unknown condition the key mentions.
    pub fn key(&self, p: &Policy, t: &[Truth], key: &mut Vec<u32>, open: &mut Vec<usize>) {
        let code = |x: Truth| match x {
            Truth::False => 0u32,
            Truth::True => 1,
            Truth::Unknown => 2,
        };
        for c in &self.pref {
            let x = truth_of(t, *c);
            key.push(code(x));
            if x == Truth::Unknown {
                open.push(c.expect("unknown pref"));
            }
        }
        for (b, apps) in self.app.iter().enumerate() {
            key.push(u32::MAX - b as u32);
            for (v, app) in apps.iter().enumerate() {
                let a = truth_of(t, *app);
                key.push(code(a));
                if a == Truth::False {
                    continue;
                }
                if a == Truth::Unknown {
                    open.push(app.expect("unknown applicability"));
                }
                let mark = (key.len(), open.len());
                let mut declined = false;
                for &r in &self.by_backend[b] {
                    if p.rules[r].variants & (1u64 << v.min(63)) == 0 {
                        continue;
                    }
                    match truth_of_rule(t, self.rule[r]) {
                        Truth::True => {
                            declined = true;
                            break;
                        }
                        Truth::Unknown => {
                            let c = self.rule[r].expect("enabled");
                            key.push(c as u32);
                            open.push(c);
                        }
                        Truth::False => {}
                    }
                }
                if declined {
                    key.truncate(mark.0);
                    open.truncate(mark.1);
                    key.push(u32::MAX - 1000);
                }
            }
        }
    }

    /// Candidate preference entries: those not false, up to the first true one; unknown ones
    /// are appended to `rel`.
    pub fn orders(&self, t: &[Truth], rel: &mut Vec<usize>) -> Vec<usize> {
        let mut out = Vec::new();
        for (i, c) in self.pref.iter().enumerate() {
            match truth_of(t, *c) {
                Truth::False => {}
                Truth::True => {
                    out.push(i);
                    break;
                }
                Truth::Unknown => {
                    out.push(i);
                    rel.push(c.expect("unknown pref"));
                }
            }
        }
        out
    }

    /// The selected (backend, variant) when determined.
    pub fn select(
        &self,
        p: &Policy,
        t: &[Truth],
        rel: &mut Vec<usize>,
    ) -> Result<Option<(u16, usize)>, Open> {
        let mut prel = Vec::new();
        let orders = self.orders(t, &mut prel);
        if orders.is_empty() {
            return Ok(None);
        }
        let picked = agreed(orders.iter().map(|&o| {
            for &b in &p.preference[o].order {
                match self.variant(p, b as usize, t, rel) {
                    Ok(Some(v)) => return Some(Some((b, v))),
                    Ok(None) => {}
                    Err(Open) => return None,
                }
            }
            Some(None)
        }));
        picked.ok_or_else(|| {
            rel.extend(prel);
            Open
        })
    }
}

fn truth_of_rule(t: &[Truth], c: Option<usize>) -> Truth {
    c.map_or(Truth::False, |i| t[i])
}

/// The search engine over one [`Space`].
pub struct Engine<'a> {
    pub space: &'a Space,
    progs: Vec<&'a Program>,
    pub conds: Vec<CondRef>,
    /// Per var: the conditions reading a fact it determines.
    touch: Vec<Vec<u32>>,
    memos: Vec<Vec<Option<Value>>>,
    /// Per condition: the vars that determine the facts it reads.
    cond_vars: Vec<Vec<u32>>,
    /// Per condition, per entry of `cond_vars`: each class of the var -> the class of the
    /// condition's own space holding its representative. Classes with the same image are
    /// interchangeable for that condition.
    cond_maps: Vec<Vec<Vec<u32>>>,
    /// The classes the current node allows per var (None: unassigned).
    sets: Vec<Option<Vec<u32>>>,
    cache: std::collections::HashMap<u128, CacheEntry>,
    log: Vec<LoggedLeaf>,
    /// Cache hits (subtrees replayed instead of searched).
    pub hits: u64,
}

/// Per var, the set of classes a region allows (None: any).
pub type Sets = [Option<Vec<u32>>];

/// The judge of a search: truths of the registered conditions, fact values, assignment.
pub type Judge<'j, T> = dyn FnMut(&[Truth], &[Value], &Assign) -> Judged<T> + 'j;

/// A replayed leaf: assignment, class sets, truths.
type Replayed = (Assign, Vec<Option<Vec<u32>>>, Vec<Truth>);

/// Undetermined (the unknown conditions that could settle it were appended to `rel`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Open;

impl<'a> Engine<'a> {
    pub fn new(space: &'a Space) -> Engine<'a> {
        Engine {
            space,
            progs: Vec::new(),
            conds: Vec::new(),
            touch: Vec::new(),
            memos: Vec::new(),
            cond_vars: Vec::new(),
            cond_maps: Vec::new(),
            sets: Vec::new(),
            cache: std::collections::HashMap::new(),
            log: Vec::new(),
            hits: 0,
        }
    }

    pub fn program(&mut self, p: &'a Program) -> usize {
        self.progs.push(p);
        self.memos.push(p.new_memo());
        self.progs.len() - 1
    }

    pub fn cond(&mut self, prog: usize, cond: Cond) -> usize {
        self.conds.push(CondRef { prog, cond });
        self.conds.len() - 1
    }

    /// Registers every condition of a policy (in program `prog`).
    pub fn policy(&mut self, p: &Policy, prog: usize) -> PolicyConds {
        let c = |x: &crate::check::Compiled| Cond {
            node: x.node,
            mask: mask_of(&x.slots),
        };
        let rule = p
            .rules
            .iter()
            .map(|r| {
                p.layer_enabled(r.layer)
                    .then(|| self.cond(prog, c(&r.when)))
            })
            .collect();
        let app = p
            .backends
            .iter()
            .map(|b| {
                if b.variants.is_empty() {
                    vec![None]
                } else {
                    b.variants
                        .iter()
                        .map(|v| v.applicable.as_ref().map(|a| self.cond(prog, c(a))))
                        .collect()
                }
            })
            .collect();
        let pref = p
            .preference
            .iter()
            .map(|e| e.when.as_ref().map(|w| self.cond(prog, c(w))))
            .collect();
        let mut by_backend = vec![Vec::new(); p.backends.len()];
        for (i, r) in p.rules.iter().enumerate() {
            by_backend[r.backend as usize].push(i);
        }
        PolicyConds {
            rule,
            app,
            pref,
            by_backend,
        }
    }

    fn prepare(&mut self) {
        let nv = self.space.vars.len();
        let mut affects: Vec<SlotMask> = vec![0; nv];
        for (s, deps) in self.space.deps.iter().enumerate() {
            for &v in deps {
                affects[v] |= super::space::slot_bit(s);
            }
        }
        self.touch = vec![Vec::new(); nv];
        self.cond_vars = Vec::with_capacity(self.conds.len());
        for (i, c) in self.conds.iter().enumerate() {
            let mut vs = Vec::new();
            for (v, a) in affects.iter().enumerate() {
                if a & c.cond.mask != 0 {
                    self.touch[v].push(i as u32);
                    vs.push(v as u32);
                }
            }
            // The condition's own abstraction: which classes of each var it tells apart.
            let mut b = SpaceBuilder::new();
            b.root(self.progs[c.prog], c.cond.node);
            let sub = b.build();
            let maps = vs
                .iter()
                .map(|&v| {
                    let var = &self.space.vars[v as usize];
                    let sv = sub.var_of(var.path);
                    (0..var.classes.len())
                        .map(|k| {
                            sv.and_then(|sv| sub.class_of(sv, var.classes[k].value))
                                .map_or(1_000_000 + k as u32, |x| x as u32)
                        })
                        .collect()
                })
                .collect();
            self.cond_maps.push(maps);
            self.cond_vars.push(vs);
        }
    }

    /// Class sets as reported to `found`: a set holding every class of its var is `None`.
    fn reported(&self, sets: &Sets) -> Vec<Option<Vec<u32>>> {
        sets.iter()
            .enumerate()
            .map(|(v, s)| {
                s.clone()
                    .filter(|s| s.len() < self.space.vars[v].classes.len())
            })
            .collect()
    }

    /// Forgets memoised definition values (call whenever the facts change).
    fn reset_memos(&mut self) {
        for m in &mut self.memos {
            m.iter_mut().for_each(|x| *x = None);
        }
    }

    fn eval(&mut self, i: usize, vals: &[Value]) -> Truth {
        let c = self.conds[i];
        Truth::of(self.progs[c.prog].eval_memo(c.cond.node, vals, &mut self.memos[c.prog]))
    }

    /// Whether condition `i`'s image of the classes in `set` of its `k`-th var is one class.
    fn constant_on(&self, i: usize, k: usize, set: &[u32]) -> bool {
        let map = &self.cond_maps[i][k];
        set.iter().all(|&c| map[c as usize] == map[set[0] as usize])
    }

    /// Depth-first search from the empty assignment. `found` returns false to stop.
    pub fn run<T>(
        &mut self,
        budget: u64,
        judge: &mut Judge<'_, T>,
        found: &mut dyn FnMut(&Assign, &Sets, T) -> bool,
    ) -> Stats {
        self.prepare();
        let mut st = Stats::default();
        let mut assign: Assign = vec![None; self.space.vars.len()];
        self.sets = vec![None; self.space.vars.len()];
        let mut vals = Vec::new();
        self.space.materialize(&assign, &mut vals);
        self.reset_memos();
        let truths: Vec<Truth> = (0..self.conds.len()).map(|i| self.eval(i, &vals)).collect();
        let mut stop = false;
        let mut unres = vec![0u32; self.conds.len()];
        self.rec(
            budget,
            judge,
            found,
            &mut assign,
            &mut vals,
            truths,
            &mut unres,
            &mut st,
            &mut stop,
        );
        st
    }

    /// The var to split for the open conditions `rel`, and the conditions to split it by.
    fn choose(&self, assign: &Assign, rel: &[usize]) -> Option<(usize, Vec<(usize, usize)>)> {
        let nv = self.space.vars.len();
        let mut count = vec![0u32; nv];
        let mut by: Vec<Vec<(usize, usize)>> = vec![Vec::new(); nv];
        for &i in rel {
            for (k, &v) in self.cond_vars[i].iter().enumerate() {
                let v = v as usize;
                let open = match &self.sets[v] {
                    None => self.space.available(assign, v),
                    Some(set) => !self.constant_on(i, k, set),
                };
                if open {
                    count[v] += 1;
                    by[v].push((i, k));
                }
            }
        }
        let mut best: Option<(usize, usize)> = None;
        for v in 0..nv {
            if count[v] == 0 {
                continue;
            }
            let nb = self.count_blocks(v, &by[v]);
            let better = match best {
                None => true,
                Some((b, bb)) => {
                    // Fewest blocks per condition settled.
                    (nb as u64) * (count[b] as u64) < (bb as u64) * (count[v] as u64)
                        || (nb as u64) * (count[b] as u64) == (bb as u64) * (count[v] as u64)
                            && count[v] > count[b]
                }
            };
            if better {
                best = Some((v, nb));
            }
        }
        let best = best.map(|(v, _)| v);
        if best.is_none() {
            // Conditions reading only members of an unassigned object: assign the object.
            for &i in rel {
                for &v in &self.cond_vars[i] {
                    if let Some(p) = self.space.vars[v as usize].parent
                        && self.space.available(assign, p)
                    {
                        return Some((p, Vec::new()));
                    }
                }
            }
        }
        best.map(|v| (v, std::mem::take(&mut by[v])))
    }

    /// How many blocks splitting var `v` by the conditions `by` would make.
    fn count_blocks(&self, v: usize, by: &[(usize, usize)]) -> usize {
        self.split_blocks(v, by).len()
    }

    fn split_blocks(&self, v: usize, by: &[(usize, usize)]) -> Vec<Vec<u32>> {
        let all: Vec<u32>;
        let cur: &[u32] = match &self.sets[v] {
            Some(s) => s,
            None => {
                all = (0..self.space.vars[v].classes.len() as u32).collect();
                &all
            }
        };
        let mut blocks: Vec<Vec<u32>> = Vec::new();
        let mut keys: std::collections::HashMap<Vec<u32>, usize> = std::collections::HashMap::new();
        // An object is always split into absent / present: its members exist only then.
        let parent = self.space.vars.iter().any(|x| x.parent == Some(v));
        for &c in cur {
            let mut key: Vec<u32> = by
                .iter()
                .map(|&(i, k)| self.cond_maps[i][k][c as usize])
                .collect();
            if parent {
                key.push(u32::from(
                    self.space.vars[v].classes[c as usize].value == Value::Null,
                ));
            }
            match keys.get(&key) {
                Some(&p) => blocks[p].push(c),
                None => {
                    keys.insert(key, blocks.len());
                    blocks.push(vec![c]);
                }
            }
        }
        blocks
    }

    #[allow(clippy::too_many_arguments)]
    fn rec<T>(
        &mut self,
        budget: u64,
        judge: &mut Judge<'_, T>,
        found: &mut dyn FnMut(&Assign, &Sets, T) -> bool,
        assign: &mut Assign,
        vals: &mut Vec<Value>,
        truths: Vec<Truth>,
        unres: &mut Vec<u32>,
        st: &mut Stats,
        stop: &mut bool,
    ) {
        if *stop {
            return;
        }
        if st.nodes >= budget || st.classes >= budget {
            st.truncated = true;
            *stop = true;
            return;
        }
        st.nodes += 1;
        let rel = match judge(&truths, vals, assign) {
            Judged::Prune => {
                st.classes += 1;
                return;
            }
            Judged::Leaf(t) => {
                st.classes += 1;
                let sets = self.reported(&self.sets);
                self.log.push(LoggedLeaf {
                    assign: assign.clone(),
                    sets: self.sets.clone(),
                    truths: truths.clone(),
                });
                if !found(assign, &sets, t) {
                    *stop = true;
                }
                return;
            }
            Judged::Split(rel) => rel,
            Judged::SplitKeyed(rel, key, open) => {
                let mut vars: Vec<u32> = open
                    .iter()
                    .flat_map(|&i| self.cond_vars[i].iter().copied())
                    .collect();
                vars.sort_unstable();
                vars.dedup();
                let full = {
                    use std::hash::{Hash, Hasher};
                    let mut h1 = std::collections::hash_map::DefaultHasher::new();
                    let mut h2 = std::collections::hash_map::DefaultHasher::new();
                    0xA5u8.hash(&mut h2);
                    for h in [&mut h1, &mut h2] {
                        key.hash(h);
                        for &v in &vars {
                            (v, &self.sets[v as usize]).hash(h);
                        }
                    }
                    (u128::from(h1.finish()) << 64) | u128::from(h2.finish())
                };
                if let Some(e) = self.cache.get(&full) {
                    self.hits += 1;
                    st.classes += e.classes;
                    let leaves: Vec<Replayed> = e
                        .leaves
                        .iter()
                        .map(|l| {
                            let mut a = assign.clone();
                            let mut ss = self.sets.clone();
                            for (v, c, set) in &l.vars {
                                a[*v as usize] = *c;
                                ss[*v as usize] = set.clone();
                            }
                            let mut t = truths.clone();
                            for &(i, x) in &l.truths {
                                t[i as usize] = x;
                            }
                            (a, ss, t)
                        })
                        .collect();
                    for (a, ss, t) in leaves {
                        self.space.materialize(&a, vals);
                        let Judged::Leaf(x) = judge(&t, vals, &a) else {
                            panic!("a cached leaf is no longer a leaf: cache key too coarse");
                        };
                        let out = self.reported(&ss);
                        self.log.push(LoggedLeaf {
                            assign: a.clone(),
                            sets: ss,
                            truths: t,
                        });
                        if !found(&a, &out, x) {
                            *stop = true;
                            return;
                        }
                    }
                    return;
                }
                let base = self.log.len();
                let classes0 = st.classes;
                let nodes0 = st.nodes;
                let base_assign = assign.clone();
                let base_sets = self.sets.clone();
                self.split(
                    budget, judge, found, assign, vals, &truths, unres, st, stop, &rel,
                );
                if !*stop && self.log.len() - base <= 256 && st.nodes - nodes0 >= 4 {
                    let leaves = self.log[base..]
                        .iter()
                        .map(|l| CachedLeaf {
                            vars: vars
                                .iter()
                                .filter(|&&v| {
                                    l.assign[v as usize] != base_assign[v as usize]
                                        || l.sets[v as usize] != base_sets[v as usize]
                                })
                                .map(|&v| (v, l.assign[v as usize], l.sets[v as usize].clone()))
                                .collect(),
                            truths: open
                                .iter()
                                .filter(|&&i| l.truths[i] != Truth::Unknown)
                                .map(|&i| (i as u32, l.truths[i]))
                                .collect(),
                        })
                        .collect();
                    self.cache.insert(
                        full,
                        CacheEntry {
                            leaves,
                            classes: st.classes - classes0,
                        },
                    );
                }
                return;
            }
        };
        self.split(
            budget, judge, found, assign, vals, &truths, unres, st, stop, &rel,
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn split<T>(
        &mut self,
        budget: u64,
        judge: &mut Judge<'_, T>,
        found: &mut dyn FnMut(&Assign, &Sets, T) -> bool,
        assign: &mut Assign,
        vals: &mut Vec<Value>,
        truths: &[Truth],
        unres: &mut Vec<u32>,
        st: &mut Stats,
        stop: &mut bool,
        rel: &[usize],
    ) {
        let Some((v, by)) = self.choose(assign, rel) else {
            st.stuck += 1;
            st.classes += 1;
            return;
        };
        // Split v's current classes by what the chosen conditions tell apart.
        let blocks = self.split_blocks(v, &by);
        let old_set = self.sets[v].take();
        let old_assign = assign[v];
        let touch = self.touch[v].clone();
        // Position of v in each touching condition's var list.
        let pos: Vec<usize> = touch
            .iter()
            .map(|&i| {
                self.cond_vars[i as usize]
                    .iter()
                    .position(|&x| x as usize == v)
                    .expect("touching condition reads v")
            })
            .collect();
        let old_nc: Vec<bool> = touch
            .iter()
            .zip(&pos)
            .map(|(&i, &k)| {
                old_set
                    .as_ref()
                    .is_some_and(|s| !self.constant_on(i as usize, k, s))
            })
            .collect();
        for block in blocks {
            assign[v] = Some(block[0]);
            for ((&i, &k), &onc) in touch.iter().zip(&pos).zip(&old_nc) {
                let nc = !self.constant_on(i as usize, k, &block);
                let u = &mut unres[i as usize];
                *u = *u + u32::from(nc) - u32::from(onc);
            }
            self.sets[v] = Some(block);
            self.space.materialize(assign, vals);
            self.reset_memos();
            let mut t = truths.to_vec();
            for &i in &touch {
                let i = i as usize;
                if t[i] == Truth::Unknown && unres[i] == 0 {
                    t[i] = self.eval(i, vals);
                }
            }
            self.rec(budget, judge, found, assign, vals, t, unres, st, stop);
            let block = self.sets[v].take().expect("block");
            for ((&i, &k), &onc) in touch.iter().zip(&pos).zip(&old_nc) {
                let nc = !self.constant_on(i as usize, k, &block);
                let u = &mut unres[i as usize];
                *u = *u + u32::from(onc) - u32::from(nc);
            }
            if *stop {
                break;
            }
        }
        assign[v] = old_assign;
        self.sets[v] = old_set;
    }
}
