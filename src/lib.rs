//! attn-policy: declarative, explainable attention-backend selection.
//!
//! ```no_run
//! use attn_policy::{Facts, Policy};
//! let policy = Policy::embedded("te").expect("the te pack loads");
//! let facts = Facts::from_json(&serde_json::json!({"head_dim_qk": 512, "head_dim_v": 512})).unwrap();
//! let decision = policy.decide(&facts);
//! println!("{}", attn_policy::Explanation::new(&policy, &facts, &decision).to_text(false));
//! ```
//!
//! Layout: [`lang`] (syntax) -> [`typecheck`] (types, lowering) -> [`eval`] (conditions) ->
//! [`policy`] (rules, decide) -> [`decision`] (indices, fast) -> [`explain`] (the owned
//! explanation model and its text, JSON and TE renderings); [`pack`] loads YAML; [`facts`] is
//! the typed input.

pub mod analysis;
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
pub mod matrix;
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
