//! [`TypeError`]: what the type checker (`typeck.rs`) and the guard check (`guard.rs`) report.

use crate::lang::ast::Span;

/// A type error inside one expression; `span` is relative to the expression text.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct TypeError {
    pub message: String,
    pub span: Span,
    pub help: Option<String>,
    /// The expression did not parse (reported as `E-SYNTAX`, not `E-TYPE`).
    pub syntax: bool,
}

impl From<crate::lang::SyntaxError> for TypeError {
    fn from(e: crate::lang::SyntaxError) -> TypeError {
        TypeError {
            message: e.message,
            span: e.span,
            help: None,
            syntax: true,
        }
    }
}
