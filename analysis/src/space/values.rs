//! Assignments -> fact values, and lookups between values, classes and members.
//!
//! Invariant: [`Space::materialize`] gives every fact slot a value: assigned vars their class's
//! representative (or a given member), unassigned ones `Unknown`, members of an absent object
//! null, facts no var determines their defaults (probes "supported"), and derived facts
//! (compute capability, `window.left/right`) computed from their inputs as
//! [`attn_policy::facts::Facts::from_json`] does.

use attn_policy::facts::{Domain, Value};

use super::model::{ClassDesc, Space};

impl Space {
    /// Slot of a fact of the space's family that the family's own handling relies on.
    pub(super) fn slot(&self, path: &str) -> usize {
        self.schema.slot(path).expect("fact of the space's family")
    }

    /// Fact values for a partial assignment: unassigned facts are `Unknown` (Kleene logic
    /// decides what it can), probes are answered "supported" (true).
    pub fn materialize(&self, a: &[Option<u32>], out: &mut Vec<Value>) {
        self.materialize_with(a, &[], out)
    }

    /// [`Space::materialize`] with some integer vars at given members of their classes
    /// (`(var, value)`), not at the classes' representatives.
    pub fn materialize_with(
        &self,
        a: &[Option<u32>],
        values: &[(usize, Value)],
        out: &mut Vec<Value>,
    ) {
        out.clear();
        out.extend_from_slice(&self.base);
        for (i, v) in self.vars.iter().enumerate() {
            out[v.slot] = self.value_of(a, i);
        }
        for &(i, x) in values {
            if out[self.vars[i].slot] != Value::Null {
                out[self.vars[i].slot] = x;
            }
        }
        if let Some(sv) = self.sm_var {
            let (ma, mi) = match out[self.vars[sv].slot] {
                Value::Int(sm) => (Value::Int(sm / 10), Value::Int(sm % 10)),
                other => (other, other),
            };
            out[self.slot("device_compute_capability.major")] = ma;
            out[self.slot("device_compute_capability.minor")] = mi;
        }
        if let Some(w) = self.window {
            let (l, r) = match out[self.vars[w.size].slot] {
                Value::Null => {
                    let mask = match w.mask {
                        Some(m) => out[self.vars[m].slot],
                        None => self.base[self.slot("attn_mask_type")],
                    };
                    let right = match mask {
                        Value::Enum(i) => {
                            if Domain::AttnMaskType.values()[i as usize].contains("causal") {
                                Value::Int(0)
                            } else {
                                Value::Int(-1)
                            }
                        }
                        _ => Value::Unknown,
                    };
                    (Value::Int(-1), right)
                }
                Value::Unknown => (Value::Unknown, Value::Unknown),
                _ => (out[self.vars[w.left].slot], out[self.vars[w.right].slot]),
            };
            out[self.slot("window.left")] = l;
            out[self.slot("window.right")] = r;
        }
    }

    /// The value of a fact no var determines (its default; probes "supported").
    pub(crate) fn default_value(&self, slot: usize) -> Value {
        self.base[slot]
    }

    /// The value of var `i` under an assignment (null for members of an absent object,
    /// unknown when unassigned).
    pub(crate) fn value_of(&self, a: &[Option<u32>], i: usize) -> Value {
        let v = &self.vars[i];
        if let Some(p) = v.parent {
            match a[p] {
                None => return Value::Unknown,
                Some(c) if self.vars[p].classes[c as usize].value == Value::Null => {
                    return Value::Null;
                }
                _ => {}
            }
        }
        match a[i] {
            Some(c) => v.classes[c as usize].value,
            None => Value::Unknown,
        }
    }

    /// Whether var `i` can be branched on now (its object, if any, is present).
    pub fn available(&self, a: &[Option<u32>], i: usize) -> bool {
        if a[i].is_some() {
            return false;
        }
        match self.vars[i].parent {
            None => true,
            Some(p) => {
                matches!(a[p], Some(c) if self.vars[p].classes[c as usize].value != Value::Null)
            }
        }
    }

    /// The class of var `i` holding `value` (None: no class does).
    pub fn class_of(&self, i: usize, value: Value) -> Option<usize> {
        let v = &self.vars[i];
        v.classes.iter().position(|c| match (&c.desc, value) {
            (ClassDesc::Null, x) => x == Value::Null,
            (_, Value::Null) => false,
            (ClassDesc::Unparseable, x) => x == Value::BadVersion,
            (_, Value::BadVersion) => false,
            (ClassDesc::Present, _) => true,
            (ClassDesc::Bool(b), Value::Bool(x)) => *b == x,
            (ClassDesc::Enum(e), Value::Enum(x)) => *e == x,
            (ClassDesc::Int { lo, hi, r, .. }, Value::Int(x)) => {
                *lo <= x && x <= *hi && (v.modulus <= 1 || x.rem_euclid(v.modulus) == *r)
            }
            (ClassDesc::Ordered { lo, hi }, x) => {
                use std::cmp::Ordering::*;
                let above = lo.is_none_or(|(b, incl)| match x.compare(b) {
                    Some(Greater) => true,
                    Some(Equal) => incl,
                    _ => false,
                });
                let below = hi.is_none_or(|(b, incl)| match x.compare(b) {
                    Some(Less) => true,
                    Some(Equal) => incl,
                    _ => false,
                });
                above && below
            }
            _ => false,
        })
    }

    /// The members of class `c` of integer var `i`: (first, last, step); None for other
    /// classes.
    pub fn int_members(&self, i: usize, c: u32) -> Option<(i64, i64, i64)> {
        let v = &self.vars[i];
        match v.classes[c as usize].desc {
            ClassDesc::Int { lo, hi, r, .. } => {
                let m = v.modulus.max(1);
                let first = lo.saturating_add((r - lo).rem_euclid(m));
                let last = hi.saturating_sub((hi - r).rem_euclid(m));
                (first <= last).then_some((first, last, m))
            }
            _ => None,
        }
    }

    /// The var of a fact path, if the space has one.
    pub fn var_of(&self, path: &str) -> Option<usize> {
        self.vars.iter().position(|v| v.path == path)
    }

    /// The number of classes of the full cross product (for reporting), as a float.
    pub fn product(&self) -> f64 {
        self.vars.iter().map(|v| v.classes.len() as f64).product()
    }
}
