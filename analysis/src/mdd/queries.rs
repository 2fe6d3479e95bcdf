//! The policy questions: a pack's rules, applicability and preference as diagrams, and the
//! regions where it selects nothing (`gaps`), each outcome (`diff`), or a backend at all
//! (`check`'s unselectable lint).
//!
//! The diagrams mirror the decision procedure: the first preference entry whose `when` holds,
//! in its order the first backend with an eligible variant, its first eligible variant; a
//! variant is eligible where it is applicable and no rule of an enabled layer declines it.
//! Invariants: `first_pref` are disjoint and, with `no_pref`, cover the space; the results of
//! `outcomes_within` are disjoint and cover `acc`. Selection is never built over the whole
//! space: it is computed *within* a region (`acc`), conjoining the small per-backend
//! "declined" diagrams first (backends with the fewest rules first), which keeps the
//! intermediate diagrams small.

use super::manager::Mdd;
use super::store::{FALSE, Id, TRUE};

/// The diagrams of one pack's rules, applicability and preference, and per backend variant
/// where it is out (not applicable or declined). What the pack selects is computed on demand
/// *within* a region (`acc`), conjoining the small "declined" diagrams first.
pub struct PolicyDiagrams {
    /// Per rule: where it fires (false when its layer is disabled).
    pub rule: Vec<Id>,
    /// Per backend, per variant (one implicit variant when none): where it is applicable.
    pub app: Vec<Vec<Id>>,
    /// Per backend, per variant: the rules that decline it.
    pub decliners: Vec<Vec<Vec<usize>>>,
    /// Per backend, per variant: where it is not applicable or some rule declines it.
    pub variant_out: Vec<Vec<Id>>,
    /// Per preference entry: where it is the entry that applies (the first whose `when` holds).
    pub first_pref: Vec<Id>,
    /// Where no preference entry applies.
    pub no_pref: Id,
}

