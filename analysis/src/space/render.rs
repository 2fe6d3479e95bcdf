//! A set of classes of one var as a condition of the pack language (the regions' text).
//!
//! Invariant: an input satisfies the rendered condition iff its value lies in one of the
//! classes of the set (within the var's bounds). The text is made readable, not minimal:
//! adjacent intervals merge, an interval whose every residue class is in the set reads as a
//! plain interval, enums read as `==` / `in` / `not in` whichever is shorter.

use std::collections::{BTreeMap, BTreeSet};

use attn_policy::facts::{Domain, Value};

use super::model::{Class, ClassDesc, Space, Var};

impl Space {
    /// Renders the classes `set` of var `i` as an expression (None: no constraint).
    pub fn render(&self, i: usize, set: &[u32]) -> Option<String> {
        let v = &self.vars[i];
        let n = v.classes.len();
        if set.len() >= n {
            return None;
        }
        let path = v.path;
        let count = |d: ClassDesc| set.iter().any(|&c| v.classes[c as usize].desc == d);
        let (has_null, has_bad) = (count(ClassDesc::Null), count(ClassDesc::Unparseable));
        // The classes of present values (parsed ones, for a version).
        let present = |c: &&Class| !matches!(c.desc, ClassDesc::Null | ClassDesc::Unparseable);
        let rest: Vec<&Class> = set
            .iter()
            .map(|&c| &v.classes[c as usize])
            .filter(present)
            .collect();
        let bad_total = v.classes.iter().any(|c| c.desc == ClassDesc::Unparseable);
        let rest_total = v.classes.iter().filter(present).count();
        let mut parts: Vec<String> = Vec::new();
        if has_null {
            parts.push(format!("{path} == null"));
        }
        if has_bad && rest.len() == rest_total {
            // Every present value, parsed or not (null is not in the set, or it would be all).
            return Some(format!("{path} != null"));
        }
        if has_bad {
            let bad = format!("{path} != null and not parsed({path})");
            parts.push(if has_null || !rest.is_empty() {
                format!("({bad})")
            } else {
                bad
            });
        }
        if !rest.is_empty() {
            parts.push(if rest.len() < rest_total {
                self.render_non_null(v, &rest)
            } else if bad_total {
                format!("parsed({path})")
            } else {
                format!("{path} != null")
            });
        }
        Some(parts.join(" or "))
    }

    fn render_non_null(&self, v: &Var, cls: &[&Class]) -> String {
        let path = v.path;
        match &cls[0].desc {
            ClassDesc::Present => format!("{path} != null"),
            ClassDesc::Bool(b) => {
                if cls.len() == 2 {
                    format!("{path} != null")
                } else if *b {
                    path.to_string()
                } else {
                    format!("not {path}")
                }
            }
            ClassDesc::Enum(_) => {
                let dom = v.domain().expect("enum var");
                let names: Vec<String> = cls
                    .iter()
                    .filter_map(|c| match c.desc {
                        ClassDesc::Enum(i) => Some(format!("{:?}", dom.values()[i as usize])),
                        _ => None,
                    })
                    .collect();
                let all = dom.values().len();
                if names.len() == 1 {
                    format!("{path} == {}", names[0])
                } else if all - names.len() < names.len() {
                    let others: Vec<String> = dom
                        .values()
                        .iter()
                        .map(|s| format!("{s:?}"))
                        .filter(|s| !names.contains(s))
                        .collect();
                    if others.len() == 1 {
                        format!("{path} != {}", others[0])
                    } else {
                        format!("{path} not in [{}]", others.join(", "))
                    }
                } else {
                    format!("{path} in [{}]", names.join(", "))
                }
            }
            ClassDesc::Int { .. } => self.render_int(v, cls),
            ClassDesc::Ordered { .. } => {
                // Consecutive classes merge into one interval.
                let idx: Vec<usize> = cls
                    .iter()
                    .map(|c| {
                        v.classes
                            .iter()
                            .position(|x| std::ptr::eq(x, *c))
                            .unwrap_or(0)
                    })
                    .collect();
                let mut runs: Vec<(usize, usize)> = Vec::new();
                for &i in &idx {
                    match runs.last_mut() {
                        Some((_, e)) if *e + 1 == i => *e = i,
                        _ => runs.push((i, i)),
                    }
                }
                let terms: Vec<String> = runs
                    .iter()
                    .map(|&(s, e)| {
                        let lo = match &v.classes[s].desc {
                            ClassDesc::Ordered { lo, .. } => *lo,
                            _ => None,
                        };
                        let hi = match &v.classes[e].desc {
                            ClassDesc::Ordered { hi, .. } => *hi,
                            _ => None,
                        };
                        render_bounds(path, lo, hi, v.domain())
                    })
                    .collect();
                terms.join(" or ")
            }
            ClassDesc::Null => format!("{path} == null"),
            ClassDesc::Unparseable => format!("{path} != null and not parsed({path})"),
        }
    }

