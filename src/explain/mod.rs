//! The explanation of a decision as one owned value, and its renderings.
//!
//! A [`Decision`](crate::decision::Decision) is the fast result of `Policy::decide_into`:
//! indices into the policy, no text, no allocation once its buffers have grown. An
//! [`Explanation`] is built from (policy, facts, decision) on demand, by one function
//! ([`Explanation::new`], `model.rs`), and holds everything a reader needs by name: the
//! selection, the preference that applied, every backend's status with the rules that declined
//! it (their offending values and locations), pending probes, the input facts, their provenance
//! and the executor chain. It owns its data (no borrow of the policy), so it can be cached,
//! sent across threads and serialised.
//!
//! The renderers read only the model:
//! - `text.rs`: the human text of `attn-policy explain` (and the provenance section the
//!   Python binding appends),
//! - `json.rs`: the `attn-policy/explain/v1` document (docs/decision-json.md; its JSON Schema
//!   is docs/schema/explain-v1.json),
//! - `te.rs`: TransformerEngine's return tuple (`--format te`, the Python drop-in's tuple).

mod json;
mod model;
mod te;
mod text;

pub use json::{CALL_SCHEMA, CallExtras};
pub use model::{
    BackendExplanation, BackendStatus, ExecutorAttempt, ExecutorOutcome, Explanation, FactValue,
    PackFrom, PreferenceApplied, RuleExplanation, SCHEMA, UnavailableVariant, UnreadInput,
    VariantChoice,
};
pub use te::TeTuple;
