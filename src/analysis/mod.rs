//! Rule-set analysis (issue 4): exact, exhaustive questions about a pack over the whole
//! configuration space. See docs/analysis.md for what each analysis proves and its limits.
//!
//! - [`space`] - the finite abstraction (equivalence classes per fact);
//! - [`cell`] - whether a condition is constant on a cell of classes (intervals, congruences);
//! - [`mdd`] - decision diagrams over the classes (`gaps`, `diff`, `check`'s searches);
//! - [`search`] - three-valued search for a witness (`check`'s obsolete-workaround lint);
//! - [`regions`] - `gaps` and `diff`;
//! - [`lint`] - `check`;
//! - [`matrix`] - the cells of `matrix` (reachable outcomes, deciding facts);
//! - [`why_not`] - counterfactual hints;
//! - [`coverage`] - rule coverage over a corpus.
//!
//! Dependencies go one way: analysis uses policy, eval and facts, never the reverse.

pub mod cell;
pub mod coverage;
pub mod lint;
pub mod matrix;
pub mod mdd;
pub mod regions;
pub mod search;
pub mod space;
pub mod why_not;

pub use regions::{DiffReport, GapReport, Restriction, diff, gaps};
