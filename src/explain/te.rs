//! TransformerEngine's return tuple (`get_attention_backend`), read from the model.

use serde::Serialize;
use serde_json::Value as Json;

use super::{Explanation, FactValue};

/// TE's tuple, as an object (`--format te`); the Python drop-in returns it as a tuple (with
/// `use_frost_attention` last only when asked for).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TeTuple {
    pub use_flash_attention: bool,
    /// The chosen flash variant's version whenever FlashAttention is eligible (even when
    /// outranked, as TE does); else null.
    pub flash_attention_backend: FactValue,
    pub use_fused_attention: bool,
    /// The fused sub-backend (1 = F16_arbitrary_seqlen, 2 = FP8) whenever FusedAttention is
    /// eligible; else null.
    pub fused_attention_backend: FactValue,
    pub use_unfused_attention: bool,
    /// Eligibility of [flash, fused, unfused], before preference.
    pub available_backends: [bool; 3],
    pub use_frost_attention: bool,
}

impl Explanation {
    /// TE's tuple. A backend the pack does not have is neither selected nor eligible.
    pub fn te(&self) -> TeTuple {
        let selected = |name: &str| self.selected.as_deref() == Some(name);
        let eligible = |name: &str| self.backend(name).is_some_and(|b| b.status.eligible());
        let value = |name: &str| match self.backend(name) {
            Some(b) if b.status.eligible() => b
                .variant
                .as_ref()
                .map_or(FactValue::Null, |v| v.value.clone()),
            _ => FactValue::Null,
        };
        let (flash, fused, unfused, frost) = (
            "FlashAttention",
            "FusedAttention",
            "UnfusedDotProductAttention",
            "FrostAttention",
        );
        TeTuple {
            use_flash_attention: selected(flash),
            flash_attention_backend: value(flash),
            use_fused_attention: selected(fused),
            fused_attention_backend: value(fused),
            use_unfused_attention: selected(unfused),
            available_backends: [eligible(flash), eligible(fused), eligible(unfused)],
            use_frost_attention: selected(frost),
        }
    }

    /// TE's tuple as a JSON object (`--format te`).
    pub fn to_te(&self) -> Json {
        serde_json::to_value(self.te()).unwrap_or(Json::Null)
    }
}
