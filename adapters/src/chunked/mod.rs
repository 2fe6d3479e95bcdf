//! `chunked`: attention as cuBLAS GEMMs over query chunks with fused NVRTC kernels between them.
//!
//! For each (batch, KV head) group and each chunk of `C` query rows, all query heads sharing the
//! KV head at once:
//! - forward: `S = Q_c K^T` (fp32 out) -> fused scale/mask/softmax/LSE kernel writes `P` (dtype)
//!   and LSE (fp32, natural log) -> `O_c = P V` (fp32 accumulation, dtype out);
//! - backward: `S` recomputed, `dP = dO_c V^T`, one kernel writes `P = exp(scale S - LSE)` and
//!   `dS = P (dP - D)` with `D = rowsum(dO * O)`, then `dQ_c = scale dS K`,
//!   `dK += scale dS^T Q_c`, `dV += P^T dO_c` into fp32 accumulators (GEMM `beta = 1`, chunks in a
//!   fixed order: deterministic, no atomics), cast once per group.
//!
//! Soft-capping is applied in those two kernels (the GEMMs stay plain), a sink joins the softmax
//! kernel's row denominator (and a learnable sink's gradient comes from one deterministic
//! per-head reduction), and per-sequence lengths run each sequence on its own rows and keys,
//! writing padding rows and keys explicitly (docs/executors.md).
//!
//! Only the key range the chunk's mask admits is computed (fully masked KV ranges are skipped),
//! the workspace is `O(C * s_kv)` per group (bounded by [`ChunkedConfig::workspace_budget`]),
//! and inputs are read in place through their strides (bshd, sbhd, bhsd or any strides with a
//! contiguous head dim and 16-byte alignment).
//!
//! The orchestration ([`plan`]) is written against a small set of device operations so that it is
//! tested on the CPU against the float64 reference (module `mock`), and run on the GPU by the
//! `cuda` feature's implementation.

mod config;
pub use config::{ChunkedConfig, MAX_HEAD_DIM, NAME, check_problem, manifest};

// Used by the CUDA build and the CPU mock tests only.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) mod plan;

#[cfg(test)]
mod mock;

#[doc(hidden)]
pub mod test_oracle;

#[cfg(feature = "cuda")]
mod enabled;
#[cfg(feature = "cuda")]
use enabled as runtime;
#[cfg(feature = "cuda")]
pub(crate) use enabled::backward_ptrs;
#[cfg(feature = "cuda")]
pub use enabled::{DeviceBuffer, compile_kernels_only, nvrtc_arch};
#[cfg(feature = "cuda")]
pub(crate) use enabled::{StreamKernels, StreamPlan};

#[cfg(not(feature = "cuda"))]
mod disabled;
#[cfg(not(feature = "cuda"))]
use disabled as runtime;

pub use runtime::{Chunked, availability};

use crate::executor::{ExecError, Executor};
use std::sync::Arc;

/// Registry constructor: opens CUDA device `ordinal` (fails with [`ExecError::NoDevice`]
/// without the `cuda` feature, a driver or that GPU).
pub fn create(ordinal: usize) -> Result<Arc<dyn Executor>, ExecError> {
    let ex = Chunked::on_device(ChunkedConfig::default(), ordinal)?;
    Ok(Arc::new(Arc::new(ex)))
}
