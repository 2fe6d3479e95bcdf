//! The finite abstraction of the configuration space that every analysis searches.
//!
//! Each fact a condition reads becomes a [`Var`] whose values are split into equivalence
//! classes: integers at the constants they are compared with (`c` gets a class of its own),
//! refined by residues modulo the lcm of the `%` moduli applied to them; floats and versions at
//! their constants (with the open intervals in between, pre-releases included); every enum
//! value; both booleans; null for nullable facts. Within one class every condition of the
//! programs the space was built from has the same value, so one representative per class
//! decides for the whole class. Derived facts are not variables: `sm` is (and sets the compute
//! capability), `window.left/right` come from `window_size` and the mask as in
//! [`Facts::from_json`], object members exist only when their object is present.
//!
//! # Modules
//!
//! - `collect`: what the conditions say about each fact (constants, moduli, facts compared
//!   with each other, non-linear arithmetic);
//! - `build`: [`SpaceBuilder`], from those to the vars (derived facts folded into their inputs);
//! - `classes`: the classes of one integer, float or version fact;
//! - `values`: assignments -> fact values ([`Space::materialize`]), class lookups;
//! - `example`: an assignment as a config object (the examples `gaps` and `diff` print);
//! - `render`: a set of classes as a condition of the pack language (the regions' text).
//!
//! # Invariants of a [`Space`]
//!
//! - **Vars.** One per fact read (after derived facts are folded into their inputs), objects
//!   before their members: a member's `parent` is a smaller index. `parent` is set only for
//!   members of nullable objects; such a member has a value only while its object is present.
//! - **Classes** of a var partition its domain (integers within `Var::bounds`), each with a
//!   representative `value` inside it. A nullable var's class 0 is null; an object var has the
//!   classes null and present. Integer classes ([`ClassDesc::Int`]) come in interval order
//!   (`iv`), each interval split into its non-empty residue classes modulo `Var::modulus`
//!   (at most 64); ordered classes of floats and versions alternate points and the open
//!   intervals between them, ascending.
//! - **Exactness.** Within one class every condition the space was built from is constant,
//!   except conditions reading facts in `inexact` (non-linear arithmetic, moduli beyond the
//!   limit) or comparing two facts (`relational`): the decision diagrams decide those with
//!   relation variables instead of representatives.
//! - **Dependencies.** `deps[slot]` lists the vars that determine a fact slot (parents first);
//!   a slot without vars keeps its default (`base`; probes answer "supported").
//! - An [`Assign`] has one entry per var: `Some(class)` or unassigned (`None`, read as
//!   unknown). Members of an absent object read null whatever their entry.

mod build;
mod classes;
mod collect;
mod example;
mod render;
mod values;

use crate::facts::schema::{Schema, Ty};
use crate::facts::{Domain, Value};

pub use build::SpaceBuilder;
pub(crate) use collect::slots_under;
pub(crate) use example::insert_path;

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
    base: Vec<Value>,
    /// The pack family whose facts the vars are (te derivations apply to `te` only).
    pub schema: &'static Schema,
    sm_var: Option<usize>,
    window: Option<WindowVars>,
    /// Facts whose classes are not exact (non-linear arithmetic, residues beyond the lcm
    /// limit): conditions reading them may differ inside a class, so "no class satisfies"
    /// is not a proof there.
    pub inexact: Vec<&'static str>,
    /// Slots compared with another fact (`head_dim_v == head_dim_qk`).
    pub relational: Vec<usize>,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct WindowVars {
    size: usize,
    left: usize,
    right: usize,
    mask: Option<usize>,
}

/// A partial assignment: a class per var, `None` = not (yet) fixed.
pub type Assign = Vec<Option<u32>>;
