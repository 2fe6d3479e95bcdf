//! The `attn-policy/explain/v1` JSON document: the model serialised (docs/decision-json.md,
//! schema docs/schema/explain-v1.json).

use serde_json::Value as Json;

use super::Explanation;

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
}
