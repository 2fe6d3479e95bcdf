//! Three-valued evaluation of a whole policy over a partial assignment, and the
//! branch-and-bound search over a [`Space`]: a node is split on a variable only while some
//! condition that matters is still unknown, so regions where the outcome is settled by a few
//! facts are never enumerated further.

use crate::eval::program::{NodeId, Truth};
use crate::facts::Value;
use crate::policy::Policy;

use super::space::{Assign, SlotMask, Space, mask_of};

/// A condition compiled in a policy's program, with the facts it reads.
#[derive(Clone, Copy, Debug)]
pub struct Cond {
    pub node: NodeId,
    pub mask: SlotMask,
}

/// A policy prepared for three-valued evaluation.
pub struct PolicyEval<'a> {
    pub policy: &'a Policy,
    pub rule_cond: Vec<Cond>,
    pub rule_enabled: Vec<bool>,
    /// Per backend: rule indices.
    pub by_backend: Vec<Vec<usize>>,
    /// Per backend, per variant (one implicit variant when none): applicability.
    pub applicable: Vec<Vec<Option<Cond>>>,
    pub pref: Vec<Option<Cond>>,
}

/// Outcome of a three-valued test, with the facts its unknown parts read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tri {
    pub truth: Truth,
    pub mask: SlotMask,
}

