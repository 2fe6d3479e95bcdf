//! The executor trait every backend implements, its capability manifest and its error type.
//!
//! # Implementing an executor
//! 1. [`Executor::manifest`] states, as data, what the executor accepts. A rule pack that names
//!    the executor may not admit more than this (the pack cross-check uses [`Manifest::admits`]).
//! 2. [`Executor::check`] is the exact run-time gate: it must refuse (with [`Unsupported`]) every
//!    problem the executor cannot run *exactly*, and accept everything else. It must be cheap
//!    and must not touch a device. It must agree with the manifest: whatever `check` accepts,
//!    `manifest().admits()` accepts too (check may be stricter, e.g. for memory limits).
//! 3. [`Executor::plan`] makes a [`Plan`] for one problem in one [`Direction`] (forward and
//!    backward are one method, the direction an argument). It refuses what `check` refuses,
//!    and builds and caches what the shape needs (GPU executors: the warm-up), so an error
//!    found while planning lets a chain walk move on.
//! 4. [`Plan::run_host`] takes host tensors ([`HostIo`], the device-agnostic path used by
//!    `attn-policy run` and the tests). It validates every tensor (dtype, length) before any
//!    device work and returns [`ExecError::InvalidInput`] without computing on a mismatch.
//!    [`run_forward`] / [`run_backward`] are the whole path (check, plan, run) in one call.
//! 5. Executors with a stream path implement [`Plan::workspace_bytes`] (how much workspace
//!    the caller allocates: its allocator, not ours) and [`Plan::enqueue`], which enqueues on
//!    the caller's `CUstream` with the caller's output and workspace pointers ([`DeviceIo`])
//!    and returns without synchronising. After the plan was made, an enqueue makes no device
//!    allocation, module load, plan build or handle creation, so it can be captured in a CUDA
//!    graph. A host executor's enqueue runs on host pointers, synchronously (the CPU
//!    reference's is the Python binding's CPU path).
//! 6. The synchronous device path ([`Plan::run_device`]) runs on the executor's own stream
//!    with its own workspace and times the call (benches). Both device paths refuse with
//!    `Unsupported` by default; io of the other direction than the plan's is
//!    [`ExecError::InvalidInput`], never a panic.
//!
//! Errors: [`ExecError::Unsupported`] means "this executor does not do that" (a policy matter:
//! the caller may pick another backend, and must say so); every other variant is a real error.

pub use crate::cudnn::spec::Direction;
use crate::problem::{AttentionProblem, DType, LayoutKind, MaskKind, SeqPacking, SoftmaxKind};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;
use thiserror::Error;

/// Why an executor declines a problem. Not an error of the caller's inputs: a capability gap.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Error)]
#[error("{reason}")]
pub struct Unsupported {
    /// Human-readable reason naming the parameter and its limit, e.g.
    /// `"head_dim_qk 1032 > 1024"`.
    pub reason: String,
}

impl Unsupported {
    /// Build from anything printable.
    pub fn new(reason: impl Into<String>) -> Unsupported {
        Unsupported {
            reason: reason.into(),
        }
    }
}

/// Everything that can go wrong when running an executor.
#[derive(Debug, Error)]
pub enum ExecError {
    /// The executor does not support this problem (capability gap, not a failure).
    #[error("unsupported: {reason}")]
    Unsupported {
        /// Why.
        reason: String,
    },
    /// The problem or a tensor does not match its description (wrong dtype, length, shape,
    /// alignment, or an invalid problem). Nothing was computed.
    #[error("invalid input: {reason}")]
    InvalidInput {
        /// What does not match.
        reason: String,
    },
    /// No usable device (no driver, no GPU, library missing) or the crate was built without the
    /// needed feature.
    #[error("no device: {reason}")]
    NoDevice {
        /// Why.
        reason: String,
    },
    /// A backend library call failed (CUDA driver, NVRTC, cuBLAS, cuDNN...).
    #[error("{library} error: {message}")]
    Backend {
        /// Which library (`cuda`, `nvrtc`, `cublas`, `cudnn`).
        library: &'static str,
        /// Its message.
        message: String,
    },
    /// The workspace needed exceeds the configured budget.
    #[error("workspace: need {needed} bytes, budget {budget} bytes")]
    Workspace {
        /// Bytes needed for the smallest chunking.
        needed: u64,
        /// Configured budget.
        budget: u64,
    },
    /// No executor with this name is registered.
    #[error("unknown executor '{name}' (known: {known})")]
    UnknownExecutor {
        /// Requested name.
        name: String,
        /// Comma-separated registered names.
        known: String,
    },
    /// The executor exists but cannot run in this process (for example one the Python host
    /// provides, asked for outside Python).
    #[error("executor '{name}' is unavailable: {reason}")]
    Unavailable {
        /// Executor name.
        name: String,
        /// Why.
        reason: String,
    },
    /// Verification against the reference failed (used by [`crate::trial`]).
    #[error("verification failed: {reason}")]
    Verification {
        /// Which quantity and by how much.
        reason: String,
    },
}

