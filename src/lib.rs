//! attn-policy: declarative attention-backend selection.
