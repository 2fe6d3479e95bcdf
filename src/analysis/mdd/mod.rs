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
//! - `bits`: [`Bits`], a set of classes of one variable (an edge label);
//! - `tables`: the node store, the hash-consing (unique) table, the operation memos and the
//!   boolean operations (`and`, `or`, `not`, ...);
//! - `order`: the variable order (facts by a walk of the rules, relation variables below);
//! - `compile`: conditions of a program -> diagrams (structure, `if` splitting, atom memo);
//! - `atoms`: one atom -> a diagram, by evaluation per block of classes; whether an atom is
//!   constant on a cell of classes;
//! - `relations`: relation variables (orderings of two facts, predicates the classes do not
//!   decide) and their *ties* to the facts;
//! - `contrary`: combinations of relation variables and classes that no input has, found
//!   along one path of the cover;
//! - `cover`: cube queries (`holds_on`, `meets`) and a diagram as a (disjoint) cover by
//!   cubes, the regions `gaps` and `diff` list;
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
//!   least two edges; the unique table holds it once. Hence two ids are equal iff their
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
//! Not `Sync`: one manager per analysis, used from one thread.

mod atoms;
mod bits;
mod compile;
mod contrary;
mod cover;
mod order;
mod queries;
mod relations;
mod restrict;
mod tables;
mod witness;

use std::collections::HashMap as StdHashMap;

use crate::analysis::space::Space;
use crate::eval::program::{NodeId, Program};
use crate::facts::Value;

pub use bits::Bits;
pub use cover::cube_within;
use cover::{ExpandMemos, PairMemos};
pub use queries::PolicyDiagrams;
pub use relations::Rel;
pub use restrict::Pins;
use tables::{NodeMemo, Op, OpMemo, Store};

/// The node and operation tables are hashed millions of times: foldhash, not SipHash.
type HashMap<K, V> = StdHashMap<K, V, foldhash::fast::FixedState>;
type HashSet<K> = std::collections::HashSet<K, foldhash::fast::FixedState>;

/// A diagram node (an index into the manager's node table).
pub type Id = u32;

/// The constant false function.
pub const FALSE: Id = 0;

/// The constant true function.
pub const TRUE: Id = 1;

/// Levels per fact: a fact at level `k * SPREAD`, its relation variables just below.
const SPREAD: u32 = 64;

/// A predicate's tie is decided per class of its facts when they have at most this many
/// combinations of classes (else per block of the atom's own abstraction).
const TIE_CELL_LIMIT: usize = 20_000;

/// Per variable, a set of classes (`None`: any class). A cube of the space.
pub type Cube = Vec<Option<Bits>>;

/// The diagram manager of one space. Its state is grouped by the module that maintains it.
pub struct Mdd<'s> {
    pub space: &'s Space,
    // --- order (`order`, extended by `relations::add_rel`)
    /// Level -> var (`usize::MAX`: an unused level).
    order: Vec<usize>,
    /// The levels in use, ascending.
    used: Vec<u32>,
    /// Var -> level.
    level: Vec<u32>,
    /// Per level: every class of its var.
    full: Vec<Bits>,
    /// Per diagram var: its number of classes.
    ncls: Vec<usize>,
    // --- node store and memos (`tables`)
    /// Nodes, their edges, the hash-consing tables.
    store: Store,
    /// The edge stack: nodes under construction (children, their sets' words).
    ek: Vec<Id>,
    ew: Vec<u64>,
    and_memo: OpMemo,
    or_memo: OpMemo,
    not_memo: OpMemo,
    diff_memo: OpMemo,
    /// Literal combinations [`Mdd::satisfiable`] found unsatisfiable (valid for the
    /// manager's life).
    sat_dead: HashSet<Vec<u32>>,
    /// A reusable memo for `holds_on` / `meets` (they are called per rule per region).
    scratch: std::cell::Cell<NodeMemo<bool>>,
    /// Reusable memos of `expand` (it runs per listed cube: fresh tables of the diagram's
    /// size, zeroed each time, cost more than the traversals).
    expand_memos: std::cell::Cell<ExpandMemos>,
    /// Reusable memos of `widen_inside` (it runs per var of every listed cube).
    pair_memos: std::cell::Cell<PairMemos>,
    /// The most nodes the manager may create.
    pub budget: usize,
    /// The budget ran out: every result is meaningless (report INCOMPLETE).
    pub exhausted: bool,
    // --- compiled conditions (`compile`, `atoms`)
    /// Compiled conditions per (program, node).
    compiled: HashMap<(usize, NodeId), Id>,
    /// Atoms by structural fingerprint (the same atom in two programs, or rebuilt by a split).
    atoms: HashMap<String, Id>,
    progs: Vec<Program>,
    /// Atom evaluations at class representatives.
    pub evaluations: u64,
    /// Atom evaluations that stayed unknown with every fact they read assigned (read as
    /// false; a result built from them is not exact).
    pub unknown: u64,
    /// Operation steps: `and` / `or` / `minus` / `not` calls not answered by a terminal case
    /// or a memo (each visits a pair of nodes). With `size`, the deterministic measure of
    /// the diagram work that `tests/analysis_counts.rs` guards: a memo that stops hitting
    /// shows here, not in the node count.
    pub steps: u64,
    /// Scratch fact values for evaluations (reused: evaluations run millions of times).
    vals: Vec<Value>,
    // --- relation variables (`relations`)
    /// Relation variables (diagram var `space.vars.len() + k` is `rels[k]`).
    pub rels: Vec<Rel>,
    rel_index: HashMap<String, usize>,
    /// Per relation variable, where its value agrees with the facts: the orderings a pair of
    /// intervals allows; a predicate's value on the cells that decide it. Results are
    /// intersected with the ties of the variables they read before they are listed.
    ties: Vec<Option<Id>>,
}
