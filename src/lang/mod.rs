//! The condition language: syntax (pest), AST, types and semantic versions.

pub mod ast;
pub mod parse;
pub mod version;

pub use ast::{Expr, ExprKind, Span};
pub use parse::{SyntaxError, parse_expr};
pub use version::Version;
