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
//! - `model`: the data of a space ([`Space`], [`Var`], [`Class`], [`ClassDesc`], [`Assign`],
//!   slot masks), which every other module builds on;
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
mod model;
mod render;
mod values;

pub use build::SpaceBuilder;
pub(crate) use collect::slots_under;
pub(crate) use example::insert_path;
pub use model::{Assign, Class, ClassDesc, SlotMask, Space, Var, mask_of, slot_bit};