    fn render_int(&self, v: &Var, cls: &[&Class]) -> String {
        if v.modulus <= 1 {
            return self.render_int_residues(v, cls);
        }
        // Intervals whose every residue class is chosen read as plain intervals.
        let mut total: BTreeMap<usize, usize> = BTreeMap::new();
        for c in &v.classes {
            if let ClassDesc::Int { iv, .. } = c.desc {
                *total.entry(iv).or_default() += 1;
            }
        }
        let mut chosen: BTreeMap<usize, (usize, i64, i64)> = BTreeMap::new();
        for c in cls {
            if let ClassDesc::Int { iv, lo, hi, .. } = c.desc {
                let e = chosen.entry(iv).or_insert((0, lo, hi));
                e.0 += 1;
                e.1 = e.1.min(lo);
                e.2 = e.2.max(hi);
            }
        }
        let whole: Vec<(i64, i64)> = chosen
            .iter()
            .filter(|(iv, e)| total.get(iv) == Some(&e.0))
            .map(|(_, e)| (e.1, e.2))
            .collect();
        if whole.is_empty() {
            return self.render_int_residues(v, cls);
        }
        let partial: Vec<&Class> = cls
            .iter()
            .copied()
            .filter(|c| match c.desc {
                ClassDesc::Int { iv, .. } => total.get(&iv) != chosen.get(&iv).map(|e| &e.0),
                _ => false,
            })
            .collect();
        let mut terms = int_intervals(v, &whole);
        if !partial.is_empty() {
            terms.push(self.render_int_residues(v, &partial));
        }
        terms.join(" or ")
    }

    fn render_int_residues(&self, v: &Var, cls: &[&Class]) -> String {
        let path = v.path;
        // Group intervals by residue.
        let mut by_res: BTreeMap<i64, BTreeSet<(i64, i64)>> = BTreeMap::new();
        let mut all_res: BTreeMap<(i64, i64), BTreeSet<i64>> = BTreeMap::new();
        for c in &v.classes {
            if let ClassDesc::Int { lo, hi, r, .. } = c.desc {
                all_res.entry((lo, hi)).or_default().insert(r);
            }
        }
        for c in cls {
            if let ClassDesc::Int { lo, hi, r, .. } = c.desc {
                by_res.entry(r).or_default().insert((lo, hi));
            }
        }
        let int_terms = |ivs: &BTreeSet<(i64, i64)>| -> Vec<String> {
            int_intervals(v, &ivs.iter().copied().collect::<Vec<_>>())
        };
        if v.modulus <= 1 {
            let ivs = by_res.values().next().cloned().unwrap_or_default();
            return int_terms(&ivs).join(" or ");
        }
        // Same interval set for every chosen residue: intervals and residues separately.
        let first = by_res.values().next().cloned().unwrap_or_default();
        let uniform = by_res.values().all(|s| *s == first);
        let m = v.modulus;
        if uniform {
            let res: Vec<i64> = by_res.keys().copied().collect();
            // All residues of each interval chosen: no residue constraint.
            let full = first.iter().all(|iv| {
                all_res
                    .get(iv)
                    .is_some_and(|rs| rs.iter().all(|r| res.contains(r)))
            });
            let terms = int_terms(&first);
            let ivs = if terms.len() > 1 {
                format!("({})", terms.join(" or "))
            } else {
                terms.join("")
            };
            if full {
                return ivs;
            }
            let rc = if res.len() == 1 {
                format!("{path} % {m} == {}", res[0])
            } else if res.len() == m as usize - 1 {
                let missing = (0..m).find(|r| !res.contains(r)).unwrap_or(0);
                format!("{path} % {m} != {missing}")
            } else {
                format!(
                    "{path} % {m} in [{}]",
                    res.iter()
                        .map(i64::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            return format!("{ivs} and {rc}");
        }
        by_res
            .iter()
            .map(|(r, ivs)| {
                let t = int_terms(ivs);
                let ivs = if t.len() > 1 {
                    format!("({})", t.join(" or "))
                } else {
                    t.join("")
                };
                format!("({ivs} and {path} % {m} == {r})")
            })
            .collect::<Vec<_>>()
            .join(" or ")
    }
}

/// Sorted integer intervals as conditions, adjacent ones merged.
fn int_intervals(v: &Var, ivs: &[(i64, i64)]) -> Vec<String> {
    let path = v.path;
    let mut merged: Vec<(i64, i64)> = Vec::new();
    for &(lo, hi) in ivs {
        match merged.last_mut() {
            Some((_, e)) if *e + 1 == lo => *e = hi,
            _ => merged.push((lo, hi)),
        }
    }
    merged
        .iter()
        .map(|&(lo, hi)| {
            let (dlo, dhi) = v.bounds;
            if lo == hi {
                format!("{path} == {lo}")
            } else if lo <= dlo && hi >= dhi {
                format!("{path} >= {lo}")
            } else if lo <= dlo {
                format!("{path} <= {hi}")
            } else if hi >= dhi {
                format!("{path} > {}", lo - 1)
            } else {
                format!("{} < {path} <= {hi}", lo - 1)
            }
        })
        .collect()
}

fn render_bounds(
    path: &str,
    lo: Option<(Value, bool)>,
    hi: Option<(Value, bool)>,
    dom: Option<Domain>,
) -> String {
    let s = |v: Value| v.display(dom).to_string();
    match (lo, hi) {
        (Some((a, true)), Some((b, true))) if a == b => format!("{path} == {}", s(a)),
        (None, None) => format!("{path} != null"),
        (Some((a, incl)), None) => format!("{path} {} {}", if incl { ">=" } else { ">" }, s(a)),
        (None, Some((b, incl))) => format!("{path} {} {}", if incl { "<=" } else { "<" }, s(b)),
        (Some((a, li)), Some((b, hi))) => format!(
            "{} {} {path} {} {}",
            s(a),
            if li { "<=" } else { "<" },
            if hi { "<=" } else { "<" },
            s(b)
        ),
    }
}
