//! The chunked executor's registry name, limits, tuning ([`ChunkedConfig`]), manifest and the
//! exact gate ([`check_problem`]): what `mod.rs`, the CUDA build (`enabled.rs`), its stand-in
//! (`disabled.rs`) and the plan share. It names none of them (no circle of files).

use crate::executor::{DeviceKind, Features, HeadDimRange, Manifest, Unsupported};
use crate::problem::{AttentionProblem, DType, LayoutKind, MaskKind};

/// Registry name.
pub const NAME: &str = "chunked";

/// Largest head dim accepted (Q/K and V).
pub const MAX_HEAD_DIM: usize = 2048;

/// Tuning and limits of the chunked executor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkedConfig {
    /// Upper bound on the bytes of workspace one call may allocate (scores, probabilities, their
    /// gradients, fp32 dK/dV accumulators). The chunk is shrunk until the workspace fits; if even
    /// the smallest chunk does not fit, the call fails with
    /// [`ExecError::Workspace`](crate::executor::ExecError::Workspace).
    pub workspace_budget: u64,
    /// Largest number of query rows per chunk (per head).
    pub max_chunk_rows: usize,
    /// Target number of score rows per GEMM (chunk rows x heads sharing a KV head): the chunk is
    /// `clamp(target / group_size, min_chunk_rows, max_chunk_rows)` before the budget applies.
    pub target_rows_per_gemm: usize,
    /// Smallest chunk tried before giving up on the budget.
    pub min_chunk_rows: usize,
    /// (batch, KV head) groups the fused executor's backward keeps in flight on separate
    /// streams, each with its own buffers (its GEMMs alone often have fewer tiles than the GPU
    /// has SMs). The chunked executor's own backward runs one group at a time.
    pub fused_score_lanes: usize,
    /// Row blocks per backward chunk for the GEMMs after the scores: each block's dQ GEMM reads
    /// only the keys its rows see, and each dK / dV GEMM only the rows that see its keys, so a
    /// causal chunk's diagonal block skips most of its masked half (1: one GEMM per chunk, the
    /// whole `rows x keys` rectangle).
    pub bwd_row_blocks: usize,
}

impl Default for ChunkedConfig {
    fn default() -> Self {
        ChunkedConfig {
            workspace_budget: 1 << 30,
            max_chunk_rows: 2048,
            target_rows_per_gemm: 4096,
            min_chunk_rows: 16,
            fused_score_lanes: 2,
            // 2 skips a causal chunk's masked quarter in the GEMMs (CPU-tested); 1 until a GPU
            // run has timed it and passed the GPU suites (docs/fused.md).
            bwd_row_blocks: 1,
        }
    }
}

/// The chunked executor's manifest.
pub fn manifest() -> Manifest {
    Manifest {
        name: NAME.into(),
        device: DeviceKind::Cuda,
        min_compute_capability: Some(80),
        max_compute_capability: None,
        dtypes: vec![DType::F16, DType::BF16],
        head_dim_qk: HeadDimRange {
            min: 8,
            max: MAX_HEAD_DIM,
            multiple_of: 8,
        },
        head_dim_v: HeadDimRange {
            min: 8,
            max: MAX_HEAD_DIM,
            multiple_of: 8,
        },
        head_dim_v_may_differ: true,
        masks: vec![
            MaskKind::NoMask,
            MaskKind::CausalTopLeft,
            MaskKind::CausalBottomRight,
        ],
        windows: true,
        rectangular: true,
        layouts: vec![LayoutKind::Bshd, LayoutKind::Sbhd, LayoutKind::Bhsd],
        arbitrary_strides: true,
        stride_multiple_of: 8,
        gqa: true,
        max_seqlen: Some(i32::MAX as usize / 2),
        max_score_elements: None,
        backward: true,
        deterministic: true,
        // Soft-capping and sinks in the softmax / backward kernels (d_sink by a deterministic
        // per-head reduction); per-sequence lengths by computing each sequence on its own rows.
        features: Features::all(),
        notes: vec![
            "cuBLAS GEMMs (fp32 accumulation) over query chunks + NVRTC softmax kernels".into(),
            "workspace O(chunk * s_kv), bounded by a budget (default 1 GiB); never O(s^2)".into(),
            "strides and base pointers must be multiples of 8 elements (16 bytes)".into(),
            "deterministic: fixed chunk order, GEMM beta=1 accumulation, no atomics".into(),
            "soft-capping, off-by-one and learnable sinks (d_sink), padded and packed sequences"
                .into(),
        ],
    }
}

/// The exact gate shared by the enabled and disabled builds.
pub fn check_problem(p: &AttentionProblem) -> Result<(), Unsupported> {
    manifest().admits(p)?;
    // cuBLAS takes 32-bit sizes and leading dimensions.
    let strides = [p.layout.q, p.layout.k, p.layout.v, p.layout.o];
    if strides.iter().any(|s| s.seq > i32::MAX as usize) {
        return Err(Unsupported::new("sequence stride above 2^31-1 elements"));
    }
    // The kernels take the tensors' row count (packed: all tokens) as a 32-bit int.
    if p.rows_q().max(p.rows_kv()) > i32::MAX as usize {
        return Err(Unsupported::new(
            "more than 2^31-1 rows (tokens) in a tensor",
        ));
    }
    Ok(())
}
