//! Stand-in for the `cudnn` executor's runtime when the crate is built without the `cudnn`
//! feature: the same functions as `enabled/`, each saying why nothing can run.

use std::sync::Arc;

use super::convert::ProbeAnswer;
use super::spec::Direction;
use crate::device::Availability;
use crate::executor::{ExecError, Executor};
use crate::problem::AttentionProblem;

const WHY: &str = "attn-policy-adapters was built without the `cudnn` feature";

/// Registry constructor: always [`ExecError::NoDevice`] in this build.
pub fn create(_ordinal: usize) -> Result<Arc<dyn Executor>, ExecError> {
    Err(ExecError::NoDevice { reason: WHY.into() })
}

/// Always unavailable in this build.
pub fn availability() -> Availability {
    Availability::unavailable(WHY)
}

/// No libcudnn is loaded in this build.
pub fn loaded_version() -> Result<(u32, u32, u32), String> {
    Err(WHY.into())
}

/// Nothing is loaded in this build: [`ExecError::NoDevice`].
pub fn require_version(_ordinal: usize, _decided: (u32, u32, u32)) -> Result<(), ExecError> {
    Err(ExecError::NoDevice { reason: WHY.into() })
}

/// Always unknown in this build.
pub(super) fn probe_graph_here(_problem: &AttentionProblem, _dir: Direction) -> ProbeAnswer {
    ProbeAnswer::Unknown { reason: WHY.into() }
}
