//! attn-policy-analysis: rule-set analysis (issue 4), exact, exhaustive questions about a
//! pack of the `attn-policy` core over the whole configuration space, and the support matrix
//! built on it. See docs/analysis.md for what each analysis proves and its limits.
//!
//! - [`space`] - the finite abstraction (equivalence classes per fact);
//! - [`cell`] - whether a condition is constant on a cell of classes (intervals, congruences);
//! - [`mdd`] - decision diagrams over the classes (`gaps`, `diff`, `check`'s searches);
//! - [`search`] - three-valued search for a witness (`check`'s obsolete-workaround lint);
//! - [`regions`] - `gaps` and `diff`;
//! - [`lint`] - `check`;
//! - [`matrix`] - support matrices (`matrix`): axes, the cells' analysis
//!   ([`matrix::grid`]: reachable outcomes, deciding facts), renderings, diffs;
//! - [`why_not`] - counterfactual hints;
//! - [`coverage`] - rule coverage over a corpus.
//!
//! Dependencies go one way: this crate uses the core's policy, eval and facts
//! (`attn_policy`), never the reverse; the CLI uses both.

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
