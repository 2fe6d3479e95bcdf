//! The `attn-policy/explain/v1` JSON document: the model serialised (docs/decision-json.md,
//! schema docs/schema/explain-v1.json); and the `attn-policy/call/v1` document of one call
//! (schema docs/schema/call-v1.json): the explanation with what ran, one shape for
//! `attn-policy run --json` and the Python package's `Explanation.to_dict()`.

use serde_json::{Value as Json, json};

use super::Explanation;

/// The `schema` field of the call document ([`Explanation::to_call_json`]).
pub const CALL_SCHEMA: &str = "attn-policy/call/v1";

/// What a call's document holds beside its explanation; each is null where the caller has none.
#[derive(Clone, Debug, Default)]
pub struct CallExtras {
    /// What the run measured (`attn-policy run`: the run report).
    pub run: Option<Json>,
    /// The device the call ran on, as the caller describes it.
    pub device: Option<Json>,
    /// Why nothing of the chain ran and another path ran instead (the Python package's
    /// `on_decline="fallback"`: torch SDPA).
    pub fallback: Option<String>,
    /// Why nothing ran, or the error of the executor that ran.
    pub error: Option<String>,
    /// What a call of another kind adds (an object with its `kind`: the Python package's
    /// `context_parallel` calls, with their per-step call documents, and `sdpa`
    /// explanations of PyTorch's own choice); null for one attention call.
    pub extra: Option<Json>,
}

impl Explanation {
    /// The `explain/v1` document as a JSON value.
    pub fn to_json(&self) -> Json {
        // Only string map keys and plain values: serialising cannot fail.
        serde_json::to_value(self).unwrap_or(Json::Null)
    }

    /// The document as text, pretty (`attn-policy explain --json`) or compact; the same bytes
    /// as printing [`Explanation::to_json`], without building the intermediate value.
    pub fn to_json_string(&self, pretty: bool) -> String {
        let text = if pretty {
            serde_json::to_string_pretty(self)
        } else {
            serde_json::to_string(self)
        };
        text.unwrap_or_default()
    }

    /// The call document: `schema`, `pack`, `backend`, `executor`, `substitute`,
    /// `executor_chain`, `decision` (this explanation's `explain/v1` document), and the
    /// `extras` (`run`, `device`, `fallback`, `error`, `extra`).
    pub fn to_call_json(&self, extras: CallExtras) -> Json {
        json!({
            "schema": CALL_SCHEMA,
            "pack": self.pack,
            "backend": self.selected,
            "executor": self.executor,
            "substitute": self.substitute(),
            "executor_chain": self.executor_chain,
            "decision": self.to_json(),
            "fallback": extras.fallback,
            "run": extras.run,
            "device": extras.device,
            "error": extras.error,
            "extra": extras.extra,
        })
    }
}
