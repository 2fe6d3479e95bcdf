//! Rule-set analysis (issue 4): exact, exhaustive questions about a pack over the whole
//! configuration space. See docs/analysis.md for what each analysis proves and its limits.
//!
//! - [`space`] - the finite abstraction (equivalence classes per fact);
//! - [`mdd`] - decision diagrams over the classes (`gaps`, `check`'s searches);
//! - [`search`], [`engine`] - three-valued evaluation and branch-and-bound search (`diff`);
//! - [`regions`] - `gaps` and `diff`;
//! - [`lint`] - `check`;
//! - [`why_not`] - counterfactual hints;
//! - [`coverage`] - rule coverage over a corpus.
//!
//! Dependencies go one way: analysis uses policy, eval and facts, never the reverse.

pub mod cell;
pub mod coverage;
pub mod engine;
pub mod lint;
pub mod mdd;
pub mod regions;
pub mod search;
pub mod space;
pub mod why_not;

pub use regions::{DiffReport, GapReport, Restriction, diff, gaps};