impl<'a> PolicyEval<'a> {
    pub fn new(policy: &'a Policy) -> PolicyEval<'a> {
        let rule_cond = policy
            .rules
            .iter()
            .map(|r| Cond {
                node: r.when.node,
                mask: mask_of(&r.when.slots),
            })
            .collect();
        let rule_enabled = policy
            .rules
            .iter()
            .map(|r| policy.layer_enabled(r.layer))
            .collect();
        let mut by_backend = vec![Vec::new(); policy.backends.len()];
        for (i, r) in policy.rules.iter().enumerate() {
            by_backend[r.backend as usize].push(i);
        }
        let applicable = policy
            .backends
            .iter()
            .map(|b| {
                if b.variants.is_empty() {
                    vec![None]
                } else {
                    b.variants
                        .iter()
                        .map(|v| {
                            v.applicable.as_ref().map(|c| Cond {
                                node: c.node,
                                mask: mask_of(&c.slots),
                            })
                        })
                        .collect()
                }
            })
            .collect();
        let pref = policy
            .preference
            .iter()
            .map(|p| {
                p.when.as_ref().map(|c| Cond {
                    node: c.node,
                    mask: mask_of(&c.slots),
                })
            })
            .collect();
        PolicyEval {
            policy,
            rule_cond,
            rule_enabled,
            by_backend,
            applicable,
            pref,
        }
    }

    pub fn truth(&self, c: Cond, vals: &[Value]) -> Truth {
        Truth::of(self.policy.program.eval(c.node, vals))
    }

    /// Truth of every rule condition (disabled layers: false).
    pub fn rules(&self, vals: &[Value], out: &mut Vec<Truth>) {
        out.clear();
        for (i, c) in self.rule_cond.iter().enumerate() {
            out.push(if self.rule_enabled[i] {
                self.truth(*c, vals)
            } else {
                Truth::False
            });
        }
    }

    /// Whether backend `b` is eligible (some variant applicable and not declined).
    pub fn eligible(&self, b: usize, vals: &[Value], rules: &[Truth]) -> Tri {
        let mut mask = 0;
        let mut any_unknown = false;
        for (v, app) in self.applicable[b].iter().enumerate() {
            let a = app.map_or(Truth::True, |c| self.truth(c, vals));
            if a == Truth::False {
                continue;
            }
            let mut declined = Truth::False;
            let mut dmask = 0;
            for &r in &self.by_backend[b] {
                if self.policy.rules[r].variants & (1u64 << v.min(63)) == 0 {
                    continue;
                }
                match rules[r] {
                    Truth::True => {
                        declined = Truth::True;
                        break;
                    }
                    Truth::Unknown => {
                        declined = Truth::Unknown;
                        dmask |= self.rule_cond[r].mask;
                    }
                    Truth::False => {}
                }
            }
            match (a, declined) {
                (_, Truth::True) => {}
                (Truth::True, Truth::False) => {
                    return Tri {
                        truth: Truth::True,
                        mask: 0,
                    };
                }
                _ => {
                    any_unknown = true;
                    mask |= dmask;
                    if a == Truth::Unknown {
                        mask |= app.map_or(0, |c| c.mask);
                    }
                }
            }
        }
        Tri {
            truth: if any_unknown {
                Truth::Unknown
            } else {
                Truth::False
            },
            mask,
        }
    }

    /// Candidate preference orders: entries whose condition is not false, up to the first true
    /// one. `Err(mask)` lists what the unknown entries read.
    fn orders(&self, vals: &[Value]) -> (Vec<usize>, SlotMask) {
        let mut out = Vec::new();
        let mut mask = 0;
        for (i, p) in self.pref.iter().enumerate() {
            let t = p.map_or(Truth::True, |c| self.truth(c, vals));
            match t {
                Truth::False => {}
                Truth::True => {
                    out.push(i);
                    break;
                }
                Truth::Unknown => {
                    out.push(i);
                    mask |= p.map_or(0, |c| c.mask);
                }
            }
        }
        (out, mask)
    }

    /// The selected backend when it is determined: `Ok(Some(b))`, `Ok(None)` (nothing
    /// selected); `Err(mask)` when it depends on unassigned facts.
    pub fn select(&self, vals: &[Value], rules: &[Truth]) -> Result<Option<u16>, SlotMask> {
        let (orders, pmask) = self.orders(vals);
        let mut elig: Vec<Option<Tri>> = vec![None; self.policy.backends.len()];
        if orders.is_empty() {
            return Ok(None);
        }
        let mut mask = 0;
        let picked = agreed(orders.iter().map(|&o| {
            for &b in &self.policy.preference[o].order {
                let e =
                    *elig[b as usize].get_or_insert_with(|| self.eligible(b as usize, vals, rules));
                match e.truth {
                    Truth::True => return Some(Some(b)),
                    Truth::False => {}
                    Truth::Unknown => {
                        mask |= e.mask;
                        return None;
                    }
                }
            }
            Some(None)
        }));
        picked.ok_or(mask | pmask)
    }

    /// Whether some backend is selected (for gaps): true as soon as one backend of every
    /// candidate order is eligible.
    pub fn any_selected(&self, vals: &[Value], rules: &[Truth]) -> Tri {
        let (orders, pmask) = self.orders(vals);
        if orders.is_empty() {
            return Tri {
                truth: Truth::False,
                mask: 0,
            };
        }
        let mut elig: Vec<Option<Tri>> = vec![None; self.policy.backends.len()];
        let mut all_true = true;
        let mut all_false = true;
        let mut mask = 0;
        for &o in &orders {
            let mut t = Truth::False;
            for &b in &self.policy.preference[o].order {
                let e =
                    *elig[b as usize].get_or_insert_with(|| self.eligible(b as usize, vals, rules));
                match e.truth {
                    Truth::True => {
                        t = Truth::True;
                        break;
                    }
                    Truth::Unknown => {
                        t = Truth::Unknown;
                        mask |= e.mask;
                    }
                    Truth::False => {}
                }
            }
            all_true &= t == Truth::True;
            all_false &= t == Truth::False;
        }
        if all_true {
            Tri {
                truth: Truth::True,
                mask: 0,
            }
        } else if all_false {
            Tri {
                truth: Truth::False,
                mask: 0,
            }
        } else {
            Tri {
                truth: Truth::Unknown,
                mask: mask | pmask,
            }
        }
    }
}

/// What the judge says about a node of the search.
pub enum Step<T> {
    /// Nothing to report anywhere below.
    Prune,
    /// The whole region below has this outcome.
    Leaf(T),
    /// Undetermined: split on a variable that these facts depend on.
    Split(SlotMask),
}

#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Stats {
    /// Search nodes evaluated.
    pub nodes: u64,
    /// Settled regions (leaves: pruned or reported), the equivalence classes examined.
    pub classes: u64,
    /// Nodes left undetermined with nothing to split on (should stay 0).
    pub stuck: u64,
    /// The node budget ran out: the result is incomplete.
    pub truncated: bool,
}