impl From<Unsupported> for ExecError {
    fn from(u: Unsupported) -> ExecError {
        ExecError::Unsupported { reason: u.reason }
    }
}

impl ExecError {
    /// Shorthand for [`ExecError::InvalidInput`].
    pub fn invalid(reason: impl Into<String>) -> ExecError {
        ExecError::InvalidInput {
            reason: reason.into(),
        }
    }
    /// Is this a capability refusal (as opposed to a real error)?
    pub fn is_unsupported(&self) -> bool {
        matches!(self, ExecError::Unsupported { .. })
    }
}

/// Where an executor runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    /// Host CPU.
    Cpu,
    /// An NVIDIA GPU.
    Cuda,
}

/// Head dims an executor accepts: `min <= d <= max` and `d % multiple_of == 0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadDimRange {
    /// Smallest accepted head dim.
    pub min: usize,
    /// Largest accepted head dim.
    pub max: usize,
    /// Head dims must be a multiple of this.
    pub multiple_of: usize,
}

impl HeadDimRange {
    /// Does `d` fall in the range?
    pub fn contains(&self, d: usize) -> bool {
        d >= self.min && d <= self.max && d.is_multiple_of(self.multiple_of.max(1))
    }
}

impl fmt::Display for HeadDimRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}..={} (multiple of {})",
            self.min, self.max, self.multiple_of
        )
    }
}

/// The computations beyond plain softmax attention an executor serves; the default is none.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Features {
    /// Logit soft-capping ([`AttentionProblem::softcap`]).
    #[serde(default)]
    pub softcap: bool,
    /// Sinks besides the vanilla softmax ([`AttentionProblem::softmax`]).
    #[serde(default)]
    pub sinks: Vec<SoftmaxKind>,
    /// Per-sequence lengths, by where the sequences sit ([`AttentionProblem::seqlens`]).
    #[serde(default)]
    pub seqlens: Vec<SeqPacking>,
}

impl Features {
    /// No feature: plain softmax attention over full sequences.
    pub fn none() -> Features {
        Features::default()
    }

    /// Every feature: soft-capping, both sinks, padded (either side) and packed sequences.
    pub fn all() -> Features {
        Features {
            softcap: true,
            sinks: vec![SoftmaxKind::OffByOne, SoftmaxKind::Learnable],
            seqlens: vec![
                SeqPacking::PaddedRight,
                SeqPacking::PaddedLeft,
                SeqPacking::Packed,
            ],
        }
    }

    /// The first feature of `p` this set does not serve.
    pub fn admits(&self, p: &AttentionProblem) -> Result<(), Unsupported> {
        if p.softcap.is_some() && !self.softcap {
            return Err(Unsupported::new("logit soft-capping not supported"));
        }
        if p.softmax != SoftmaxKind::Vanilla && !self.sinks.contains(&p.softmax) {
            return Err(Unsupported::new(format!(
                "softmax_type {} (an attention sink) not supported",
                p.softmax.te_name()
            )));
        }
        if let Some(s) = &p.seqlens
            && !self.seqlens.contains(&s.packing)
        {
            return Err(Unsupported::new(format!(
                "per-sequence lengths ({}) not supported",
                s.packing.describe()
            )));
        }
        Ok(())
    }
}

