//! attn-policy: declarative, explainable attention-backend selection.
//!
//! Load a pack, decide one attention call, and say why (a compiled and run doctest):
//!
//! ```
//! use attn_policy::{Explanation, Facts, Policy};
//!
//! let policy = Policy::embedded("te")?; // TransformerEngine 2.20.2's selector, as data
//! let facts = Facts::from_json(&serde_json::json!({
//!     "head_dim_qk": 512, "head_dim_v": 512, "device_compute_capability": [9, 0],
//! }))?;
//! let decision = policy.decide(&facts);
//! let why = Explanation::new(&policy, &facts, &decision);
//! assert_eq!(why.selected.as_deref(), Some("UnfusedDotProductAttention"));
//! // Every other backend with every rule that declined it, `file:line:col` included.
//! assert!(why.backend("FusedAttention").is_some_and(|b| !b.declined_by.is_empty()));
//! println!("{}", why.to_text(false));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Layout: [`lang`] (syntax) -> [`typecheck`] (types, lowering) -> [`eval`] (conditions) ->
//! [`policy`] (rules, decide) -> [`decision`] (indices, fast) -> [`explain`] (the owned
//! explanation model and its text, JSON and TE renderings); [`pack`] loads YAML; [`facts`] is
//! the typed input. The rule-set analysis (`check`'s lints, `gaps`, `diff`, why-not,
//! coverage) and the support matrix live in the `attn-policy-analysis` crate, which uses this
//! one.

pub mod cache;
pub mod catalogue;
pub mod conformance;
pub mod corpus;
pub mod decision;
pub mod diag;
pub mod eval;
pub mod explain;
pub mod facts;
pub mod lang;
pub mod pack;
pub mod policy;
pub mod typecheck;

pub use catalogue::{CatalogueEntry, ExecutorCatalogue, Provider};
pub use decision::{Decision, Status};
pub use diag::{Diagnostic, Diagnostics, Severity};
pub use explain::Explanation;
pub use facts::{Facts, InputError};
pub use pack::{LoadError, PackError, PackSource, PackSpec, load_pack};
pub use policy::Policy;
