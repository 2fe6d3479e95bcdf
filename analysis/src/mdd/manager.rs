//! The manager's struct, [`Mdd`], and the constants and [`Cube`] its methods share. Its
//! fields hold the data types of `store`, `memos`, `rel` and `bits`; its methods are in the
//! other modules, grouped by concern (see the module root).

use crate::space::Space;
use attn_policy::eval::program::{NodeId, Program};
use attn_policy::facts::Value;

use super::bits::Bits;
use super::memos::{PairMemos, WidenMemos};
use super::rel::Rel;
use super::store::{HashMap, HashSet, Id, NodeMemo, OpMemo, Store};

/// Levels per fact: a fact at level `k * SPREAD`, its relation variables just below.
pub(super) const SPREAD: u32 = 64;

/// A predicate's tie is decided per class of its facts when they have at most this many
/// combinations of classes (else per block of the atom's own abstraction).
pub(super) const TIE_CELL_LIMIT: usize = 20_000;

/// Per variable, a set of classes (`None`: any class). A cube of the space.
pub type Cube = Vec<Option<Bits>>;

/// The diagram manager of one space. Its state is grouped by the module that maintains it.
pub struct Mdd<'s> {
    pub space: &'s Space,
    // --- order (`order`, extended by `relations::add_rel`)
    /// Level -> var (`usize::MAX`: an unused level).
    pub(super) order: Vec<usize>,
    /// The levels in use, ascending.
    pub(super) used: Vec<u32>,
    /// Var -> level.
    pub(super) level: Vec<u32>,
    /// Per level: every class of its var.
    pub(super) full: Vec<Bits>,
    /// Per diagram var: its number of classes.
    pub(super) ncls: Vec<usize>,
    /// Per space var, per class: its concrete members' count (`UNCOUNTABLE`: an interval
    /// of floats or versions), made on first use by [`Mdd::cell_members`].
    pub(super) member_counts: std::cell::OnceCell<Vec<Box<[u128]>>>,
    // --- node store and memos (`tables`)
    /// Nodes, their edges, the hash-consing tables.
    pub(super) store: Store,
    /// The edge stack: nodes under construction (children, their sets' words).
    pub(super) ek: Vec<Id>,
    pub(super) ew: Vec<u64>,
    /// `apply`'s pairs of children still to combine (child of a, child of b, the classes they
    /// share: the word of a one-word var, else the edges' indexes `i << 32 | j`), a stack
    /// as the edges: a call pushes its pairs, announces their memo slots, then combines them.
    pub(super) pend: Vec<(Id, Id, u64)>,
    pub(super) and_memo: OpMemo,
    pub(super) or_memo: OpMemo,
    pub(super) not_memo: OpMemo,
    pub(super) diff_memo: OpMemo,
    /// Literal combinations [`Mdd::satisfiable`] found unsatisfiable (valid for the
    /// manager's life).
    pub(super) sat_dead: HashSet<Vec<u32>>,
    /// A reusable memo for `holds_on` / `meets` (they are called per rule per region).
    pub(super) scratch: std::cell::Cell<NodeMemo<bool>>,
    /// Reusable memos of `holds_unless` / `allowed_unless`.
    pub(super) pair_memos: std::cell::Cell<PairMemos>,
    /// The memos of `expand` and `widen_inside` (they run per var of every listed cube),
    /// kept for the manager's life: their answers are keyed by the cube suffix they read.
    pub(super) widen_memos: std::cell::Cell<WidenMemos>,
    /// The most nodes the manager may create.
    pub budget: usize,
    /// The budget ran out: every result is meaningless (report INCOMPLETE).
    pub exhausted: bool,
    // --- compiled conditions (`compile`, `atoms`)
    /// Compiled conditions per (program, node).
    pub(super) compiled: HashMap<(usize, NodeId), Id>,
    /// Atoms by structural fingerprint (the same atom in two programs, or rebuilt by a split).
    pub(super) atoms: HashMap<String, Id>,
    pub(super) progs: Vec<Program>,
    /// Atom evaluations at class representatives.
    pub evaluations: u64,
    /// Atom evaluations that stayed unknown with every fact they read assigned (read as
    /// false; a result built from them is not exact).
    pub unknown: u64,
    /// Operation steps: `and` / `or` / `minus` / `not` calls not answered by a terminal case
    /// or a memo (each visits a pair of nodes). With `size`, the deterministic measure of
    /// the diagram work that `analysis/tests/analysis_counts.rs` guards: a memo that stops hitting
    /// shows here, not in the node count.
    pub steps: u64,
    /// Scratch fact values for evaluations (reused: evaluations run millions of times).
    pub(super) vals: Vec<Value>,
    // --- relation variables (`relations`)
    /// Relation variables (diagram var `space.vars.len() + k` is `rels[k]`).
    pub rels: Vec<Rel>,
    pub(super) rel_index: HashMap<String, usize>,
    /// Per relation variable, where its value agrees with the facts: the orderings a pair of
    /// intervals allows; a predicate's value on the cells that decide it. Results are
    /// intersected with the ties of the variables they read before they are listed.
    pub(super) ties: Vec<Option<Id>>,
}