/// What an executor accepts, as data. Serialized into docs and cross-checked against rule packs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Executor name (same as [`Executor::name`]).
    pub name: String,
    /// Where it runs.
    pub device: DeviceKind,
    /// Minimum CUDA compute capability as `major * 10 + minor` (None for CPU).
    pub min_compute_capability: Option<u32>,
    /// Maximum CUDA compute capability, same encoding (None: no upper bound); `fused` is
    /// sm_90a code, which no later architecture runs.
    #[serde(default)]
    pub max_compute_capability: Option<u32>,
    /// Accepted element types.
    pub dtypes: Vec<DType>,
    /// Accepted Q/K head dims.
    pub head_dim_qk: HeadDimRange,
    /// Accepted V/O head dims.
    pub head_dim_v: HeadDimRange,
    /// May `head_dim_v` differ from `head_dim_qk`?
    pub head_dim_v_may_differ: bool,
    /// Accepted causal kinds.
    pub masks: Vec<MaskKind>,
    /// Sliding windows (left/right bounds) accepted, with either diagonal alignment.
    pub windows: bool,
    /// `s_q != s_kv` accepted.
    pub rectangular: bool,
    /// Named layouts accepted.
    pub layouts: Vec<LayoutKind>,
    /// Arbitrary strides (head dim contiguous) accepted, beyond the named layouts.
    pub arbitrary_strides: bool,
    /// Required alignment of every stride and base pointer, in elements (1 = none).
    pub stride_multiple_of: usize,
    /// GQA/MQA (`h_kv < h_q`) accepted.
    pub gqa: bool,
    /// Largest sequence length (either side), None = no fixed limit (memory permitting).
    pub max_seqlen: Option<usize>,
    /// Largest `b * h_q * s_q * s_kv` (score elements) the executor takes, None = unbounded.
    pub max_score_elements: Option<u64>,
    /// Backward implemented.
    pub backward: bool,
    /// Results are bitwise reproducible run to run.
    pub deterministic: bool,
    /// Soft-capping, sinks and per-sequence lengths served.
    #[serde(default)]
    pub features: Features,
    /// Free-form notes for humans (documented limits, conventions).
    pub notes: Vec<String>,
}

