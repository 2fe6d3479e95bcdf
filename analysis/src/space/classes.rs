//! The classes of one integer, float or version fact, from the constants it is compared with.
//!
//! Invariants: the classes partition the fact's domain and come in ascending order; each
//! representative lies inside its class. Integers: intervals cut at the class starts (a
//! constant `c` starts classes at `c` and `c + 1`), each split by residue modulo `m`
//! (only non-empty residue classes are kept); the representative is the smallest member
//! (the largest for the class unbounded below). Floats and versions: each constant is a
//! class, the open intervals between (and beyond) them are classes too; a version interval
//! for which no version strictly inside is found is left out.

use std::collections::BTreeSet;

use attn_policy::facts::Value;
use attn_policy::lang::Version;
use attn_policy::lang::version::PreKind;

use super::model::{Class, ClassDesc};

pub(super) fn int_classes(bounds: (i64, i64), starts: &BTreeSet<i64>, m: i64) -> Vec<Class> {
    let (dlo, dhi) = bounds;
    let mut cuts: Vec<i64> = starts
        .iter()
        .copied()
        .filter(|&s| s > dlo && s <= dhi)
        .collect();
    cuts.insert(0, dlo);
    let mut ivs: Vec<(i64, i64)> = Vec::new();
    for (i, &lo) in cuts.iter().enumerate() {
        let hi = cuts.get(i + 1).map_or(dhi, |n| n - 1);
        ivs.push((lo, hi));
    }
    let mut out = Vec::new();
    for (iv, &(lo, hi)) in ivs.iter().enumerate() {
        for r in 0..m {
            // Representative: the smallest member, or the largest for the unbounded-below class.
            let rep = if lo == dlo && dlo < -(1 << 39) {
                let x = hi - (hi - r).rem_euclid(m);
                (x >= lo).then_some(x)
            } else {
                let x = lo + (r - lo).rem_euclid(m);
                (x <= hi).then_some(x)
            };
            if let Some(x) = rep {
                out.push(Class {
                    value: Value::Int(x),
                    desc: ClassDesc::Int { iv, lo, hi, r },
                });
            }
        }
    }
    out
}

fn ordered(lo: Option<(Value, bool)>, hi: Option<(Value, bool)>, value: Value) -> Class {
    Class {
        value,
        desc: ClassDesc::Ordered { lo, hi },
    }
}

pub(super) fn float_classes(lower: Option<f64>, consts: &[Value]) -> Vec<Class> {
    let mut pts: Vec<f64> = consts
        .iter()
        .filter_map(|v| v.as_f64())
        .filter(|x| x.is_finite() && lower.is_none_or(|l| *x >= l))
        .collect();
    if let Some(l) = lower {
        pts.push(l);
    }
    pts.sort_by(f64::total_cmp);
    pts.dedup();
    let f = Value::Float;
    let mut out = Vec::new();
    if pts.is_empty() {
        out.push(ordered(None, None, f(0.0)));
        return out;
    }
    if lower.is_none() {
        out.push(ordered(None, Some((f(pts[0]), false)), f(pts[0] - 1.0)));
    }
    for (i, &p) in pts.iter().enumerate() {
        out.push(ordered(Some((f(p), true)), Some((f(p), true)), f(p)));
        match pts.get(i + 1) {
            Some(&n) => out.push(ordered(
                Some((f(p), false)),
                Some((f(n), false)),
                f((p + n) / 2.0),
            )),
            None => out.push(ordered(Some((f(p), false)), None, f(p + 1.0))),
        }
    }
    out
}

fn version_between(a: Option<Version>, b: Option<Version>) -> Option<Version> {
    let mut cands: Vec<Version> = Vec::new();
    match (a, b) {
        (None, Some(b)) => {
            let [x, y, z] = b.parts;
            if b.pre.is_some() {
                cands.push(Version {
                    parts: b.parts,
                    pre: Some((PreKind::Dev, 0)),
                });
            }
            if z > 0 {
                cands.push(Version::new(x, y, z - 1));
            }
            if y > 0 {
                cands.push(Version::new(x, y - 1, 0));
            }
            if x > 0 {
                cands.push(Version::new(x - 1, 0, 0));
            }
            cands.push(Version {
                parts: b.parts,
                pre: Some((PreKind::Dev, 0)),
            });
        }
        (Some(a), hi) => {
            let [x, y, z] = a.parts;
            if a.pre.is_some() {
                cands.push(Version::new(x, y, z));
                if let Some((k, n)) = a.pre {
                    cands.push(Version {
                        parts: a.parts,
                        pre: Some((k, n + 1)),
                    });
                }
            }
            cands.push(Version::new(x, y, z + 1));
            cands.push(Version::new(x, y + 1, 0));
            cands.push(Version::new(x + 1, 0, 0));
            if let Some(b) = hi {
                cands.push(Version {
                    parts: b.parts,
                    pre: Some((PreKind::Dev, 0)),
                });
                if let Some((k, n)) = b.pre
                    && n > 0
                {
                    cands.push(Version {
                        parts: b.parts,
                        pre: Some((k, n - 1)),
                    });
                }
            }
            cands.retain(|v| hi.is_none_or(|b| *v < b));
        }
        (None, None) => cands.push(Version::new(1, 0, 0)),
    }
    cands
        .into_iter()
        .find(|v| a.is_none_or(|a| *v > a) && b.is_none_or(|b| *v < b))
}

pub(super) fn version_classes(consts: &[Value]) -> Vec<Class> {
    let mut pts: Vec<Version> = consts
        .iter()
        .filter_map(|v| match v {
            Value::Version(v) => Some(*v),
            _ => None,
        })
        .collect();
    pts.sort();
    pts.dedup();
    let v = Value::Version;
    let mut out = Vec::new();
    let mut prev: Option<Version> = None;
    for &p in &pts {
        if let Some(x) = version_between(prev, Some(p)) {
            out.push(ordered(
                prev.map(|a| (v(a), false)),
                Some((v(p), false)),
                v(x),
            ));
        }
        out.push(ordered(Some((v(p), true)), Some((v(p), true)), v(p)));
        prev = Some(p);
    }
    if let Some(x) = version_between(prev, None) {
        out.push(ordered(prev.map(|a| (v(a), false)), None, v(x)));
    }
    out
}
