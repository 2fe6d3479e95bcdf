//! Multi-valued decision diagrams (MDDs) over the classes of a [`Space`].
//!
//! A condition of a pack is a boolean function of the classes of the space's variables. This
//! module represents such functions canonically, as reduced, ordered MDDs with one child per
//! class: a node tests one variable; equal functions are the same node. The whole pack becomes a
//! handful of diagrams (per backend "eligible", the selection, the gaps), built by `and` / `or` /
//! `not` over the diagrams of its conditions, and every analysis question is a question about a
//! diagram: "no input" is the false node, "every input" the true node, "A implies B" is
//! `A and not B == false`.
//!
//! Conditions are compiled structurally: `and` / `or` / `not` / `if` become diagram operations;
//! every other boolean node (a comparison, `in`, a null test, a boolean fact) is an *atom*,
//! evaluated once per block of classes it tells apart (its own abstraction), with the other
//! facts unassigned. Those evaluations are the "classes examined"; the diagram then covers the
//! full cross product of classes without enumerating it.
//!
//! A hand-written diagram: the BDD crates (biodivine-lib-bdd, oxidd) are boolean, and encoding
//! a variable of up to ~120 classes in bits would make the regions (sets of classes per fact)
//! hard to read back. This one is small: hash-consed nodes, memoised `and` / `or` / `not`.
//!
//! # Modules (one [`Mdd`] manager, its methods grouped by concern)
//!
//! - `manager`: the [`Mdd`] struct itself (its state, grouped by the module that maintains
//!   it), [`Cube`] and the constants the modules share; it names only the data modules below;
//! - `store`: [`Id`], [`FALSE`], [`TRUE`], the hash maps, the node store (headers, edge arena,
//!   hash-consing tables), the operation memos and the per-traversal node memo: data, no
//!   `Mdd` method;
//! - `memos`: the reusable memos of `cover`'s traversals;
//! - `rel`: [`Rel`], what a relation variable stands for;
//! - `bits`: [`Bits`], a set of classes of one variable (an edge label);
//!
//! No module names an item of this file (which only declares and re-exports), and the data
//! modules (`store`, `memos`, `rel`, `bits`) name no `Mdd`, so the files import one way.
//! The methods of [`Mdd`], by concern:
//!
//! - `tables`: node creation over the store (`mk`, hash-consing) and the boolean operations
//!   (`and`, `or`, `not`, ...);
//! - `order`: the variable order (facts by a walk of the rules, relation variables below);
//! - `compile`: conditions of a program -> diagrams (structure, `if` splitting, atom memo);
//! - `atoms`: one atom -> a diagram, by evaluation per block of classes; whether an atom is
//!   constant on a cell of classes;
//! - `decide`: that question without the manager (shared data only), so a large atom's
//!   cells are decided on two threads;
//! - `relations`: relation variables (orderings of two facts, predicates the classes do not
//!   decide) and their *ties* to the facts;
//! - `contrary`: combinations of relation variables and classes that no input has, found
//!   along one path of the cover;
//! - `cover`: cube queries (`holds_on`, `meets`) and a diagram as a (disjoint) cover by
//!   cubes, the regions `gaps` and `diff` list;
//! - `widen`: `expand` (a cover's cube widened inside what it covers) and `widen_inside`
//!   (the EXPAND step of listed regions), with walk memos keyed by the cube suffix they
//!   read (kept across calls);
//! - `witness`: a concrete input inside a region (bounded search);
//! - `queries`: [`PolicyDiagrams`], a pack's rules, applicability and preference as diagrams,
//!   and the policy questions (`gaps`, `diff`, `check`'s lints) asked of them;
//! - `restrict`: cofactors (vars fixed to one class), supports, relation variables at fixed
//!   facts (the cells of `matrix`).
//!
//! # Invariants of the manager
//!
//! - **Node ids.** An [`Id`] indexes the node table; [`FALSE`] (0) and [`TRUE`] (1) are the
//!   terminals. Nodes are never freed or changed, so an id means one function for the
//!   manager's whole life and every memo keyed by ids stays valid.
//! - **Canonical form.** Every inner node tests a variable at a level above (smaller than) the
//!   levels of all its children; its edges partition the variable's classes (non-empty,
//!   disjoint, covering every class), one edge per distinct child, sorted by child id; it has at
//!   least two edges; one of the hash-consing tables holds it, once. Hence two ids are equal iff their
//!   functions are equal (for this manager's order). Only `Mdd::mk_top` (in `tables`) creates
//!   nodes, and it keeps all of this.
//! - **Variables.** Diagram var `v < space.vars.len()` is fact var `v` of the [`Space`]; var
//!   `space.vars.len() + k` is relation variable `rels[k]`. Facts sit at levels `k * SPREAD`;
//!   a relation variable takes a free level just below the deepest fact it reads (or a new
//!   level at the bottom). A level is taken only while no node tests it, so adding a variable
//!   never breaks the order of nodes built before.
//! - **Members of absent objects** are not variables on paths where their object is null:
//!   diagrams built per block skip them there (they read null).
//! - **Budget.** When the node table reaches `budget`, `mk` answers [`FALSE`] and sets
//!   `exhausted`; from then on every result is meaningless and callers report INCOMPLETE.
//! - **Counters.** `evaluations` (the reports' "classes examined") and `unknown` count atom
//!   evaluations; they are part of the `gaps` / `diff` output, so the order and number of
//!   evaluations is behaviour, not an implementation detail.
//!
//! Not `Sync`: one manager per analysis, used from one thread (a large predicate's cells are
//! decided on a second thread from the space and the program alone, see `decide`).
//!
//! [`Space`]: crate::space::Space

mod atoms;
mod bits;
mod compile;
mod contrary;
mod cover;
mod decide;
mod manager;
mod memos;
mod order;
mod queries;
mod rel;
mod relations;
mod restrict;
mod store;
mod tables;
mod widen;
mod witness;

pub use bits::Bits;
pub use cover::cube_within;
pub use manager::{Cube, Mdd};
pub use queries::PolicyDiagrams;
pub use rel::Rel;
pub use restrict::Pins;
pub use store::{FALSE, Id, TRUE};