impl Manifest {
    /// Does the manifest admit this problem? Returns the first reason it does not.
    /// Executors typically implement [`Executor::check`] as `manifest().admits(p)` plus
    /// problem-specific extras.
    pub fn admits(&self, p: &AttentionProblem) -> Result<(), Unsupported> {
        if let Err(e) = p.validate() {
            return Err(Unsupported::new(format!("invalid problem: {e}")));
        }
        if !self.dtypes.contains(&p.dtype) {
            return Err(Unsupported::new(format!("dtype {} not supported", p.dtype)));
        }
        if !self.head_dim_qk.contains(p.head_dim_qk) {
            return Err(Unsupported::new(format!(
                "head_dim_qk {} outside {}",
                p.head_dim_qk, self.head_dim_qk
            )));
        }
        if !self.head_dim_v.contains(p.head_dim_v) {
            return Err(Unsupported::new(format!(
                "head_dim_v {} outside {}",
                p.head_dim_v, self.head_dim_v
            )));
        }
        if !self.head_dim_v_may_differ && p.head_dim_v != p.head_dim_qk {
            return Err(Unsupported::new("head_dim_v != head_dim_qk"));
        }
        if !self.masks.contains(&p.mask.kind) {
            return Err(Unsupported::new(format!(
                "mask {} not supported",
                p.mask.kind.rule_name()
            )));
        }
        if !self.windows && p.mask.has_window() {
            return Err(Unsupported::new("sliding window not supported"));
        }
        if !self.rectangular && p.seqlen_q != p.seqlen_kv {
            return Err(Unsupported::new("seqlen_q != seqlen_kv not supported"));
        }
        if !self.gqa && p.heads_kv != p.heads_q {
            return Err(Unsupported::new(
                "GQA/MQA (heads_kv < heads_q) not supported",
            ));
        }
        if let Some(m) = self.max_seqlen
            && (p.seqlen_q > m || p.seqlen_kv > m)
        {
            return Err(Unsupported::new(format!("sequence length above {m}")));
        }
        if let Some(m) = self.max_score_elements {
            let n = (p.batch * p.heads_q) as u64 * p.seqlen_q as u64 * p.seqlen_kv as u64;
            if n > m {
                return Err(Unsupported::new(format!(
                    "b*h_q*s_q*s_kv = {n} score elements above {m}"
                )));
            }
        }
        self.features.admits(p)?;
        if !p.deterministic || self.deterministic {
            // ok
        } else {
            return Err(Unsupported::new("deterministic results not guaranteed"));
        }
        let tensors = [
            ("q", p.layout.q, p.heads_q, p.rows_q(), p.head_dim_qk),
            ("k", p.layout.k, p.heads_kv, p.rows_kv(), p.head_dim_qk),
            ("v", p.layout.v, p.heads_kv, p.rows_kv(), p.head_dim_v),
            ("o", p.layout.o, p.heads_q, p.rows_q(), p.head_dim_v),
        ];
        for (name, s, h, sl, d) in tensors {
            let named = s.kind(p.batch_dim(), h, sl, d);
            match named {
                Some(k) if self.layouts.contains(&k) => {}
                _ if self.arbitrary_strides => {}
                _ => {
                    return Err(Unsupported::new(format!(
                        "{name} layout {} not supported",
                        named.map_or("custom strides", |k| k.rule_name())
                    )));
                }
            }
            let m = self.stride_multiple_of.max(1);
            if s.batch % m != 0 || s.head % m != 0 || s.seq % m != 0 {
                return Err(Unsupported::new(format!(
                    "{name} strides (batch {}, head {}, seq {}) must be multiples of {m} elements",
                    s.batch, s.head, s.seq
                )));
            }
        }
        Ok(())
    }
}

/// A tensor in host memory: 16-bit patterns of `dtype` (fp16 or bf16), laid out with some [`crate::Strides`].
///
/// `data.len()` must be at least the span the problem's strides give for this tensor; elements
/// between rows (padding) are ignored on input and left untouched on output.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// Element type.
    pub dtype: DType,
    /// Raw 16-bit patterns.
    pub data: Vec<u16>,
}

impl HostTensor {
    /// A tensor of `len` elements all equal to `value` (rounded to `dtype`).
    pub fn filled(dtype: DType, len: usize, value: f64) -> HostTensor {
        HostTensor {
            dtype,
            data: vec![dtype.to_bits(value); len],
        }
    }
    /// Value of element `i` as f64.
    pub fn get(&self, i: usize) -> f64 {
        self.dtype.from_bits(self.data[i])
    }
}

/// Inputs of a forward call on the host path.
#[derive(Clone, Copy, Debug)]
pub struct ForwardInputs<'a> {
    /// Q, strides `problem.layout.q`.
    pub q: &'a HostTensor,
    /// K, strides `problem.layout.k`.
    pub k: &'a HostTensor,
    /// V, strides `problem.layout.v`.
    pub v: &'a HostTensor,
    /// Sink logits `[h_q]` (fp32) of a learnable sink ([`crate::SoftmaxKind::Learnable`]);
    /// `None` otherwise.
    pub sink: Option<&'a [f32]>,
}

/// Inputs of a backward call on the host path.
#[derive(Clone, Copy, Debug)]
pub struct BackwardInputs<'a> {
    /// Q, strides `problem.layout.q`.
    pub q: &'a HostTensor,
    /// K, strides `problem.layout.k`.
    pub k: &'a HostTensor,
    /// V, strides `problem.layout.v`.
    pub v: &'a HostTensor,
    /// Forward output O, strides `problem.layout.o`.
    pub o: &'a HostTensor,
    /// Gradient of O, strides `problem.layout.o`, same dtype as Q.
    pub d_o: &'a HostTensor,
    /// Forward LSE, `[b, h_q, s_q]` natural log, fp32.
    pub lse: &'a [f32],
    /// Sink logits of a learnable sink, as in [`ForwardInputs::sink`].
    pub sink: Option<&'a [f32]>,
}