impl PolicyDiagrams {
    /// Builds the diagrams of `p` (its program is registered with the manager).
    pub fn build(m: &mut Mdd, p: &attn_policy::Policy) -> PolicyDiagrams {
        let prog = m.program(&p.program);
        let rule: Vec<Id> = p
            .rules
            .iter()
            .map(|r| {
                if p.layer_enabled(r.layer) {
                    m.condition(prog, r.when.node)
                } else {
                    FALSE
                }
            })
            .collect();
        let app: Vec<Vec<Id>> = p
            .backends
            .iter()
            .map(|b| {
                if b.variants.is_empty() {
                    vec![TRUE]
                } else {
                    b.variants
                        .iter()
                        .map(|v| {
                            v.applicable
                                .as_ref()
                                .map_or(TRUE, |a| m.condition(prog, a.node))
                        })
                        .collect()
                }
            })
            .collect();
        let decliners = app
            .iter()
            .enumerate()
            .map(|(b, apps)| {
                (0..apps.len())
                    .map(|v| {
                        (0..p.rules.len())
                            .filter(|&r| {
                                p.rules[r].backend as usize == b
                                    && p.rules[r].variants & (1u64 << v.min(63)) != 0
                                    && rule[r] != FALSE
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        // With the rule-walk variable order these stay small (FusedAttention ~35k nodes).
        let variant_out = app
            .iter()
            .zip(&decliners)
            .map(|(apps, decl): (&Vec<Id>, &Vec<Vec<usize>>)| {
                apps.iter()
                    .zip(decl)
                    .map(|(&a, rules)| {
                        let na = m.not(a);
                        let any = m.any_smallest_first(
                            &rules.iter().map(|&r| rule[r]).collect::<Vec<_>>(),
                        );
                        m.or(na, any)
                    })
                    .collect()
            })
            .collect();
        let mut first_pref = Vec::with_capacity(p.preference.len());
        let mut earlier = FALSE;
        for e in &p.preference {
            let w = e.when.as_ref().map_or(TRUE, |c| m.condition(prog, c.node));
            first_pref.push(m.minus(w, earlier));
            earlier = m.or(earlier, w);
        }
        PolicyDiagrams {
            rule,
            app,
            decliners,
            variant_out,
            first_pref,
            no_pref: m.not(earlier),
        }
    }

    /// Backends with the fewest rules first: intersecting "declined" regions in this order
    /// shrinks the region the next (larger) backend's rules are intersected with.
    fn fewest_rules_first(&self, order: &[u16]) -> Vec<usize> {
        let mut out: Vec<usize> = order.iter().map(|&b| b as usize).collect();
        out.sort_by_key(|&b| self.decliners[b].iter().map(Vec::len).sum::<usize>());
        out
    }

    /// `acc and not (variant v of backend b is applicable and declined by no rule)`.
    pub fn variant_out(&self, m: &mut Mdd, b: usize, v: usize, acc: Id) -> Id {
        m.and(acc, self.variant_out[b][v])
    }

    /// `acc and not (backend b is eligible)`.
    pub fn declined_within(&self, m: &mut Mdd, b: usize, acc: Id) -> Id {
        let mut out = acc;
        for v in 0..self.app[b].len() {
            if out == FALSE {
                break;
            }
            out = self.variant_out(m, b, v, out);
        }
        out
    }

    /// `acc and (backend b is eligible)`.
    pub fn eligible_within(&self, m: &mut Mdd, b: usize, acc: Id) -> Id {
        let d = self.declined_within(m, b, acc);
        m.minus(acc, d)
    }

    /// `acc and` backend `b` is eligible and every other backend is not: only `b` serves.
    pub fn only_within(&self, m: &mut Mdd, b: usize, acc: Id) -> Id {
        let mut out = self.eligible_within(m, b, acc);
        let others: Vec<u16> = (0..self.app.len() as u16)
            .filter(|&x| x as usize != b)
            .collect();
        for other in self.fewest_rules_first(&others) {
            if out == FALSE {
                break;
            }
            out = self.declined_within(m, other, out);
        }
        out
    }

    /// Where, within `acc`, the pack selects nothing.
    pub fn none_within(&self, m: &mut Mdd, p: &attn_policy::Policy, acc: Id) -> Id {
        let mut out = m.and(acc, self.no_pref);
        for (i, e) in p.preference.iter().enumerate() {
            let mut part = m.and(acc, self.first_pref[i]);
            for b in self.fewest_rules_first(&e.order) {
                if part == FALSE {
                    break;
                }
                part = self.declined_within(m, b, part);
            }
            out = m.or(out, part);
        }
        out
    }

    /// Within `acc`, where the pack selects each outcome ((backend, variant); None: nothing)
    /// as disjoint diagrams covering `acc`, empty ones left out. Mirrors the decision: the
    /// first preference entry that applies, in its order the first backend with an eligible
    /// variant, its first eligible variant.
    pub fn outcomes_within(
        &self,
        m: &mut Mdd,
        p: &attn_policy::Policy,
        acc: Id,
    ) -> Vec<(Option<(u16, usize)>, Id)> {
        let mut out: Vec<(Option<(u16, usize)>, Id)> = Vec::new();
        let mut add = |m: &mut Mdd, o: Option<(u16, usize)>, d: Id| {
            if d == FALSE {
                return;
            }
            match out.iter_mut().find(|e| e.0 == o) {
                Some(e) => e.1 = m.or(e.1, d),
                None => out.push((o, d)),
            }
        };
        let none = m.and(acc, self.no_pref);
        add(m, None, none);
        for (i, e) in p.preference.iter().enumerate() {
            let mut part = m.and(acc, self.first_pref[i]);
            for &b in &e.order {
                for v in 0..self.app[b as usize].len() {
                    if part == FALSE {
                        break;
                    }
                    let out_v = self.variant_out(m, b as usize, v, part);
                    let chosen = m.minus(part, out_v);
                    add(m, Some((b, v)), chosen);
                    part = out_v;
                }
            }
            add(m, None, part);
        }
        out
    }

    /// Whether backend `b` is selected for some input within `within`: for some preference
    /// entry listing it, some input where that entry applies, some variant of `b` is eligible
    /// and every variant of every backend before it is out. Asked of the conjunction without
    /// building it ([`Mdd::satisfiable`]: it stops at the first such input).
    pub fn selectable(&self, m: &mut Mdd, p: &attn_policy::Policy, b: usize, within: Id) -> bool {
        for (i, e) in p.preference.iter().enumerate() {
            let Some(pos) = e.order.iter().position(|&x| x as usize == b) else {
                continue;
            };
            let mut lits = vec![(within, true), (self.first_pref[i], true)];
            for &earlier in &e.order[..pos] {
                lits.extend(
                    self.variant_out[earlier as usize]
                        .iter()
                        .map(|&x| (x, true)),
                );
            }
            for &out in &self.variant_out[b] {
                lits.push((out, false));
                if m.satisfiable(&lits) {
                    return true;
                }
                lits.pop();
            }
        }
        false
    }

    /// Whether backend `b` is eligible for some input (some variant is not out).
    pub fn ever_eligible(&self, b: usize) -> bool {
        self.variant_out[b].iter().any(|&x| x != TRUE)
    }
}
