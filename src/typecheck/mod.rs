//! Static checking: typing conditions against the fact schema and lowering them to the
//! evaluation [`Program`](crate::eval::Program).

mod error;
mod guard;
pub mod typeck;

pub use error::TypeError;
pub use typeck::{Compiled, Compiler};