/// Measurements an executor reports about one call.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecStats {
    /// Time of the computation itself (device events for GPU executors, wall clock for CPU),
    /// excluding host<->device copies, in milliseconds.
    pub compute_ms: f64,
    /// Bytes of workspace the executor allocated beyond inputs and outputs.
    pub workspace_bytes: u64,
    /// Peak bytes the call allocated on its device (outputs + workspace), if known.
    pub peak_bytes: Option<u64>,
}

/// Result of a forward call on the host path.
#[derive(Clone, Debug)]
pub struct ForwardOutput {
    /// O, strides `problem.layout.o` (padding elements are 0).
    pub o: HostTensor,
    /// LSE `[b, h_q, s_q]`, natural log of the sum of `exp(scale * q.k)`, fp32; `-inf` for rows
    /// with no admissible key.
    pub lse: Vec<f32>,
    /// Measurements.
    pub stats: ExecStats,
}

/// Result of a backward call on the host path.
#[derive(Clone, Debug)]
pub struct BackwardOutput {
    /// dQ, strides `problem.layout.q`.
    pub dq: HostTensor,
    /// dK, strides `problem.layout.k`.
    pub dk: HostTensor,
    /// dV, strides `problem.layout.v`.
    pub dv: HostTensor,
    /// Gradient of the sink logits `[h_q]` (fp32) of a learnable sink, else empty.
    pub d_sink: Vec<f32>,
    /// Measurements.
    pub stats: ExecStats,
}

/// Raw device pointers for the forward device path (CUDA `CUdeviceptr` values as `u64`).
///
/// Q/K/V/O use the problem's strides and dtype; `lse` is `[b, h_q, s_q]` fp32 contiguous.
/// `stream` is a `CUstream` (0 = the executor's own stream; the call is then synchronous).
#[derive(Clone, Copy, Debug)]
pub struct DeviceForwardArgs {
    /// Q.
    pub q: u64,
    /// K.
    pub k: u64,
    /// V.
    pub v: u64,
    /// Output O.
    pub o: u64,
    /// Output LSE.
    pub lse: u64,
    /// Sink logits `[h_q]` fp32 of a learnable sink (0: none).
    pub sink: u64,
}

/// Raw device pointers for the backward device path; dQ/dK/dV use the strides of Q/K/V.
#[derive(Clone, Copy, Debug)]
pub struct DeviceBackwardArgs {
    /// Q.
    pub q: u64,
    /// K.
    pub k: u64,
    /// V.
    pub v: u64,
    /// Forward O.
    pub o: u64,
    /// Gradient of O.
    pub d_o: u64,
    /// Forward LSE.
    pub lse: u64,
    /// Output dQ.
    pub dq: u64,
    /// Output dK.
    pub dk: u64,
    /// Output dV.
    pub dv: u64,
    /// Sink logits `[h_q]` fp32 of a learnable sink (0: none).
    pub sink: u64,
    /// Output: gradient of the sink logits `[h_q]` fp32 (0: none), overwritten.
    pub d_sink: u64,
}

/// Where a stream-ordered call runs and the workspace the caller allocated for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamLaunch {
    /// CUDA device ordinal of every pointer (must be the executor's device).
    pub device: usize,
    /// The caller's `CUstream` (`cudaStream_t`), as an integer; 0 is the legacy default stream.
    pub stream: u64,
    /// Device pointer of the workspace (0 when `workspace_bytes` is 0); at least 256-byte
    /// aligned, live until the work enqueued on `stream` completes.
    pub workspace: u64,
    /// Size of the workspace in bytes: at least what [`Plan::workspace_bytes`] said.
    pub workspace_bytes: u64,
}

/// The inputs and outputs of one call through raw pointers, for [`Plan::enqueue`] and
/// [`Plan::run_device`]: the variant is the direction, and must be the plan's.
///
/// The pointers are on the executor's device: CUDA device memory for a GPU executor, host
/// memory for a host executor ([`DeviceKind::Cpu`]), which then runs synchronously.
#[derive(Clone, Copy, Debug)]
pub enum DeviceIo {
    /// A forward: Q, K, V in, O and LSE out.
    Forward(DeviceForwardArgs),
    /// A backward: Q, K, V, O, dO, LSE in, dQ, dK, dV out.
    Backward(DeviceBackwardArgs),
}

