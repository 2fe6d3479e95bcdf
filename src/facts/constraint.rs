//! Structural validity of an input, as data of its family's [`Schema`]: a [`Bound`] per fact
//! (a size is positive, a dropout a probability, a window bound at least -1) and
//! [`Constraint`]s across facts (TE's KV heads divide its query heads). Both are checked by
//! [`Facts::read`] once a config is read and before any rule can see it, for every entry point
//! (files, flags, presets, corpus records, the bindings), so an input that cannot exist is an
//! [`InputError`] with a location instead of a decision.
//!
//! A family declares only what its selector never sees: inputs its framework refuses before
//! the selector runs (TE's `DotProductAttention` asserts on KV heads in its constructor). Inputs
//! the selector judges itself stay inputs, and the family says so with
//! [`Check::DecidedBySelector`] (PyTorch's SDPA checks head counts itself and answers with
//! a backend or an error): such a constraint is documented, and the pack's rules decline
//! those inputs with a reason.

use super::input::{Facts, InputError, InputErrorKind};
use super::schema::Schema;
use super::value::Value;

/// The domain of one numeric fact beyond its type. `None` accepts every value of the type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bound {
    None,
    /// `> 0`: a size, a count, a scale (for integers: `>= 1`).
    Positive,
    /// `>= 0`: a count where 0 means "absent" (documented per fact), a soft-cap.
    NonNegative,
    /// An integer `>= n` (`AtLeast(-1)`: -1 means unbounded).
    AtLeast(i64),
    /// A float in `[0, 1]` (a dropout probability).
    Probability,
}

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

/// How a [`Constraint`] is enforced.
#[derive(Clone, Copy)]
pub enum Check {
    /// Refused before any rule runs: `Some(message)` when the facts break the constraint.
    Refuse(fn(&Facts) -> Option<String>),
    /// Structurally odd, but the family's selector decides such inputs itself (with a backend
    /// or an error of its own); they reach the rules, which must decline them with a reason.
    DecidedBySelector,
}

/// A constraint across facts, declared by a family (docs/facts.md lists each family's).
#[derive(Clone, Copy)]
pub struct Constraint {
    /// Stable name (`kv_heads_divide_heads`).
    pub name: &'static str,
    /// What it requires and whose rule it is, for docs.
    pub doc: &'static str,
    /// The facts it reads. An error points at the first of them the input gave (or the first).
    pub facts: &'static [&'static str],
    pub check: Check,
    /// The same constraint in the rule language (true for a valid input); a test checks that
    /// it agrees with `check`. `gaps` and `diff` search only where it holds when `searched`.
    pub expr: &'static str,
    /// Whether `gaps` and `diff` tie it (false where the decision diagrams would grow too
    /// large; a listed region may then hold inputs that break it, but its example does not).
    pub searched: bool,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Constraint({})", self.name)
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
