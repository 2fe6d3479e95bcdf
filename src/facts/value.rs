//! Runtime values of facts and expressions. `Copy` and allocation-free, so a decision
//! evaluates without touching the heap.

use std::cmp::Ordering;
use std::fmt;

use super::domains::Domain;
use crate::lang::Version;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    /// An absent optional fact (`window_size: null`, a library that is not installed).
    Null,
    /// A probe fact no adapter has answered yet: three-valued logic applies.
    Unknown,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// Index into a [`Domain`]'s values.
    Enum(u16),
    Version(Version),
    /// A version string that could not be parsed: every comparison with it is false.
    BadVersion,
}

impl Value {
    pub fn as_f64(self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(i as f64),
            Value::Float(f) => Some(f),
            _ => None,
        }
    }

    /// Total order used by comparisons; `None` when the operands do not compare (null, unknown,
    /// an unparseable version, or different kinds).
    pub fn compare(self, other: Value) -> Option<Ordering> {
        match (self, other) {
            (Value::Int(a), Value::Int(b)) => Some(a.cmp(&b)),
            (Value::Bool(a), Value::Bool(b)) => Some(a.cmp(&b)),
            (Value::Enum(a), Value::Enum(b)) => Some(a.cmp(&b)),
            (Value::Version(a), Value::Version(b)) => Some(a.cmp(&b)),
            (a, b) => match (a.as_f64(), b.as_f64()) {
                (Some(x), Some(y)) => x.partial_cmp(&y),
                _ => None,
            },
        }
    }

    /// Renders the value for explanations; enums need their domain.
    pub fn display(self, domain: Option<Domain>) -> ValueDisplay {
        ValueDisplay(self, domain)
    }

    /// The value as JSON (enums by name, versions as strings).
    pub fn to_json(self, domain: Option<Domain>) -> serde_json::Value {
        match self {
            Value::Null | Value::Unknown | Value::BadVersion => match self {
                Value::Unknown => serde_json::Value::String("unknown".into()),
                Value::BadVersion => serde_json::Value::String("unparseable".into()),
                _ => serde_json::Value::Null,
            },
            Value::Bool(b) => b.into(),
            Value::Int(i) => i.into(),
            Value::Float(f) => serde_json::Number::from_f64(f)
                .map(serde_json::Value::Number)
                .unwrap_or(serde_json::Value::Null),
            Value::Enum(i) => match domain {
                Some(d) => d.values()[i as usize].into(),
                None => i.into(),
            },
            Value::Version(v) => v.to_string().into(),
        }
    }
}

pub struct ValueDisplay(Value, Option<Domain>);

impl fmt::Display for ValueDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Value::Null => f.write_str("null"),
            Value::Unknown => f.write_str("unknown"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Float(x) => write!(f, "{x:?}"),
            Value::Enum(i) => match self.1 {
                Some(d) => write!(f, "{:?}", d.values()[i as usize]),
                None => write!(f, "#{i}"),
            },
            Value::Version(v) => write!(f, "{v}"),
            Value::BadVersion => f.write_str("<unparseable version>"),
        }
    }
}
