//! The executors' side of `attn_policy.torch`: problems built from a tensor's shapes and
//! strides, plans (executor + problem + workspace size, made once per input signature), and
//! calls that pass raw pointers.
//!
//! - CPU tensors run the float64 reference on their memory in place (any strides, fp16, bf16,
//!   fp32, fp64), with the GIL released: the reference executor's plan, through the same
//!   contract (`Executor::plan`, `Plan::enqueue`) as every executor.
//! - CUDA tensors run the GPU executors on the caller's stream (`torch.cuda.current_stream()`)
//!   with outputs and workspace the caller allocated (torch's caching allocator): the call
//!   enqueues and returns, with no synchronisation and no device allocation after the plan was
//!   made, so a captured CUDA graph replays it.
//!
//! Errors are typed: `ExecutorRefused` (the executor does not do this problem: a capability
//! gap, with the executor's reason), `ExecutorUnavailable` (it cannot run in this process: no
//! GPU, feature off, library missing), `ExecutorFailed` (a library call failed), `ValueError`
//! (the tensors do not describe a valid problem) as `InvalidInput`, a `PolicyError`.
//!
//! Python checks the tensors before a plan is made (`attn_policy.torch._check_inputs`); the
//! plans check again what they are handed, so that no caller's mistake becomes an out-of-bounds
//! read: every pointer comes with the bytes its tensor's storage holds from it, and a call whose
//! problem (shapes and strides) reaches past them, or a null or misaligned pointer, is refused
//! before any executor reads it.

use std::sync::{Arc, LazyLock, OnceLock, RwLock};

use attn_policy_adapters::{
    AttentionProblem, Availability, DType, DeviceBackwardArgs, DeviceForwardArgs, DeviceIo,
    DiagonalAlignment, Direction, ExecError, Executor, MaskKind, MaskSpec, Plan, Registry, SeqLens,
    SeqPacking, SoftmaxKind, StreamLaunch, Strides, TensorLayouts,
};
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

create_exception!(
    _native,
    ExecutorRefused,
    PyRuntimeError,
    "The executor does not run this problem (a capability gap); the message is its reason."
);
create_exception!(
    _native,
    ExecutorUnavailable,
    PyRuntimeError,
    "The executor cannot run in this process (no GPU, feature off, library missing)."
);
create_exception!(
    _native,
    InvalidInput,
    crate::PolicyError,
    "The tensors do not describe one attention call (a wrong type, rank, dtype or device, sizes \
     that disagree, a zero-sized dim, strides outside the storage): refused before any kernel \
     reads them. A `PolicyError` (so a `ValueError`)."
);
create_exception!(
    _native,
    ExecutorFailed,
    PyRuntimeError,
    "A library call of the executor failed."
);

static REGISTRY: LazyLock<RwLock<Registry>> = LazyLock::new(|| RwLock::new(Registry::builtin()));

fn registry() -> std::sync::RwLockReadGuard<'static, Registry> {
    REGISTRY.read().unwrap_or_else(|e| e.into_inner())
}

/// The executor catalogue packs are loaded with (names and manifests of every executor of the
/// registry, the Python host's included), built once.
pub fn catalogue() -> Arc<attn_policy::ExecutorCatalogue> {
    static CATALOGUE: LazyLock<Arc<attn_policy::ExecutorCatalogue>> =
        LazyLock::new(|| Arc::new(attn_policy_adapters::catalogue::of(&registry())));
    CATALOGUE.clone()
}

fn exec_err(e: ExecError) -> PyErr {
    match e {
        ExecError::Unsupported { reason } => ExecutorRefused::new_err(reason),
        ExecError::NoDevice { reason } => ExecutorUnavailable::new_err(reason),
        ExecError::Unavailable { reason, .. } => ExecutorUnavailable::new_err(reason),
        ExecError::InvalidInput { reason } => InvalidInput::new_err(reason),
        ExecError::UnknownExecutor { name, known } => {
            PyValueError::new_err(format!("unknown executor '{name}' (known: {known})"))
        }
        other => ExecutorFailed::new_err(other.to_string()),
    }
}

