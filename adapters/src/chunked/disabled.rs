//! Stand-in when the crate is built without the `cuda` feature: every call says why.

use super::ChunkedConfig;
use crate::device::Availability;
use crate::executor::{Direction, ExecError, Executor, Manifest, Plan, Unsupported};
use crate::problem::AttentionProblem;
use std::sync::Arc;

const WHY: &str = "attn-policy-adapters was built without the `cuda` feature";

/// The chunked executor (unavailable in this build).
#[derive(Debug)]
pub struct Chunked {
    _private: (),
}

impl Chunked {
    /// Always fails with [`ExecError::NoDevice`] in this build.
    pub fn new(_config: ChunkedConfig) -> Result<Chunked, ExecError> {
        Err(ExecError::NoDevice { reason: WHY.into() })
    }
    /// Always fails with [`ExecError::NoDevice`] in this build.
    pub fn on_device(_config: ChunkedConfig, _ordinal: usize) -> Result<Chunked, ExecError> {
        Err(ExecError::NoDevice { reason: WHY.into() })
    }
}

/// Always unavailable in this build.
pub fn availability() -> Availability {
    Availability::unavailable(WHY)
}

/// As the CUDA build: the executor is a shared handle, which its plans keep alive.
impl Executor for Arc<Chunked> {
    fn name(&self) -> &str {
        super::NAME
    }
    fn device_description(&self) -> String {
        WHY.into()
    }
    fn manifest(&self) -> Manifest {
        super::manifest()
    }
    fn check(&self, p: &AttentionProblem) -> Result<(), Unsupported> {
        super::check_problem(p)
    }
    fn plan(&self, _: &AttentionProblem, _: Direction) -> Result<Arc<dyn Plan>, ExecError> {
        Err(ExecError::NoDevice { reason: WHY.into() })
    }
}
