//! Structural validity of an input, as data of its family's [`Schema`]: a [`Bound`] per fact
//! (a size is positive, a dropout a probability, a window bound at least -1) and
//! [`Constraint`]s across facts (TE's KV heads divide its query heads). Both are checked by
//! `Facts::read` once a config is read and before any rule can see it, for every entry point
//! (files, flags, presets, corpus records, the bindings), so an input that cannot exist is an
//! [`InputError`] with a location instead of a decision.
//!
//! The types are declared in `schema.rs`, next to the [`Schema`] that holds them (a check
//! reads [`Facts`], which belong to a schema); this file says what they admit and checks them.
//!
//! A family declares only what its selector never sees: inputs its framework refuses before
//! the selector runs (TE's `DotProductAttention` asserts on KV heads in its constructor). Inputs
//! the selector judges itself stay inputs, and the family says so with
//! [`Check::DecidedBySelector`] (PyTorch's SDPA checks head counts itself and answers with
//! a backend or an error): such a constraint is documented, and the pack's rules decline
//! those inputs with a reason.

use super::error::{InputError, InputErrorKind};
use super::schema::{Facts, Schema};
use super::value::Value;

// The old paths (`facts::constraint::Bound`) still name the types.
pub use super::schema::{Bound, Check, Constraint};

impl Bound {
    /// Whether `v` lies in the bound (null and non-numeric values are not the bound's concern).
    pub fn admits(self, v: Value) -> bool {
        let x = match v {
            Value::Int(i) => i as f64,
            Value::Float(f) => f,
            _ => return true,
        };
        match self {
            Bound::None => true,
            Bound::Positive => x > 0.0,
            Bound::NonNegative => x >= 0.0,
            Bound::AtLeast(n) => x >= n as f64,
            Bound::Probability => (0.0..=1.0).contains(&x),
        }
    }

    /// The bound as docs and messages write it (`> 0`, `in [0, 1]`); empty for `None`.
    pub fn text(self) -> String {
        match self {
            Bound::None => String::new(),
            Bound::Positive => "> 0".into(),
            Bound::NonNegative => ">= 0".into(),
            Bound::AtLeast(n) => format!(">= {n}"),
            Bound::Probability => "in [0, 1]".into(),
        }
    }
}

impl Bound {
    /// The bound as a condition of the rule language over the fact `path` (true inside it),
    /// `None` for `Bound::None`. `nullable`: null (an absent object's member) is inside.
    pub fn expr(self, path: &str, nullable: bool) -> Option<String> {
        let cond = match self {
            Bound::None => return None,
            Bound::Positive => format!("{path} > 0"),
            Bound::NonNegative => format!("{path} >= 0"),
            Bound::AtLeast(n) => format!("{path} >= {n}"),
            Bound::Probability => format!("0 <= {path} <= 1"),
        };
        Some(if nullable {
            format!("({path} == null or {cond})")
        } else {
            cond
        })
    }
}

/// Checks every fact's bound, then every refusing constraint, in schema order. `given`: the
/// top-level keys the config gave (an error points at a fact the input named if it can).
pub(crate) fn validate(
    schema: &Schema,
    facts: &Facts,
    given: &dyn Fn(&str) -> bool,
) -> Result<(), InputError> {
    for (slot, d) in schema.fields.iter().enumerate() {
        let v = facts.values[slot];
        if !d.bound.admits(v) {
            return Err(InputError::new(
                d.path,
                format!("must be {}, found {}", d.bound.text(), v.display(None)),
            )
            .kind(InputErrorKind::Domain));
        }
    }
    for c in schema.constraints {
        let Check::Refuse(check) = c.check else {
            continue;
        };
        if let Some(message) = check(facts) {
            let top = |p: &str| p.split(['.', '[']).next().unwrap_or(p).to_string();
            let at = c
                .facts
                .iter()
                .find(|p| given(&top(p)))
                .or(c.facts.first())
                .copied()
                .unwrap_or("<config>");
            return Err(InputError::new(at, message).kind(InputErrorKind::Constraint));
        }
    }
    Ok(())
}
