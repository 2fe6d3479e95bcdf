//! The `attn-policy/explain/v1` JSON document: the model serialised (docs/decision-json.md,
//! schema docs/schema/explain-v1.json).

use serde_json::Value as Json;

use super::Explanation;

/// The `schema` field of the document.
pub const SCHEMA: &str = "attn-policy/explain/v1";

impl Explanation {
    /// The `explain/v1` document.
    pub fn to_json(&self) -> Json {
        // Only string map keys and plain values: serialising into a `Value` cannot fail.
        serde_json::to_value(self).unwrap_or(Json::Null)
    }
}