/// Depth-first branch and bound. `found` returns false to stop the search.
pub fn search<T>(
    space: &Space,
    budget: u64,
    judge: &mut dyn FnMut(&[Value]) -> Step<T>,
    found: &mut dyn FnMut(&Assign, T) -> bool,
) -> Stats {
    let mut order: Vec<usize> = (0..space.vars.len()).collect();
    // Most-read facts first (they settle the most conditions), then fewer classes.
    order.sort_by_key(|&i| {
        (
            std::cmp::Reverse(space.reads[i]),
            space.vars[i].classes.len(),
        )
    });
    let mut rank = vec![0usize; space.vars.len()];
    for (r, &i) in order.iter().enumerate() {
        rank[i] = r;
    }
    let mut st = Stats::default();
    let mut assign: Assign = vec![None; space.vars.len()];
    let mut vals = Vec::new();
    let mut stop = false;
    rec(
        space,
        &rank,
        budget,
        judge,
        found,
        &mut assign,
        &mut vals,
        &mut st,
        &mut stop,
    );
    st
}

#[allow(clippy::too_many_arguments)]
fn rec<T>(
    space: &Space,
    rank: &[usize],
    budget: u64,
    judge: &mut dyn FnMut(&[Value]) -> Step<T>,
    found: &mut dyn FnMut(&Assign, T) -> bool,
    assign: &mut Assign,
    vals: &mut Vec<Value>,
    st: &mut Stats,
    stop: &mut bool,
) {
    if *stop {
        return;
    }
    if st.nodes >= budget {
        st.truncated = true;
        *stop = true;
        return;
    }
    st.nodes += 1;
    space.materialize(assign, vals);
    let mask = match judge(vals) {
        Step::Prune => {
            st.classes += 1;
            return;
        }
        Step::Leaf(t) => {
            st.classes += 1;
            if !found(assign, t) {
                *stop = true;
            }
            return;
        }
        Step::Split(m) => m,
    };
    let mut best: Option<usize> = None;
    let mut m = mask;
    while m != 0 {
        let s = m.trailing_zeros() as usize;
        m &= m - 1;
        if let Some(&v) = space.deps[s].iter().find(|&&v| space.available(assign, v))
            && best.is_none_or(|b| rank[v] < rank[b])
        {
            best = Some(v);
        }
    }
    let Some(v) = best else {
        st.stuck += 1;
        st.classes += 1;
        return;
    };
    for c in 0..space.vars[v].classes.len() {
        assign[v] = Some(c as u32);
        rec(space, rank, budget, judge, found, assign, vals, st, stop);
        if *stop {
            break;
        }
    }
    assign[v] = None;
}

/// The selection every applicable preference order agrees on: `Some(s)` when each order's
/// selection is determined (`Some`) and all are equal, else `None`. Every order is visited, so
/// callers collect the unknown conditions of all of them.
pub(super) fn agreed<T: PartialEq>(per_order: impl Iterator<Item = Option<T>>) -> Option<T> {
    let mut result = None;
    let mut undetermined = false;
    for sel in per_order {
        match (sel, &result) {
            (None, _) => undetermined = true,
            (Some(s), None) => result = Some(s),
            (Some(s), Some(r)) if s != *r => undetermined = true,
            _ => {}
        }
    }
    if undetermined { None } else { result }
}