impl DeviceIo {
    /// The direction of the call these pointers are for.
    pub fn direction(&self) -> Direction {
        match self {
            DeviceIo::Forward(_) => Direction::Forward,
            DeviceIo::Backward(_) => Direction::Backward,
        }
    }
}

/// The inputs of one call on host tensors, for [`Plan::run_host`]: the variant is the
/// direction, and must be the plan's.
#[derive(Clone, Copy, Debug)]
pub enum HostIo<'a> {
    /// A forward's Q, K, V.
    Forward(ForwardInputs<'a>),
    /// A backward's Q, K, V, O, dO and LSE.
    Backward(BackwardInputs<'a>),
}

impl HostIo<'_> {
    /// The direction of the call these inputs are for.
    pub fn direction(&self) -> Direction {
        match self {
            HostIo::Forward(_) => Direction::Forward,
            HostIo::Backward(_) => Direction::Backward,
        }
    }
}

/// The result of [`Plan::run_host`]: the variant is the plan's direction.
#[derive(Clone, Debug)]
pub enum HostOutput {
    /// O and LSE.
    Forward(ForwardOutput),
    /// dQ, dK, dV.
    Backward(BackwardOutput),
}

impl HostOutput {
    /// The forward's output, or [`ExecError::InvalidInput`] for a backward's.
    pub fn into_forward(self) -> Result<ForwardOutput, ExecError> {
        match self {
            HostOutput::Forward(o) => Ok(o),
            HostOutput::Backward(_) => {
                Err(direction_mismatch(Direction::Forward, Direction::Backward))
            }
        }
    }

    /// The backward's output, or [`ExecError::InvalidInput`] for a forward's.
    pub fn into_backward(self) -> Result<BackwardOutput, ExecError> {
        match self {
            HostOutput::Backward(o) => Ok(o),
            HostOutput::Forward(_) => {
                Err(direction_mismatch(Direction::Backward, Direction::Forward))
            }
        }
    }
}

/// The typed error of a call whose io is for another direction than its plan's.
pub fn direction_mismatch(plan: Direction, io: Direction) -> ExecError {
    ExecError::invalid(format!(
        "a {} plan was handed the io of a {}",
        direction_name(plan),
        direction_name(io)
    ))
}

fn direction_name(d: Direction) -> &'static str {
    match d {
        Direction::Forward => "forward",
        Direction::Backward => "backward",
    }
}

/// `Unsupported`: `executor` has no stream-ordered path (the default of [`Plan::enqueue`] and
/// [`Plan::workspace_bytes`]).
pub fn no_stream_path(executor: &str) -> ExecError {
    ExecError::Unsupported {
        reason: format!("{executor}: no stream path"),
    }
}

/// `Unsupported`: `executor` has no synchronous device path (the default of
/// [`Plan::run_device`]).
pub fn no_device_path(executor: &str) -> ExecError {
    ExecError::Unsupported {
        reason: format!("{executor}: no device path"),
    }
}

/// An attention executor. Object safe; shared across threads.
///
/// The contract is narrow: what it is ([`Executor::name`], [`Executor::manifest`], where it
/// runs), whether it runs a problem ([`Executor::check`]), and a [`Plan`] for a problem in one
/// [`Direction`] ([`Executor::plan`]); every run, host or device, forward or backward, goes
/// through a plan.
pub trait Executor: Send + Sync {
    /// Registry name, as rule packs write it (`reference`, `chunked`, `cudnn`).
    fn name(&self) -> &str;

    /// One line describing the device it runs on (e.g. `"NVIDIA H200 (sm_90), driver 13000"`).
    fn device_description(&self) -> String;

    /// Capability manifest, as data.
    fn manifest(&self) -> Manifest;

    /// Exact run-time gate: `Ok` iff the executor runs this problem exactly. No device work.
    fn check(&self, problem: &AttentionProblem) -> Result<(), Unsupported>;

