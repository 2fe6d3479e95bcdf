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
//! The API is what this page lists: [`Policy`] (a loaded pack; `decide`), [`Facts`] (the typed
//! input; [`facts`] holds its schema, families and presets), [`Decision`] (fast, indices) and
//! [`Explanation`] (the owned model with text, JSON and TE renderings), [`PackSpec`] and
//! [`pack`] (which pack to load), [`CachedPolicy`] (a decision cache), [`Diagnostics`]
//! (load errors with spans) and [`conformance`] (corpora). Inside, a condition goes
//! `src/lang` (syntax) -> `src/typecheck` (types, lowering) -> `src/eval` (programs) ->
//! `src/policy.rs` (rules, `decide`) -> `src/decision.rs` -> `src/explain/`; those modules are
//! private, or public only for this workspace's own crates and hidden from these docs. The
//! rule-set analysis (`check`'s lints, `gaps`, `diff`, why-not, coverage) and the support
//! matrix live in the `attn-policy-analysis` crate, which uses this one.

// The documented API: everything a user needs is re-exported here.
pub use cache::{CacheStats, CachedPolicy, FactsKey};
pub use catalogue::{CatalogueEntry, ExecutorCatalogue, Provider};
pub use corpus::{CorpusError, Record, read_corpus};
pub use decision::{BackendResult, Decision, Status};
pub use diag::{Code, Diagnostic, Diagnostics, Loc, Severity};
pub use explain::{
    BackendExplanation, BackendStatus, CALL_SCHEMA, CallExtras, ExecutorAttempt, ExecutorOutcome,
    Explanation, FactValue, PackFrom, PreferenceApplied, RuleExplanation, SCHEMA, TeTuple,
    UnavailableVariant, UnreadInput, VariantChoice,
};
pub use facts::{Facts, InputError, Value};
pub use pack::{LoadError, PackError, PackSource, PackSpec, load_pack};
pub use policy::Policy;

// Documented modules: conformance corpora, the typed input (schema, families, presets), packs.
pub mod conformance;
pub mod facts;
pub mod pack;

// Building blocks the workspace's own crates (analysis, adapters, CLI, bindings) reach into:
// public so they can, hidden from the documented API, with no stability promise.
#[doc(hidden)]
pub mod eval;
#[doc(hidden)]
pub mod lang;
#[doc(hidden)]
pub mod typecheck;

mod cache;
mod catalogue;
mod corpus;
mod decision;
mod diag;
mod explain;
mod policy;
