//! The `cudnn` executor (FusedAttention through the cuDNN backend graph API) and its probe.
//!
//! Pure parts (graph IR, plan-cache key, version gates, plan-JSON parsing, problem conversion)
//! build and are tested everywhere; the parts that call cuDNN (`enabled/`) need the `cudnn`
//! feature, and `disabled.rs` stands in for them without it. See `docs/cudnn.md`.

pub mod cache;
pub mod convert;
pub mod engine;
pub mod graph;
pub mod libpath;
pub mod spec;
pub mod version;

#[cfg(feature = "cudnn")]
mod enabled;
#[cfg(feature = "cudnn")]
use enabled as runtime;
#[cfg(feature = "cudnn")]
pub use enabled::{
    CudnnError, CudnnExecutor, IoPtrs, RunReport, backend, dl, exec, loaded_library,
    runtime_version, shared, shared_on,
};

#[cfg(not(feature = "cudnn"))]
mod disabled;
#[cfg(not(feature = "cudnn"))]
use disabled as runtime;

pub use convert::{
    MAX_HEAD_DIM, NAME, ProbeAnswer, VARLEN_ENV, check, check_with, manifest, manifest_with,
    varlen_enabled,
};
pub use runtime::{availability, create, loaded_version, require_version};
pub use spec::Direction;

use crate::problem::AttentionProblem;

/// Can cuDNN build a fused-attention graph for `problem` in direction `dir` on this machine
/// (device 0)? `Unknown` without a GPU, without libcudnn, or without the `cudnn` feature.
/// Answers are cached per thread together with the plans.
pub fn probe_graph(problem: &AttentionProblem, dir: Direction) -> ProbeAnswer {
    if let Err(u) = check(problem, None) {
        return ProbeAnswer::No { reason: u.reason };
    }
    runtime::probe_graph_here(problem, dir)
}

/// The training probe: forward and backward graphs both build. `No` if either is refused,
/// `Unknown` if either is unknown and neither refused.
pub fn probe_graph_training(problem: &AttentionProblem) -> ProbeAnswer {
    let f = probe_graph(problem, Direction::Forward);
    if matches!(f, ProbeAnswer::No { .. }) {
        return f;
    }
    let b = probe_graph(problem, Direction::Backward);
    match (&f, &b) {
        (_, ProbeAnswer::No { .. }) | (ProbeAnswer::Unknown { .. }, _) => {
            if matches!(b, ProbeAnswer::No { .. }) {
                b
            } else {
                f
            }
        }
        (ProbeAnswer::Yes { engine: fe }, ProbeAnswer::Yes { engine: be }) => ProbeAnswer::Yes {
            engine: format!("fwd {fe}; bwd {be}"),
        },
        _ => b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{DType, MaskSpec};

    #[test]
    fn probe_refuses_from_the_gate_without_a_device() {
        let p = AttentionProblem::new(1, 8, 8, 128, 128, 512, 512, DType::BF16);
        let a = probe_graph(&p, Direction::Forward);
        assert_eq!(a.as_fact(), Some(false), "{a:?}");
        let t = probe_graph_training(&p);
        assert_eq!(t.as_fact(), Some(false), "{t:?}");
    }

    #[test]
    fn probe_is_unknown_or_answered_for_a_supported_problem() {
        let p = AttentionProblem::new(1, 8, 8, 128, 128, 128, 128, DType::BF16)
            .with_mask(MaskSpec::CAUSAL_TOP_LEFT);
        let a = probe_graph(&p, Direction::Forward);
        // no GPU here: unknown, with a reason; on a GPU machine: answered
        match &a {
            ProbeAnswer::Unknown { reason } => assert!(!reason.is_empty()),
            other => assert!(other.as_fact().is_some(), "{other:?}"),
        }
    }
}