    /// CUDA device ordinal the executor runs on (None for host executors).
    fn device_ordinal(&self) -> Option<usize> {
        None
    }

    /// Builds what running `problem` in `direction` needs and returns it as a [`Plan`]: the
    /// plan step of a chain walk ([`crate::chain`]), so an error found here (a graph cuDNN will
    /// not build) lets the walk move on, and running starts no work it cannot finish. Refuses
    /// (`Unsupported`) whatever [`Executor::check`] refuses. GPU executors build and cache
    /// what the shape needs here (the warm-up), so the plan's enqueue does no host-side setup.
    fn plan(
        &self,
        problem: &AttentionProblem,
        direction: Direction,
    ) -> Result<Arc<dyn Plan>, ExecError>;
}

/// One problem in one direction on one executor, ready to run. Made by [`Executor::plan`];
/// it keeps alive what it needs of its executor. Object safe; shared across threads.
pub trait Plan: Send + Sync {
    /// Name of the executor that made it.
    fn executor(&self) -> &str;

    /// The direction it runs.
    fn direction(&self) -> Direction;

    /// Bytes of workspace [`Plan::enqueue`] needs (0 for none). Where an executor keeps its
    /// plans per thread (cuDNN's handles), this builds or finds the calling thread's, so ask on
    /// the thread that enqueues. Default: `Unsupported` ("no stream path").
    fn workspace_bytes(&self) -> Result<u64, ExecError> {
        Err(no_stream_path(self.executor()))
    }

    /// Enqueues the call on the caller's stream (`launch`) with the caller's outputs and
    /// workspace and returns without synchronising (a host executor runs it before returning,
    /// on host memory, and ignores `launch`). After the warm-up ([`Executor::plan`],
    /// [`Plan::workspace_bytes`]) it makes no device allocation, module load, plan build or
    /// handle creation, so it can be captured in a CUDA graph. `io` of the other direction is
    /// [`ExecError::InvalidInput`]. Default: `Unsupported` ("no stream path").
    ///
    /// # Safety
    /// Every pointer must be a live allocation on `launch.device` (host memory for a host
    /// executor) covering the span the problem's strides give (LSE: `lse_len()` floats,
    /// contiguous), outputs must not alias inputs, and all of them (and the workspace) must
    /// stay live until the enqueued work completes on `launch.stream`.
    unsafe fn enqueue(&self, io: &DeviceIo, launch: &StreamLaunch) -> Result<(), ExecError> {
        let _ = (io, launch);
        Err(no_stream_path(self.executor()))
    }

    /// Runs the call on device memory, on the executor's own stream with a workspace of its
    /// own, synchronously, and times it (the benches' path). `io` of the other direction is
    /// [`ExecError::InvalidInput`]. Default: `Unsupported` ("no device path").
    ///
    /// # Safety
    /// Every pointer must be a live allocation on the executor's device covering the span the
    /// problem's strides give (LSE: `lse_len()` floats), and outputs must not alias inputs.
    unsafe fn run_device(&self, io: &DeviceIo) -> Result<ExecStats, ExecError> {
        let _ = io;
        Err(no_device_path(self.executor()))
    }

    /// Runs the call on host tensors (the device-agnostic path of `attn-policy run` and the
    /// tests): validates every tensor (dtype, length) before any work and returns
    /// [`ExecError::InvalidInput`] without computing on a mismatch (or for `io` of the other
    /// direction); GPU executors upload, run and download.
    fn run_host(&self, io: HostIo<'_>) -> Result<HostOutput, ExecError>;
}

impl fmt::Debug for dyn Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plan")
            .field("executor", &self.executor())
            .field("direction", &self.direction())
            .finish_non_exhaustive()
    }
}

/// The forward on host tensors through the contract: [`Executor::check`], the inputs
/// validated, [`Executor::plan`], [`Plan::run_host`].
pub fn run_forward(
    ex: &dyn Executor,
    problem: &AttentionProblem,
    inputs: &ForwardInputs<'_>,
) -> Result<ForwardOutput, ExecError> {
    ex.check(problem)?;
    validate_forward_inputs(problem, inputs)?;
    ex.plan(problem, Direction::Forward)?
        .run_host(HostIo::Forward(*inputs))?
        .into_forward()
}

