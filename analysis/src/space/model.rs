//! The data of a space: its variables ([`Var`]), their classes ([`Class`], [`ClassDesc`]),
//! the [`Space`] itself, partial assignments ([`Assign`]) and slot masks. Every other module
//! of `space` builds on these; this file names none of them.

use attn_policy::facts::schema::{Schema, Ty};
use attn_policy::facts::{Domain, Value};

/// A set of fact slots (the schema has fewer than 128 facts).
pub type SlotMask = u128;

pub fn slot_bit(s: usize) -> SlotMask {
    if s < 128 { 1u128 << s } else { 0 }
}

pub fn mask_of(slots: &[u16]) -> SlotMask {
    slots.iter().fold(0, |m, &s| m | slot_bit(s as usize))
}

/// What a class of a variable is, for rendering constraints.
#[derive(Clone, Debug, PartialEq)]
pub enum ClassDesc {
    Null,
    /// A version fact present but unparseable ([`Value::BadVersion`]): the third state of a
    /// version whose probe reports raw text (`FieldDef::raw_text`).
    Unparseable,
    Present,
    Bool(bool),
    Enum(u16),
    /// Integers in `[lo, hi]` (inclusive), with residue `r` modulo `m` when `m > 1`.
    Int {
        iv: usize,
        lo: i64,
        hi: i64,
        r: i64,
    },
    /// An ordered class of floats or versions: index into the var's ordered classes.
    Ordered {
        lo: Option<(Value, bool)>,
        hi: Option<(Value, bool)>,
    },
}

#[derive(Clone, Debug)]
pub struct Class {
    pub value: Value,
    pub desc: ClassDesc,
}

#[derive(Clone, Debug)]
pub struct Var {
    pub slot: usize,
    pub path: &'static str,
    /// The object var this member belongs to (present/null).
    pub parent: Option<usize>,
    pub classes: Vec<Class>,
    /// Modulus of integer residue classes (1: none).
    pub modulus: i64,
    pub bounds: (i64, i64),
    pub fixed: bool,
    pub ty: Ty,
}

impl Var {
    pub fn domain(&self) -> Option<Domain> {
        match self.ty {
            Ty::Enum(d) => Some(d),
            _ => None,
        }
    }
}

/// The variables of one analysis and how assignments become fact values.
#[derive(Clone, Debug)]
pub struct Space {
    pub vars: Vec<Var>,
    /// Per var: how many conditions read it (search order).
    pub reads: Vec<u32>,
    /// For each slot, the vars that determine it (in assignment order: parents first).
    pub deps: Vec<Vec<usize>>,
    pub(super) base: Vec<Value>,
    /// The pack family whose facts the vars are (te derivations apply to `te` only).
    pub schema: &'static Schema,
    pub(super) sm_var: Option<usize>,
    pub(super) window: Option<WindowVars>,
    /// Facts whose classes are not exact (non-linear arithmetic, residues beyond the lcm
    /// limit): conditions reading them may differ inside a class, so "no class satisfies"
    /// is not a proof there.
    pub inexact: Vec<&'static str>,
    /// Slots compared with another fact (`head_dim_v == head_dim_qk`).
    pub relational: Vec<usize>,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct WindowVars {
    pub(super) size: usize,
    pub(super) left: usize,
    pub(super) right: usize,
    pub(super) mask: Option<usize>,
}

/// A partial assignment: a class per var, `None` = not (yet) fixed.
pub type Assign = Vec<Option<u32>>;