fn to_py(py: Python<'_>, v: &serde_json::Value) -> PyResult<Py<PyAny>> {
    pythonize::pythonize(py, v)
        .map(|o| o.unbind())
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

fn dtype_of(name: &str) -> PyResult<DType> {
    Ok(match name {
        "float16" | "fp16" => DType::F16,
        "bfloat16" | "bf16" => DType::BF16,
        "float32" | "fp32" => DType::F32,
        "float64" | "fp64" => DType::F64,
        other => {
            return Err(InvalidInput::new_err(format!(
                "dtype {other} cannot be executed (float16, bfloat16, float32, float64)"
            )));
        }
    })
}

/// One attention call without its data, built from tensor shapes and element strides.
#[pyclass(frozen, module = "attn_policy._native")]
pub struct NativeProblem {
    p: AttentionProblem,
}

/// Strides `(batch, head, seq)` in elements.
type S3 = (usize, usize, usize);

/// Per-sequence lengths as Python passes them: `(packing, q lengths, kv lengths)`.
type PySeqLens = (String, Vec<usize>, Vec<usize>);

/// Builds a problem. `dims` = (b, h_q, h_kv, s_q, s_kv, d_qk, d_v); `strides` = Q, K, V, O
/// strides `(batch, head, seq)` in elements (head dim contiguous); `mask` 0 no mask, 1 causal
/// top-left, 2 causal bottom-right; a window `(left, right)` with -1 unbounded, around the
/// top-left or bottom-right diagonal.
///
/// The features (keywords, all optional; their defaults are plain softmax attention over full
/// sequences, so callers that pass none get today's problem):
/// - `softcap`: logit soft-capping, `None` or a finite positive `c`: scores become
///   `c * tanh(scale * q.k / c)` before mask and softmax (Gemma 2's `attn_logit_softcapping`).
/// - `softmax`: TransformerEngine's `softmax_type`: `"vanilla"` (default), `"off-by-one"`
///   (a sink logit 0 per head) or `"learnable"` (a sink logit per query head: the plan's
///   `forward` / `backward` then need the `sink` pointer, an fp32 `[h_q]` contiguous tensor,
///   and the backward writes its gradient to `d_sink`, fp32 `[h_q]`). The LSE includes the
///   sink term; a row with no admissible key stays empty (O = 0, LSE = -inf).
/// - `seqlens`: `None` (every sequence has `s_q` queries and `s_kv` keys) or
///   `(packing, q_lens, kv_lens)` with `packing` one of `"padded_right"` (each sequence's
///   tokens first in its padded row of the batch), `"padded_left"` (padding first, tokens
///   last: batched generation) or `"packed"` (THD: the sequences one after another along one
///   token dimension, `cu_seqlens` = prefix sums of the lengths), and `b` lengths each.
///   Padded: the tensors are `[b, s_q (s_kv), h, d]`-like as without `seqlens`, `s_q` / `s_kv`
///   their padded lengths (each length at most that). Packed: `b` is the number of sequences,
///   `s_q` / `s_kv` the longest sequence (`max_seqlen`, at least every length), the tensors
///   hold `sum(q_lens)` (`sum(kv_lens)`) tokens along their sequence dimension, and the batch
///   strides are ignored (set to 0: one packed batch). The mask applies per sequence in its
///   own coordinates (a bottom-right diagonal at `kv_len - q_len` of each sequence). The LSE
///   is `[b, h_q, s_q]` padded (`[1, h_q, sum(q_lens)]` packed), contiguous; padding rows get
///   O = 0, LSE = -inf, dQ = 0, padding keys dK = dV = 0.
#[pyfunction]
#[pyo3(signature = (dtype, dims, strides, mask, window_left, window_right, bottom_right, scale, deterministic, softcap=None, softmax="vanilla", seqlens=None))]
#[allow(clippy::too_many_arguments)]
pub fn make_problem(
    dtype: &str,
    dims: (usize, usize, usize, usize, usize, usize, usize),
    strides: (S3, S3, S3, S3),
    mask: u8,
    window_left: i64,
    window_right: i64,
    bottom_right: bool,
    scale: f64,
    deterministic: bool,
    softcap: Option<f64>,
    softmax: &str,
    seqlens: Option<PySeqLens>,
) -> PyResult<NativeProblem> {
    let (b, hq, hkv, sq, skv, dqk, dv) = dims;
    let mut p = AttentionProblem::new(b, hq, hkv, sq, skv, dqk, dv, dtype_of(dtype)?);
    p.softcap = softcap;
    p.softmax = softmax_of(softmax)?;
    if let Some((packing, q, kv)) = seqlens {
        p.seqlens = Some(SeqLens::padded(packing_of(&packing)?, q, kv));
    }
    let packed = p.is_packed();
    let st = |(batch, head, seq): S3| Strides {
        // A packed batch is one sequence of all tokens: its batch stride is never used.
        batch: if packed { 0 } else { batch },
        head,
        seq,
    };
    p.layout = TensorLayouts {
        q: st(strides.0),
        k: st(strides.1),
        v: st(strides.2),
        o: st(strides.3),
    };
    let alignment = if bottom_right {
        DiagonalAlignment::BottomRight
    } else {
        DiagonalAlignment::TopLeft
    };
    p.mask = match mask {
        0 => MaskSpec::window(window_left, window_right, alignment),
        1 | 2 => MaskSpec {
            kind: if mask == 1 {
                MaskKind::CausalTopLeft
            } else {
                MaskKind::CausalBottomRight
            },
            window_left,
            window_right: if window_right < 0 { 0 } else { window_right },
            alignment,
        },
        other => {
            return Err(InvalidInput::new_err(format!(
                "mask {other}: 0 (none), 1 (causal top-left) or 2 (causal bottom-right)"
            )));
        }
    };
    p.softmax_scale = scale;
    p.deterministic = deterministic;
    p.validate().map_err(InvalidInput::new_err)?;
    for (name, bytes) in spans(&p) {
        // Sizes and strides come from Python: a span past isize::MAX bytes would overflow the
        // executors' offset arithmetic (no real tensor has one).
        if bytes > isize::MAX as u128 {
            return Err(InvalidInput::new_err(format!(
                "{name}: the sizes and strides reach {bytes} bytes, more than any storage holds"
            )));
        }
    }
    Ok(NativeProblem { p })
}

fn softmax_of(name: &str) -> PyResult<SoftmaxKind> {
    Ok(match name {
        "vanilla" => SoftmaxKind::Vanilla,
        "off-by-one" => SoftmaxKind::OffByOne,
        "learnable" => SoftmaxKind::Learnable,
        other => {
            return Err(InvalidInput::new_err(format!(
                "softmax {other:?}: \"vanilla\", \"off-by-one\" or \"learnable\""
            )));
        }
    })
}

fn packing_of(name: &str) -> PyResult<SeqPacking> {
    Ok(match name {
        "padded_right" => SeqPacking::PaddedRight,
        "padded_left" => SeqPacking::PaddedLeft,
        "packed" => SeqPacking::Packed,
        other => {
            return Err(InvalidInput::new_err(format!(
                "seqlens packing {other:?}: \"padded_right\", \"padded_left\" or \"packed\""
            )));
        }
    })
}

/// Bytes of Q, K, V, O and the LSE the problem reads or writes from each tensor's data
/// pointer (largest offset + 1 element), in u128 so that no product of Python's sizes and
/// strides overflows. dQ, dK, dV take Q, K, V's; dO takes O's.
fn spans(p: &AttentionProblem) -> [(&'static str, u128); 5] {
    let span = |s: Strides, h: usize, sl: usize, d: usize| -> u128 {
        let last = |n: usize, stride: usize| (n.saturating_sub(1) as u128) * stride as u128;
        let elems = last(p.batch_dim(), s.batch) + last(h, s.head) + last(sl, s.seq) + d as u128;
        elems * p.dtype.size_bytes() as u128
    };
    let l = &p.layout;
    let lse_elem: u128 = if p.dtype == DType::F64 { 8 } else { 4 };
    [
        ("q", span(l.q, p.heads_q, p.rows_q(), p.head_dim_qk)),
        ("k", span(l.k, p.heads_kv, p.rows_kv(), p.head_dim_qk)),
        ("v", span(l.v, p.heads_kv, p.rows_kv(), p.head_dim_v)),
        ("o", span(l.o, p.heads_q, p.rows_q(), p.head_dim_v)),
        (
            "lse",
            (p.batch_dim() as u128) * (p.heads_q as u128) * (p.rows_q() as u128) * lse_elem,
        ),
    ]
}

/// The sink pointers of a call (`sink`, and the backward's `d_sink`, `None` for the forward)
/// against the problem's softmax: a learnable sink needs both, fp32 `[h_q]` each with `avail`
/// bytes from the pointer; the other softmaxes take neither (0), so that no call silently runs
/// a vanilla softmax or ignores logits.
fn check_sink_buffers(
    p: &AttentionProblem,
    sink: (u64, u64),
    d_sink: Option<(u64, u64)>,
) -> Result<(), ExecError> {
    let learnable = p.softmax == SoftmaxKind::Learnable;
    let span = (p.heads_q as u128) * 4;
    for (name, (ptr, avail)) in [("sink", Some(sink)), ("d_sink", d_sink)]
        .into_iter()
        .filter_map(|(n, x)| x.map(|x| (n, x)))
    {
        match (learnable, ptr) {
            (true, _) => check_buffer(name, ptr, avail, span, 4).map_err(|e| match ptr {
                0 => ExecError::invalid(format!(
                    "softmax learnable needs {name} (fp32 [h_q = {}]); none given",
                    p.heads_q
                )),
                _ => e,
            })?,
            (false, 0) => {}
            (false, _) => {
                return Err(ExecError::invalid(format!(
                    "{name} given for softmax {}; only learnable takes sink logits",
                    p.softmax.te_name()
                )));
            }
        }
    }
    Ok(())
}

/// Refuses a buffer the problem would read or write past: a null pointer (a meta tensor, a
/// storage freed or resized to 0 bytes), one not aligned to its element, or fewer bytes from
/// the pointer to the end of its storage (`avail`) than the problem's span.
fn check_buffer(name: &str, ptr: u64, avail: u64, span: u128, elem: u64) -> Result<(), ExecError> {
    if ptr == 0 {
        return Err(ExecError::invalid(format!(
            "{name} has no data (a null pointer: a meta tensor, or a storage freed or resized to \
             0 bytes)"
        )));
    }
    if !ptr.is_multiple_of(elem) {
        return Err(ExecError::invalid(format!(
            "{name}'s data pointer {ptr:#x} is not aligned to its {elem}-byte elements"
        )));
    }
    if span > avail as u128 {
        return Err(ExecError::invalid(format!(
            "{name}'s sizes and strides reach {span} bytes from its data pointer, but its storage \
             holds {avail} bytes from there"
        )));
    }
    Ok(())
}

/// Checks the forward's pointers against their storage: Q, K, V, O, LSE.
fn check_forward_buffers(
    p: &AttentionProblem,
    a: &DeviceForwardArgs,
    avail: &[u64; 5],
) -> Result<(), ExecError> {
    let [q, k, v, o, lse] = spans(p);
    let elem = p.dtype.size_bytes() as u64;
    let lse_elem = if p.dtype == DType::F64 { 8 } else { 4 };
    let want = [
        (q, a.q, elem),
        (k, a.k, elem),
        (v, a.v, elem),
        (o, a.o, elem),
        (lse, a.lse, lse_elem),
    ];
    for (i, ((name, span), ptr, e)) in want.into_iter().enumerate() {
        check_buffer(name, ptr, avail[i], span, e)?;
    }
    Ok(())
}

/// As [`check_forward_buffers`] for the backward: Q, K, V, O, dO, LSE, dQ, dK, dV.
fn check_backward_buffers(
    p: &AttentionProblem,
    a: &DeviceBackwardArgs,
    avail: &[u64; 9],
) -> Result<(), ExecError> {
    let [q, k, v, o, lse] = spans(p);
    let elem = p.dtype.size_bytes() as u64;
    let lse_elem = if p.dtype == DType::F64 { 8 } else { 4 };
    let want = [
        ("q", q.1, a.q, elem),
        ("k", k.1, a.k, elem),
        ("v", v.1, a.v, elem),
        ("o", o.1, a.o, elem),
        ("dO", o.1, a.d_o, elem),
        ("lse", lse.1, a.lse, lse_elem),
        ("dQ", q.1, a.dq, elem),
        ("dK", k.1, a.dk, elem),
        ("dV", v.1, a.dv, elem),
    ];
    for (i, (name, span, ptr, e)) in want.into_iter().enumerate() {
        check_buffer(name, ptr, avail[i], span, e)?;
    }
    Ok(())
}

impl NativeProblem {
    /// Wraps a problem built elsewhere (from facts, for the TE drop-in's probes).
    pub fn from_problem(p: AttentionProblem) -> NativeProblem {
        NativeProblem { p }
    }
}

#[pymethods]
impl NativeProblem {
    /// Why the manifest of executor `name` does not admit this problem, or None.
    fn refusal_by_manifest(&self, name: &str) -> PyResult<Option<String>> {
        let m = registry().manifest(name).map_err(exec_err)?;
        Ok(m.admits(&self.p).err().map(|u| u.reason))
    }

    /// The problem as JSON (shapes, strides, mask, scale).
    fn to_json(&self) -> String {
        serde_json::to_string(&self.p).unwrap_or_default()
    }

    fn __repr__(&self) -> String {
        let p = &self.p;
        format!(
            "<Problem b={} h_q={} h_kv={} s_q={} s_kv={} d={}/{} {} mask={}>",
            p.batch,
            p.heads_q,
            p.heads_kv,
            p.seqlen_q,
            p.seqlen_kv,
            p.head_dim_qk,
            p.head_dim_v,
            p.dtype,
            p.mask.kind.rule_name()
        )
    }
}

/// An executor chosen for one problem on one device, with the workspace it needs.
#[pyclass(frozen, module = "attn_policy._native")]
pub struct NativePlan {
    core: Arc<PlanCore>,
}

/// What a plan is, shared with the C++ autograd node (`eager_abi`), which holds its own
/// reference while an autograd graph needs it. Host and CUDA plans alike run through the
/// executor's [`Plan`]s (on the host, the reference's: it runs on the tensors' memory in place).
pub(crate) struct PlanCore {
    ex: Arc<dyn Executor>,
    /// The forward plan, made with the plan (the warm-up).
    forward: Arc<dyn Plan>,
    /// The backward plan, made on first use (the first `workspace_backward` or backward).
    backward: OnceLock<Arc<dyn Plan>>,
    pub(crate) p: AttentionProblem,
    /// CUDA ordinal, None on the host.
    pub(crate) device: Option<usize>,
    pub(crate) ws_forward: u64,
    name: String,
}

/// Makes a plan: executor `name` on CUDA device `device` (None: the tensors are on the CPU)
/// for `problem`, its refusal checked, the forward plan built (the warm-up). `cudnn_version`:
/// the decision's fact, checked against the loaded libcudnn for the `cudnn` executor.
#[pyfunction]
#[pyo3(signature = (name, device, problem, cudnn_version=None))]
pub fn make_plan(
    py: Python<'_>,
    name: &str,
    device: Option<usize>,
    problem: &NativeProblem,
    cudnn_version: Option<(u32, u32, u32)>,
) -> PyResult<NativePlan> {
    let p = problem.p.clone();
    let name_owned = name.to_string();
    py.detach(move || -> Result<NativePlan, ExecError> {
        let reg = registry();
        let manifest = reg.manifest(&name_owned)?;
        let on_host = manifest.device == attn_policy_adapters::DeviceKind::Cpu;
        match (on_host, device) {
            (true, Some(d)) => {
                return Err(ExecError::Unavailable {
                    name: name_owned,
                    reason: format!("runs on the host; the tensors are on cuda:{d}"),
                });
            }
            (false, None) => {
                return Err(ExecError::Unavailable {
                    name: name_owned,
                    reason: "runs on a CUDA device; the tensors are on the CPU".into(),
                });
            }
            _ => {}
        }
        if let Availability::Unavailable { reason } = reg.availability(&name_owned)? {
            return Err(ExecError::Unavailable {
                name: name_owned,
                reason,
            });
        }
        manifest.admits(&p)?;
        let ex = reg.get_on(&name_owned, device.unwrap_or(0))?;
        ex.check(&p)?;
        if name_owned == attn_policy_adapters::cudnn::NAME
            && let (Some(v), Some(d)) = (cudnn_version, device)
        {
            attn_policy_adapters::cudnn::require_version(d, v)?;
        }
        let forward = ex.plan(&p, Direction::Forward)?;
        let ws_forward = if on_host {
            0
        } else {
            forward.workspace_bytes()?
        };
        Ok(NativePlan {
            core: Arc::new(PlanCore {
                ex,
                forward,
                backward: OnceLock::new(),
                p,
                device,
                ws_forward,
                name: name_owned,
            }),
        })
    })
    .map_err(exec_err)
}

impl PlanCore {
    /// The call's launch (a host plan ignores it: it runs before returning).
    fn launch(&self, ws: u64, ws_bytes: u64, stream: u64) -> StreamLaunch {
        StreamLaunch {
            device: self.device.unwrap_or(0),
            stream,
            workspace: ws,
            workspace_bytes: ws_bytes,
        }
    }

    /// The backward plan (made by the first call that needs it, on its thread).
    fn backward_plan(&self) -> Result<&Arc<dyn Plan>, ExecError> {
        if let Some(plan) = self.backward.get() {
            return Ok(plan);
        }
        let plan = self.ex.plan(&self.p, Direction::Backward)?;
        Ok(self.backward.get_or_init(|| plan))
    }

    /// Workspace bytes of the backward (0 on the host). Builds the backward plan for the
    /// calling thread the first time there (cuDNN's plans are per thread).
    pub(crate) fn workspace_backward(&self) -> Result<u64, ExecError> {
        if self.device.is_none() {
            return Ok(0);
        }
        self.backward_plan()?.workspace_bytes()
    }

    /// Forward: on CUDA enqueues on `stream`; on the host computes in place. `avail`: the
    /// bytes each tensor's storage holds from its pointer (Q, K, V, O, LSE; `sink_avail` for
    /// `args.sink`, the fp32 `[h_q]` sink logits of a learnable sink, 0 otherwise); a problem
    /// that reaches past them, or a null or misaligned pointer, is refused before anything
    /// runs.
    ///
    /// # Safety
    /// The pointers are live tensors of the problem's dtype (the LSE fp64 for fp64 problems,
    /// fp32 otherwise) on the plan's device, each with `avail` bytes from it, outputs distinct
    /// from inputs; on CUDA allocated on (or synchronised with) `stream` and kept alive by
    /// torch's allocator until the stream's work completes.
    pub(crate) unsafe fn forward(
        &self,
        args: &DeviceForwardArgs,
        avail: &[u64; 5],
        sink_avail: u64,
        ws: u64,
        ws_bytes: u64,
        stream: u64,
    ) -> Result<(), ExecError> {
        check_forward_buffers(&self.p, args, avail)?;
        check_sink_buffers(&self.p, (args.sink, sink_avail), None)?;
        let launch = self.launch(ws, ws_bytes, stream);
        // SAFETY: the caller's contract (on the host, the reference's plan reads and writes
        // the tensors' memory in place; the LSE is fp64 for fp64 problems).
        unsafe { self.forward.enqueue(&DeviceIo::Forward(*args), &launch) }
    }

    /// Backward; see `forward`. dQ, dK, dV use the strides of Q, K, V; dO those of O. On the
    /// host too it starts from the given O and LSE, like the GPU executors: a context-parallel
    /// step passes the merged O and LSE of the whole softmax. `avail`: as `forward`'s, for Q,
    /// K, V, O, dO, LSE, dQ, dK, dV; `sink_avail` for `args.sink` and `args.d_sink` (the
    /// learnable sink's logits and their gradient, fp32 `[h_q]`, the gradient overwritten).
    ///
    /// # Safety
    /// As `forward`.
    pub(crate) unsafe fn backward(
        &self,
        args: &DeviceBackwardArgs,
        avail: &[u64; 9],
        sink_avail: (u64, u64),
        ws: u64,
        ws_bytes: u64,
        stream: u64,
    ) -> Result<(), ExecError> {
        check_backward_buffers(&self.p, args, avail)?;
        check_sink_buffers(
            &self.p,
            (args.sink, sink_avail.0),
            Some((args.d_sink, sink_avail.1)),
        )?;
        let plan = self.backward_plan()?;
        let launch = self.launch(ws, ws_bytes, stream);
        // SAFETY: the caller's contract (on the host, as `forward`).
        unsafe { plan.enqueue(&DeviceIo::Backward(*args), &launch) }
    }
}

#[pymethods]
impl NativePlan {
    #[getter]
    fn executor(&self) -> &str {
        &self.core.name
    }

    #[getter]
    fn device_description(&self) -> String {
        self.core.ex.device_description()
    }

    /// Workspace bytes of the forward.
    #[getter]
    fn workspace_forward(&self) -> u64 {
        self.core.ws_forward
    }

    /// The plan's address for the C++ autograd node (see `plan_abi`): valid while this object
    /// lives; the node takes its own reference through the ABI's `retain`.
    #[getter]
    fn handle(&self) -> usize {
        Arc::as_ptr(&self.core) as usize
    }

    /// Workspace bytes of the backward (builds the backward plan on the calling thread the
    /// first time: plans are per thread where the library's handles are).
    fn workspace_backward(&self) -> PyResult<u64> {
        self.core.workspace_backward().map_err(exec_err)
    }

    /// Forward. On CUDA: enqueues on `stream` and returns. On the host: computes in place
    /// (GIL released). Pointers are `data_ptr()`s of tensors of the problem's dtype; `avail`
    /// the bytes each one's storage holds from its pointer (`InvalidInput` where the problem
    /// reaches past them). `sink` / `sink_avail`: the `data_ptr()` of the sink logits, an
    /// fp32 contiguous `[h_q]` tensor on the plan's device, and the bytes its storage holds
    /// from there: required for a `softmax="learnable"` problem, 0 (the default) for every
    /// other (`InvalidInput` otherwise).
    #[pyo3(signature = (q, k, v, o, lse, avail, workspace=0, workspace_bytes=0, stream=0, sink=0, sink_avail=0))]
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        py: Python<'_>,
        q: u64,
        k: u64,
        v: u64,
        o: u64,
        lse: u64,
        avail: [u64; 5],
        workspace: u64,
        workspace_bytes: u64,
        stream: u64,
        sink: u64,
        sink_avail: u64,
    ) -> PyResult<()> {
        let args = DeviceForwardArgs {
            q,
            k,
            v,
            o,
            lse,
            sink,
        };
        // SAFETY: the Python caller passes live tensors of the problem's dtype with `avail`
        // bytes from each pointer (see `PlanCore::forward`, which checks the extents).
        let run = || unsafe {
            self.core.forward(
                &args,
                &avail,
                sink_avail,
                workspace,
                workspace_bytes,
                stream,
            )
        };
        if self.core.device.is_none() {
            py.detach(run).map_err(exec_err)
        } else {
            run().map_err(exec_err)
        }
    }

    /// Backward; see `forward`. dQ, dK, dV use the strides of Q, K, V; dO those of O;
    /// `avail` is for Q, K, V, O, dO, LSE, dQ, dK, dV. A `softmax="learnable"` problem also
    /// needs `sink` (the forward's logits, fp32 `[h_q]`) and `d_sink` (an fp32 contiguous
    /// `[h_q]` output, overwritten with the logits' gradient: the sum over the batch), with
    /// the bytes their storages hold in `sink_avail` / `d_sink_avail`; every other problem
    /// takes neither (0, the defaults).
    #[pyo3(signature = (q, k, v, o, d_o, lse, dq, dk, dv, avail, workspace=0, workspace_bytes=0, stream=0, sink=0, d_sink=0, sink_avail=0, d_sink_avail=0))]
    #[allow(clippy::too_many_arguments)]
    fn backward(
        &self,
        py: Python<'_>,
        q: u64,
        k: u64,
        v: u64,
        o: u64,
        d_o: u64,
        lse: u64,
        dq: u64,
        dk: u64,
        dv: u64,
        avail: [u64; 9],
        workspace: u64,
        workspace_bytes: u64,
        stream: u64,
        sink: u64,
        d_sink: u64,
        sink_avail: u64,
        d_sink_avail: u64,
    ) -> PyResult<()> {
        let args = DeviceBackwardArgs {
            q,
            k,
            v,
            o,
            d_o,
            lse,
            dq,
            dk,
            dv,
            sink,
            d_sink,
        };
        // SAFETY: as in `forward`.
        let run = || unsafe {
            self.core.backward(
                &args,
                &avail,
                (sink_avail, d_sink_avail),
                workspace,
                workspace_bytes,
                stream,
            )
        };
        if self.core.device.is_none() {
            py.detach(run).map_err(exec_err)
        } else {
            run().map_err(exec_err)
        }
    }

    fn __repr__(&self) -> String {
        let c = &self.core;
        format!(
            "<Plan {} on {} ws={}>",
            c.name,
            c.device.map_or("cpu".to_string(), |d| format!("cuda:{d}")),
            c.ws_forward
        )
    }
}

/// Every executor the registry knows: name, description, provider, feature, availability
/// (with its reason or detail) and manifest.
#[pyfunction]
pub fn executors(py: Python<'_>) -> PyResult<Py<PyAny>> {
    let list = py.detach(|| registry().describe());
    to_py(
        py,
        &serde_json::to_value(list).map_err(|e| PyValueError::new_err(e.to_string()))?,
    )
}

/// Registers the Python host's answer for a host-provided executor (`torch_flash`, ...).
#[pyfunction]
#[pyo3(signature = (name, available, detail))]
pub fn set_host_availability(name: &str, available: bool, detail: String) -> PyResult<()> {
    let mut reg = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
    let entry = reg.entry(name).map_err(exec_err)?.clone();
    if entry.create.is_some() {
        return Err(PyValueError::new_err(format!(
            "{name} is built in, not provided by the host"
        )));
    }
    let answer = if available {
        Availability::Available { detail }
    } else {
        Availability::Unavailable { reason: detail }
    };
    reg.register_host(&entry.name, &entry.description, entry.manifest, answer);
    Ok(())
}

/// Whether the `cudnn` executor can run here, with what it found (library, version, how it
/// was chosen) or why not.
#[pyfunction]
pub fn cudnn_library() -> (bool, String) {
    match attn_policy_adapters::cudnn::availability() {
        Availability::Available { detail } => (true, detail),
        Availability::Unavailable { reason } => (false, reason),
    }
}

/// Why FROST could not run `problem` in this process, besides the executor's absence from the
/// wheel: the cuDNN frontend / CuTe DSL versions found (`None`: not installed) against FROST's
/// floors, the engine switch, and the gate of the forward (and backward when `training`) for
/// compute capability `cc` (major*10+minor; None on the host). Empty: nothing else declines.
#[pyfunction]
#[pyo3(signature = (problem, training, cc, frontend_version, cutlass_dsl_version, engines_enabled))]
pub fn frost_reasons(
    problem: &NativeProblem,
    training: bool,
    cc: Option<u32>,
    frontend_version: Option<String>,
    cutlass_dsl_version: Option<String>,
    engines_enabled: bool,
) -> Vec<String> {
    use attn_policy_adapters::frost;
    let env = frost::FrostEnv {
        frontend: frost::VersionProbe {
            dist: frost::FRONTEND_DIST,
            raw: frontend_version,
        },
        cutlass_dsl: frost::VersionProbe {
            dist: frost::CUTLASS_DSL_DIST,
            raw: cutlass_dsl_version,
        },
        engines_enabled,
        python: String::new(),
    };
    let mut reasons = env.decline_reasons();
    let dirs: &[Direction] = if training {
        &[Direction::Forward, Direction::Backward]
    } else {
        &[Direction::Forward]
    };
    for &dir in dirs {
        if let Err(u) = frost::check(&problem.p, dir, cc)
            && !reasons.contains(&u.reason)
        {
            reasons.push(u.reason);
        }
    }
    reasons
}

/// Registers the classes and functions on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<NativeProblem>()?;
    m.add_class::<NativePlan>()?;
    m.add("ExecutorRefused", py.get_type::<ExecutorRefused>())?;
    m.add("ExecutorUnavailable", py.get_type::<ExecutorUnavailable>())?;
    m.add("ExecutorFailed", py.get_type::<ExecutorFailed>())?;
    m.add("InvalidInput", py.get_type::<InvalidInput>())?;
    m.add_function(wrap_pyfunction!(make_problem, m)?)?;
    m.add_function(wrap_pyfunction!(make_plan, m)?)?;
    m.add_function(wrap_pyfunction!(executors, m)?)?;
    m.add_function(wrap_pyfunction!(set_host_availability, m)?)?;
    m.add_function(wrap_pyfunction!(cudnn_library, m)?)?;
    m.add_function(wrap_pyfunction!(frost_reasons, m)?)?;
    Ok(())
}
