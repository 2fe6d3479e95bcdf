//! Evaluation of compiled conditions. **Where a rule is evaluated:** [`Program::eval`] computes
//! one condition; `Policy::decide_into` (src/policy.rs) runs every rule of a pack through it.

pub mod fast;
pub mod program;

pub use program::{Func, Node, NodeId, Program};
