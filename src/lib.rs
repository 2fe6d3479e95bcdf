//! attn-policy: declarative attention-backend selection.
pub mod check;
pub mod eval;
pub mod facts;
pub mod lang;
