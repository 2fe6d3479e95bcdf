//! Static checking: typing conditions against the fact schema and lowering them to the
//! evaluation [`Program`](crate::eval::Program).

pub mod typeck;

pub use typeck::{Compiled, Compiler, TypeError};
