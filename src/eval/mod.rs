//! Evaluation of compiled conditions. **Where a rule is evaluated:** `Policy::decide_into`
//! (src/policy.rs) runs every rule of a pack through [`plan::RulePlan::eval_all`], the hot path;
//! [`Program::eval`] is the reference node interpreter that analysis, variants and tests use
//! (a test checks both agree on every rule over the conformance corpus).

pub mod plan;
pub mod program;

pub use program::{Func, Node, NodeId, Program};