/// The backward on host tensors through the contract; see [`run_forward`].
pub fn run_backward(
    ex: &dyn Executor,
    problem: &AttentionProblem,
    inputs: &BackwardInputs<'_>,
) -> Result<BackwardOutput, ExecError> {
    ex.check(problem)?;
    validate_backward_inputs(problem, inputs)?;
    ex.plan(problem, Direction::Backward)?
        .run_host(HostIo::Backward(*inputs))?
        .into_backward()
}

/// Shared validation of host inputs: dtype and length of every tensor against the problem.
/// Executors call this before any work.
pub fn validate_forward_inputs(
    p: &AttentionProblem,
    inputs: &ForwardInputs<'_>,
) -> Result<(), ExecError> {
    p.validate().map_err(ExecError::invalid)?;
    check_tensor("q", p.dtype, p.q_span(), inputs.q)?;
    check_tensor("k", p.dtype, p.k_span(), inputs.k)?;
    check_tensor("v", p.dtype, p.v_span(), inputs.v)?;
    validate_sink(p, inputs.sink.map(<[f32]>::len))
}

/// The sink logits a call carries (`sink_len`: how many, `None` when it carries none) against
/// the problem's softmax: a learnable sink needs exactly `h_q` logits (without them the call
/// would silently be a vanilla softmax); the other softmaxes take none (they would be ignored).
/// Both mismatches are [`ExecError::InvalidInput`].
pub fn validate_sink(p: &AttentionProblem, sink_len: Option<usize>) -> Result<(), ExecError> {
    match (p.softmax, sink_len) {
        (SoftmaxKind::Learnable, Some(n)) if n == p.heads_q => Ok(()),
        (SoftmaxKind::Learnable, Some(n)) => Err(ExecError::invalid(format!(
            "sink has {n} logits, expected h_q = {}",
            p.heads_q
        ))),
        (SoftmaxKind::Learnable, None) => Err(ExecError::invalid(
            "softmax_type learnable needs its sink logits ([h_q] fp32), none given",
        )),
        (_, None) => Ok(()),
        (kind, Some(_)) => Err(ExecError::invalid(format!(
            "sink logits given for softmax_type {}; only learnable takes them",
            kind.te_name()
        ))),
    }
}

/// Shared validation of backward host inputs (dO's dtype included, LSE length).
pub fn validate_backward_inputs(
    p: &AttentionProblem,
    inputs: &BackwardInputs<'_>,
) -> Result<(), ExecError> {
    p.validate().map_err(ExecError::invalid)?;
    check_tensor("q", p.dtype, p.q_span(), inputs.q)?;
    check_tensor("k", p.dtype, p.k_span(), inputs.k)?;
    check_tensor("v", p.dtype, p.v_span(), inputs.v)?;
    check_tensor("o", p.dtype, p.o_span(), inputs.o)?;
    check_tensor("d_o", p.dtype, p.o_span(), inputs.d_o)?;
    if inputs.lse.len() != p.lse_len() {
        return Err(ExecError::invalid(format!(
            "lse has {} elements, expected b*h_q*s_q = {}",
            inputs.lse.len(),
            p.lse_len()
        )));
    }
    validate_sink(p, inputs.sink.map(<[f32]>::len))
}

fn check_tensor(name: &str, dtype: DType, span: usize, t: &HostTensor) -> Result<(), ExecError> {
    if !dtype.is_16bit() {
        return Err(ExecError::invalid(format!(
            "{name}: host tensors hold fp16/bf16; {dtype} inputs go through the strided-pointer API (reference::forward_strided)"
        )));
    }
    if t.dtype != dtype {
        return Err(ExecError::invalid(format!(
            "{name} has dtype {}, problem says {dtype}",
            t.dtype
        )));
    }
    if t.data.len() < span {
        return Err(ExecError::invalid(format!(
            "{name} has {} elements, its strides need {span}",
            t.data.len()
        )));
    }
    Ok(())
}
