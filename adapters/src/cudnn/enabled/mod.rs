//! The parts of the `cudnn` executor that call cuDNN (feature `cudnn`); `../disabled.rs` is
//! the stand-in without the feature, with the same functions.

pub mod backend;
pub mod dl;
pub mod exec;
pub mod io;
pub mod varlen;

pub use exec::{
    CudnnError, CudnnExecutor, RunReport, loaded_library, runtime_version, shared, shared_on,
};
pub use io::IoPtrs;

use std::sync::Arc;

use super::convert::ProbeAnswer;
use super::spec::Direction;
use crate::device::{Availability, cuda_devices};
use crate::executor::{ExecError, Executor};
use crate::problem::AttentionProblem;

/// Registry constructor: the shared executor on CUDA device `ordinal`.
pub fn create(ordinal: usize) -> Result<Arc<dyn Executor>, ExecError> {
    Ok(Arc::new(shared_on(ordinal)?))
}

/// Run-time probe: a CUDA device and a loadable libcudnn (without creating a handle).
pub fn availability() -> Availability {
    if let Err(why) = cuda_devices() {
        return Availability::unavailable(why);
    }
    match (dl::api(), runtime_version()) {
        (Ok(api), Ok(v)) => Availability::Available {
            detail: format!("cuDNN {v} ({}, {})", api.path, api.origin.describe()),
        },
        (Err(e), _) => Availability::unavailable(e),
        (_, Err(e)) => Availability::unavailable(e.to_string()),
    }
}

/// (major, minor, patch) of the libcudnn this process loads for the executor (the one a
/// framework already mapped, else by name), or why none can be loaded.
pub fn loaded_version() -> Result<(u32, u32, u32), String> {
    let v = runtime_version().map_err(|e| e.to_string())?;
    Ok((v.major(), v.minor(), v.patch()))
}

/// Refuses (typed, naming both versions) when a decision's `cudnn_version` fact (major, minor,
/// patch) differs from the libcudnn loaded in this process.
pub fn require_version(ordinal: usize, decided: (u32, u32, u32)) -> Result<(), ExecError> {
    Ok(shared_on(ordinal)?.require_version(decided)?)
}

/// The graph probe on device 0.
pub(super) fn probe_graph_here(problem: &AttentionProblem, dir: Direction) -> ProbeAnswer {
    match shared() {
        Ok(ex) => ex.probe(problem, dir),
        Err(e) => ProbeAnswer::Unknown {
            reason: e.to_string(),
        },
    }
}
