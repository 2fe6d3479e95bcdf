//! The `cudnn` executor: FusedAttention through the cuDNN backend graph API.
//!
//! - One cuDNN handle per (thread, device), created with the device's context current; the
//!   caller's stream is bound with `cudnnSetStream` on every call.
//! - A thread-local plan cache (cuDNN handles are not to be shared between threads, and cudarc's
//!   handle is neither Send nor Sync) holding plans and refusals, never buffers.
//! - Workspace (the backward's fp32 scratch plus cuDNN's own): the stream path
//!   ([`crate::Plan::enqueue`]) takes the caller's, sized by [`crate::Plan::workspace_bytes`];
//!   the bench path allocates it per call, stream-ordered (`cuMemAllocAsync`/`cuMemFreeAsync`).
//! - The library is the process's libcudnn ([`super::dl`]): inside PyTorch, the one torch
//!   loaded.
//! - Every plan is checked to be a fused-attention engine before it is cached or run.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::rc::Rc;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use cudarc::cudnn::sys as cudnn_sys;
use cudarc::driver::{
    CudaContext, CudaStream, DevicePtr, DevicePtrMut, result as drv, sys as drv_sys,
};

use crate::executor::{
    BackwardInputs, BackwardOutput, DeviceIo, ExecError, ExecStats, Executor, ForwardInputs,
    ForwardOutput, HostIo, HostOutput, HostTensor, Manifest, Plan as ExecPlan, StreamLaunch,
    Unsupported, direction_mismatch, validate_backward_inputs, validate_forward_inputs,
};
use crate::problem::AttentionProblem;

use super::backend::{self, BuiltPlan, CallError, PlanRefusal};
use super::io::IoPtrs;
use super::varlen::{VarlenCall, VarlenKernels};
use crate::cudnn::cache::{CacheStats, PlanCache, PlanKey};
use crate::cudnn::convert::{self, ProbeAnswer};
use crate::cudnn::engine::EngineInfo;
use crate::cudnn::graph::{self, Binding, GraphKind, IoRole, VarlenScratch};
use crate::cudnn::spec::{Direction, SdpaSpec};
use crate::cudnn::version::CudnnVersion;

/// Typed errors of the cuDNN executor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudnnError {
    /// The executor's gate refuses the problem.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// cuDNN proposes no engine for the graph here.
    #[error("cuDNN {version} proposes no engine for the {graph:?} graph: {detail}")]
    NoEngine {
        /// Runtime version.
        version: CudnnVersion,
        /// Which graph.
        graph: GraphKind,
        /// Heuristics errors, if any.
        detail: String,
    },
    /// A deterministic backward was asked for and every engine cuDNN proposes is marked
    /// NONDETERMINISTIC.
    #[error(
        "cuDNN {version} has no deterministic plan for the {graph:?} graph (engines {engines} are NONDETERMINISTIC)"
    )]
    NoDeterministicPlan {
        /// Runtime version.
        version: CudnnVersion,
        /// Which graph.
        graph: GraphKind,
        /// Refused engine tags.
        engines: String,
    },
    /// Plans built, but none is a fused-attention engine: refused, not run.
    #[error(
        "refused: cuDNN's plan for the {graph:?} graph is not a fused-attention engine ({plans})"
    )]
    NotFusedAttention {
        /// Which graph.
        graph: GraphKind,
        /// The plans seen (tag, finalize mode, kernel).
        plans: String,
    },
    /// Every proposed config failed to finalize.
    #[error("cuDNN {version}: no config of the {graph:?} graph finalized: {detail}")]
    NoPlan {
        /// Runtime version.
        version: CudnnVersion,
        /// Which graph.
        graph: GraphKind,
        /// The errors.
        detail: String,
    },
    /// A cuDNN call failed.
    #[error(transparent)]
    Call(#[from] CallError),
    /// A CUDA driver call failed.
    #[error("CUDA: {0}")]
    Cuda(String),
    /// No usable GPU or cuDNN library.
    #[error("no device: {0}")]
    NoDevice(String),
    /// The decision was made for another cuDNN than the one loaded in this process.
    #[error(
        "refused: the decision assumed cuDNN {decided}, but this process has cuDNN {loaded} loaded ({path})"
    )]
    VersionMismatch {
        /// The decision's `cudnn_version` fact.
        decided: String,
        /// `cudnnGetVersion()` of the loaded library.
        loaded: CudnnVersion,
        /// The loaded library.
        path: String,
    },
}

impl CudnnError {
    /// A capability refusal (the policy may pick another backend), as opposed to a failure.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            CudnnError::Unsupported(_)
                | CudnnError::VersionMismatch { .. }
                | CudnnError::NoEngine { .. }
                | CudnnError::NoDeterministicPlan { .. }
                | CudnnError::NotFusedAttention { .. }
                | CudnnError::NoPlan { .. }
        )
    }
}

impl From<drv::DriverError> for CudnnError {
    fn from(e: drv::DriverError) -> Self {
        CudnnError::Cuda(format!("{e:?}"))
    }
}

impl From<Unsupported> for CudnnError {
    fn from(u: Unsupported) -> Self {
        CudnnError::Unsupported(u.reason)
    }
}

impl From<CudnnError> for ExecError {
    fn from(e: CudnnError) -> Self {
        match e {
            CudnnError::NoDevice(reason) => ExecError::NoDevice { reason },
            CudnnError::Call(c) => ExecError::Backend {
                library: "cudnn",
                message: c.to_string(),
            },
            CudnnError::Cuda(message) => ExecError::Backend {
                library: "cuda",
                message,
            },
            refusal => ExecError::Unsupported {
                reason: refusal.to_string(),
            },
        }
    }
}

/// What one call ran.
#[derive(Clone, Debug)]
pub struct RunReport {
    /// The graph that ran.
    pub graph: GraphKind,
    /// The engine that ran.
    pub engine: Arc<EngineInfo>,
    /// Whether the plan came from the cache.
    pub cache_hit: bool,
    /// Bytes of workspace allocated for the call (scratch + cuDNN's).
    pub workspace_bytes: usize,
    /// Host time of the call (lookup, variant pack, execute, workspace), microseconds.
    pub host_us: f64,
}

enum Slot {
    Io(IoRole),
    Scalar(usize),
    Scratch(usize),
}

struct CachedPlan {
    built: BuiltPlan,
    kind: GraphKind,
    uids: Vec<i64>,
    slots: Vec<Slot>,
    scalars: Vec<u32>,
    scale_slot: Option<usize>,
    scratch: usize,
    /// Per-sequence-length data in the scratch (padding-mask graphs).
    varlen: Option<VarlenScratch>,
    engine: Arc<EngineInfo>,
}

type Entry = Result<Rc<CachedPlan>, CudnnError>;

struct DeviceState {
    handle: cudnn_sys::cudnnHandle_t,
    cache: PlanCache<PlanKey, Entry>,
}

impl Drop for DeviceState {
    fn drop(&mut self) {
        if let Ok(api) = backend::api() {
            // SAFETY: created by cudnnCreate on this thread, destroyed once.
            let _ = unsafe { (api.destroy)(self.handle) };
        }
    }
}

/// A thread's cuDNN states, one per device.
///
/// At process exit `exit()` destroys the main thread's thread-locals after the host has torn
/// its CUDA state down (Python's finalisation: torch, NCCL), and `cudnnDestroy` then crashed
/// inside libcudnn (seen on the H200: the context-parallel and torch GPU suites in one
/// process, a native backtrace through `__call_tls_dtors`). So the exiting main thread's
/// states are leaked, not destroyed: the driver reclaims them with the process. Any other
/// thread that ends destroys its states as usual.
#[derive(Default)]
struct ThreadStates(HashMap<usize, DeviceState>);

impl Drop for ThreadStates {
    fn drop(&mut self) {
        if is_main_thread() {
            std::mem::forget(std::mem::take(&mut self.0));
        }
    }
}

/// Whether the calling thread is the process's main thread (its thread id is the process id;
/// the main thread's thread-locals are destroyed only by `exit()`).
fn is_main_thread() -> bool {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    u32::try_from(tid).is_ok_and(|t| t == std::process::id())
}

thread_local! {
    static STATES: RefCell<ThreadStates> = RefCell::new(ThreadStates::default());
}

/// The cuDNN executor on one device.
pub struct CudnnExecutor {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    ordinal: usize,
    version: CudnnVersion,
    cc: (i32, i32),
    gpu: String,
    native_allowed: bool,
    /// The per-sequence-length kernels, compiled on first use.
    varlen_kernels: OnceLock<Result<VarlenKernels, String>>,
}

/// The runtime cuDNN version of the process's libcudnn (see [`super::dl`]), or why it cannot
/// be read (library missing).
pub fn runtime_version() -> Result<CudnnVersion, CudnnError> {
    let api = super::dl::api().map_err(CudnnError::NoDevice)?;
    // SAFETY: no preconditions.
    Ok(CudnnVersion(unsafe { (api.get_version)() } as u32))
}

/// The loaded libcudnn's path and how it was chosen.
pub fn loaded_library() -> Result<(String, super::dl::Origin), CudnnError> {
    let api = super::dl::api().map_err(CudnnError::NoDevice)?;
    Ok((api.path.clone(), api.origin))
}

fn manifest_cached() -> &'static Manifest {
    static M: OnceLock<Manifest> = OnceLock::new();
    M.get_or_init(convert::manifest)
}

impl CudnnExecutor {
    /// An executor on CUDA device `ordinal`.
    pub fn new(ordinal: usize) -> Result<CudnnExecutor, CudnnError> {
        // SAFETY: tries to dlopen the driver library; no symbols are called.
        if !unsafe { drv_sys::is_culib_present() } {
            return Err(CudnnError::NoDevice(
                "the CUDA driver library (libcuda) is not present".into(),
            ));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| CudnnError::NoDevice(format!("CUDA device {ordinal}: {e:?}")))?;
        let version = runtime_version()?;
        let cc = ctx.compute_capability()?;
        let gpu = ctx.name()?;
        // Keep freed workspace in the device's default pool: per-call stream-ordered workspace
        // then costs a pool lookup, not a fresh mapping, after the first call.
        // SAFETY: plain driver calls on this context's device.
        unsafe {
            ctx.bind_to_thread()?;
            let mut pool: drv_sys::CUmemoryPool = std::ptr::null_mut();
            if drv_sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device())
                == drv_sys::CUresult::CUDA_SUCCESS
            {
                let mut threshold: u64 = u64::MAX;
                let _ = drv_sys::cuMemPoolSetAttribute(
                    pool,
                    drv_sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&mut threshold as *mut u64).cast(),
                );
            }
        }
        let stream = ctx.default_stream();
        let native_allowed = std::env::var("ATTN_POLICY_CUDNN_NATIVE")
            .map(|v| v != "0")
            .unwrap_or(true);
        Ok(CudnnExecutor {
            ctx,
            stream,
            ordinal,
            version,
            cc,
            gpu,
            native_allowed,
            varlen_kernels: OnceLock::new(),
        })
    }

    /// The runtime cuDNN version (`cudnnGetVersion()`).
    pub fn version(&self) -> CudnnVersion {
        self.version
    }

    /// Refuses (naming both) when a decision's `cudnn_version` fact (major, minor, patch) is
    /// not the loaded library's version.
    pub fn require_version(&self, decided: (u32, u32, u32)) -> Result<(), CudnnError> {
        let v = self.version;
        if (v.major(), v.minor(), v.patch()) == decided {
            return Ok(());
        }
        Err(CudnnError::VersionMismatch {
            decided: format!("{}.{}.{}", decided.0, decided.1, decided.2),
            loaded: v,
            path: loaded_library().map(|(p, _)| p).unwrap_or_default(),
        })
    }

    /// CUDA device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
    /// The CUDA context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    /// The executor's own stream (used by the host path and the trait's device path).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    /// Compute capability.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }
    /// Whether the native SDPA op may be tried (env `ATTN_POLICY_CUDNN_NATIVE=0` turns it off).
    pub fn set_native_allowed(&mut self, allowed: bool) {
        self.native_allowed = allowed;
    }

    fn varlen_kernels(&self) -> Result<&VarlenKernels, CudnnError> {
        self.varlen_kernels
            .get_or_init(|| VarlenKernels::load(&self.ctx, self.cc))
            .as_ref()
            .map_err(|e| CudnnError::Cuda(e.clone()))
    }

    /// Plan-cache counters of the calling thread for this device.
    pub fn cache_stats(&self) -> CacheStats {
        STATES.with(|s| {
            s.borrow()
                .0
                .get(&self.ordinal)
                .map(|st| st.cache.stats())
                .unwrap_or_default()
        })
    }

    fn gate(&self, p: &AttentionProblem) -> Result<(), Unsupported> {
        if self.cc.0 < 8 {
            return Err(Unsupported::new(format!(
                "compute capability {}.{} < 8.0",
                self.cc.0, self.cc.1
            )));
        }
        convert::check(p, Some(self.version))
    }

    fn with_state<R>(
        &self,
        f: impl FnOnce(&mut DeviceState) -> Result<R, CudnnError>,
    ) -> Result<R, CudnnError> {
        self.ctx.bind_to_thread()?;
        STATES.with(|states| {
            let mut states = states.borrow_mut();
            let st = match states.0.entry(self.ordinal) {
                std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    let api = backend::api()?;
                    let mut handle: cudnn_sys::cudnnHandle_t = std::ptr::null_mut();
                    // SAFETY: out-pointer to a local; the device's context is current.
                    let st = unsafe { (api.create)(&mut handle) };
                    if st != cudnn_sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
                        return Err(CudnnError::Call(CallError {
                            call: "cudnnCreate".into(),
                            status: format!("{st:?}"),
                            message: String::new(),
                        }));
                    }
                    v.insert(DeviceState {
                        handle,
                        cache: PlanCache::default(),
                    })
                }
            };
            f(st)
        })
    }

    fn build(&self, handle: cudnn_sys::cudnnHandle_t, kind: GraphKind, spec: &SdpaSpec) -> Entry {
        let ir = match kind {
            GraphKind::CompositeFwd => graph::composite_fwd(spec),
            GraphKind::NativeFwd => graph::native_fwd(spec, self.version),
            GraphKind::CompositeBwd => graph::composite_bwd(spec),
        };
        let version = self.version;
        let lowered = backend::lower(&ir, handle).map_err(|e| CudnnError::NoPlan {
            version,
            graph: kind,
            detail: format!("graph not accepted: {e}"),
        })?;
        let built = match backend::build_plan(lowered, handle, spec.deterministic, true)? {
            Ok(b) => b,
            Err(PlanRefusal::NoConfigs(errs)) => {
                return Err(CudnnError::NoEngine {
                    version,
                    graph: kind,
                    detail: errs.join("; "),
                });
            }
            Err(PlanRefusal::NoDeterministic(tags)) => {
                return Err(CudnnError::NoDeterministicPlan {
                    version,
                    graph: kind,
                    engines: tags.join(", "),
                });
            }
            Err(PlanRefusal::NotFused(plans)) => {
                return Err(CudnnError::NotFusedAttention {
                    graph: kind,
                    plans: plans.join("; "),
                });
            }
            Err(PlanRefusal::AllFailed(errs)) => {
                return Err(CudnnError::NoPlan {
                    version,
                    graph: kind,
                    detail: errs.join("; "),
                });
            }
        };
        let mut uids = Vec::new();
        let mut slots = Vec::new();
        let mut scalars = Vec::new();
        let mut scale_slot = None;
        for t in ir.variant_pack() {
            uids.push(t.uid);
            slots.push(match t.binding {
                Binding::Io(r) => Slot::Io(r),
                Binding::Scratch(off) => Slot::Scratch(off),
                Binding::Scale => {
                    scale_slot = Some(scalars.len());
                    scalars.push(0);
                    Slot::Scalar(scalars.len() - 1)
                }
                Binding::ConstF32(v) => {
                    scalars.push(v.to_bits());
                    Slot::Scalar(scalars.len() - 1)
                }
                Binding::ConstI32(v) => {
                    scalars.push(v as u32);
                    Slot::Scalar(scalars.len() - 1)
                }
                Binding::Virtual => unreachable!("variant_pack() holds only non-virtual tensors"),
            });
        }
        let engine = Arc::new(built.engine.clone());
        Ok(Rc::new(CachedPlan {
            built,
            kind,
            uids,
            slots,
            scalars,
            scale_slot,
            scratch: ir.scratch_bytes,
            varlen: ir.varlen,
            engine,
        }))
    }

    fn plan(
        &self,
        st: &mut DeviceState,
        dir: Direction,
        spec: &SdpaSpec,
    ) -> Result<(Rc<CachedPlan>, bool), CudnnError> {
        let kinds = match dir {
            Direction::Forward => {
                convert::forward_candidates(spec, self.version, self.native_allowed)
            }
            Direction::Backward => vec![GraphKind::CompositeBwd],
        };
        let handle = st.handle;
        let mut last = None;
        for kind in kinds {
            let key = PlanKey {
                device: self.ordinal,
                kind,
                spec: *spec,
                version: self.version,
            };
            let (entry, hit) = st.cache.get_or_try_insert_with(key, || {
                Ok::<_, CudnnError>(self.build(handle, kind, spec))
            })?;
            match entry {
                Ok(p) => return Ok((p, hit)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| CudnnError::Unsupported("no graph candidate".into())))
    }

    fn spec_checked(&self, p: &AttentionProblem, dir: Direction) -> Result<SdpaSpec, CudnnError> {
        self.gate(p)?;
        let spec = convert::spec_of(p, dir);
        spec.validate(dir)
            .map_err(|e| CudnnError::Unsupported(e.to_string()))?;
        if let Some(reason) = self.version.unsupported_reason(&spec, dir) {
            return Err(CudnnError::Unsupported(reason));
        }
        Ok(spec)
    }

    /// The engine cuDNN would run for `p` in direction `dir` (builds and caches the plan).
    pub fn plan_info(
        &self,
        p: &AttentionProblem,
        dir: Direction,
    ) -> Result<(GraphKind, Arc<EngineInfo>), CudnnError> {
        let spec = self.spec_checked(p, dir)?;
        self.with_state(|st| {
            let (plan, _) = self.plan(st, dir, &spec)?;
            Ok((plan.kind, plan.engine.clone()))
        })
    }

    /// Can cuDNN build a fused-attention plan for this problem here? (The three-valued probe.)
    pub fn probe(&self, p: &AttentionProblem, dir: Direction) -> ProbeAnswer {
        match self.plan_info(p, dir) {
            Ok((_, engine)) => ProbeAnswer::Yes {
                engine: engine.summary(),
            },
            Err(e) if e.is_refusal() => ProbeAnswer::No {
                reason: e.to_string(),
            },
            Err(e) => ProbeAnswer::Unknown {
                reason: e.to_string(),
            },
        }
    }

    /// Bytes of workspace a call of `p` in direction `dir` needs (the graph's scratch plus
    /// cuDNN's own). Builds and caches the plan on this thread (the warm-up).
    pub fn workspace_for(&self, p: &AttentionProblem, dir: Direction) -> Result<u64, CudnnError> {
        let spec = self.spec_checked(p, dir)?;
        if spec.seqlens.is_some() {
            // compiled and loaded here, in the warm-up, never inside a stream capture
            self.varlen_kernels()?;
        }
        self.with_state(|st| {
            let (plan, _) = self.plan(st, dir, &spec)?;
            Ok(((plan.scratch + plan.built.workspace).max(256)) as u64)
        })
    }

    /// Enqueues one call on `stream` without synchronizing, with a stream-ordered workspace of
    /// its own (benches, stream tests).
    ///
    /// # Safety
    /// The pointers in `io` must be live device allocations on this executor's device covering
    /// the spans of `p`'s strides (LSE: `b*h_q*s_q` floats), outputs not aliasing inputs, and
    /// must stay valid until the work completes on `stream`.
    pub unsafe fn enqueue(
        &self,
        p: &AttentionProblem,
        dir: Direction,
        io: &IoPtrs,
        stream: &CudaStream,
    ) -> Result<RunReport, CudnnError> {
        // SAFETY: forwarded contract.
        unsafe { self.enqueue_raw(p, dir, io, stream.cu_stream() as u64, None) }
    }

    /// Enqueues one call on a raw `CUstream` (a framework's) without synchronizing. With
    /// `workspace = Some((ptr, bytes))` the caller's workspace is used and nothing is
    /// allocated; with `None` a stream-ordered one is allocated and freed on `stream`.
    ///
    /// # Safety
    /// As for [`CudnnExecutor::enqueue`]; the caller's workspace must hold at least
    /// [`CudnnExecutor::workspace_for`] bytes and stay live until the work completes.
    pub unsafe fn enqueue_raw(
        &self,
        p: &AttentionProblem,
        dir: Direction,
        io: &IoPtrs,
        stream: u64,
        workspace: Option<(u64, u64)>,
    ) -> Result<RunReport, CudnnError> {
        let t0 = Instant::now();
        let spec = self.spec_checked(p, dir)?;
        let scale = p.softmax_scale as f32;
        let cu_stream = stream as drv_sys::CUstream;
        self.with_state(|st| {
            let (plan, hit) = self.plan(st, dir, &spec)?;
            let api = backend::api()?;
            // SAFETY: the handle belongs to this thread; the stream to this context.
            let status = unsafe { (api.set_stream)(st.handle, cu_stream as _) };
            if status != cudnn_sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
                return Err(CudnnError::Call(CallError {
                    call: "cudnnSetStream".into(),
                    status: format!("{status:?}"),
                    message: String::new(),
                }));
            }
            let total = (plan.scratch + plan.built.workspace).max(256);
            let (ws, owned) = match workspace {
                Some((ptr, bytes)) => {
                    if (bytes as usize) < total || !ptr.is_multiple_of(256) {
                        return Err(CudnnError::Cuda(format!(
                            "workspace of {bytes} bytes at {ptr:#x}: this call needs {total} bytes, 256-byte aligned"
                        )));
                    }
                    (ptr, false)
                }
                // SAFETY: stream-ordered allocation on the call's stream, freed on it below.
                None => (unsafe { drv::malloc_async(cu_stream, total) }?, true),
            };
            let mut scalars = plan.scalars.clone();
            if let Some(i) = plan.scale_slot {
                scalars[i] = scale.to_bits();
            }
            let ptrs: Vec<*mut c_void> = plan
                .slots
                .iter()
                .map(|s| match s {
                    Slot::Io(r) => io.get(*r) as *mut c_void,
                    Slot::Scalar(i) => (&scalars[*i] as *const u32).cast_mut().cast(),
                    Slot::Scratch(off) => (ws + *off as u64) as *mut c_void,
                })
                .collect();
            let cudnn_ws = (ws + plan.scratch as u64) as *mut c_void;
            let run = || -> Result<(), CudnnError> {
                let varlen = match plan.varlen {
                    Some(vs) => Some(VarlenCall {
                        k: self.varlen_kernels()?,
                        p,
                        vs,
                        ws,
                        stream: cu_stream,
                    }),
                    None => None,
                };
                if let Some(v) = &varlen {
                    // SAFETY: the scratch holds the graph's regions; caller's pointers per the
                    // contract.
                    unsafe { v.before(dir, io) }?;
                }
                // SAFETY: caller's pointers per the contract; scalars live until execute
                // returns.
                unsafe { backend::execute(st.handle, &plan.built, &plan.uids, &ptrs, cudnn_ws) }?;
                if let Some(v) = &varlen {
                    // SAFETY: as above.
                    unsafe { v.after(dir, io) }?;
                }
                Ok(())
            };
            let run = run();
            if owned {
                // SAFETY: freed in stream order after the work that uses it.
                unsafe { drv::free_async(ws, cu_stream) }?;
            }
            run?;
            Ok(RunReport {
                graph: plan.kind,
                engine: plan.engine.clone(),
                cache_hit: hit,
                workspace_bytes: total,
                host_us: t0.elapsed().as_secs_f64() * 1e6,
            })
        })
    }

    /// Runs synchronously on the executor's stream, timing with device events.
    unsafe fn run_timed(
        &self,
        p: &AttentionProblem,
        dir: Direction,
        io: &IoPtrs,
    ) -> Result<(RunReport, f64), CudnnError> {
        let flags = Some(drv_sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.stream.record_event(flags)?;
        // SAFETY: forwarded contract.
        let report = unsafe { self.enqueue(p, dir, io, &self.stream) }?;
        let end = self.stream.record_event(flags)?;
        end.synchronize()?;
        let ms = start.elapsed_ms(&end)? as f64;
        Ok((report, ms))
    }

    fn host_forward(
        &self,
        p: &AttentionProblem,
        inputs: &ForwardInputs<'_>,
    ) -> Result<ForwardOutput, CudnnError> {
        let s = &self.stream;
        let q = s.clone_htod(&inputs.q.data[..p.q_span()])?;
        let k = s.clone_htod(&inputs.k.data[..p.k_span()])?;
        let v = s.clone_htod(&inputs.v.data[..p.v_span()])?;
        let mut o = s.alloc_zeros::<u16>(p.o_span())?;
        let mut lse = s.alloc_zeros::<f32>(p.lse_len())?;
        let (report, ms) = {
            let (qp, _g1) = q.device_ptr(s);
            let (kp, _g2) = k.device_ptr(s);
            let (vp, _g3) = v.device_ptr(s);
            let (op, _g4) = o.device_ptr_mut(s);
            let (lp, _g5) = lse.device_ptr_mut(s);
            let io = IoPtrs {
                q: qp,
                k: kp,
                v: vp,
                o: op,
                lse: lp,
                ..Default::default()
            };
            // SAFETY: freshly allocated buffers of the problem's spans on this device.
            unsafe { self.run_timed(p, Direction::Forward, &io) }?
        };
        let o = s.clone_dtoh(&o)?;
        let lse = s.clone_dtoh(&lse)?;
        Ok(ForwardOutput {
            o: HostTensor {
                dtype: p.dtype,
                data: o,
            },
            lse,
            stats: ExecStats {
                compute_ms: ms,
                workspace_bytes: report.workspace_bytes as u64,
                peak_bytes: Some(
                    (report.workspace_bytes + p.o_span() * 2 + p.lse_len() * 4) as u64,
                ),
            },
        })
    }

    fn host_backward(
        &self,
        p: &AttentionProblem,
        inputs: &BackwardInputs<'_>,
    ) -> Result<BackwardOutput, CudnnError> {
        let s = &self.stream;
        let q = s.clone_htod(&inputs.q.data[..p.q_span()])?;
        let k = s.clone_htod(&inputs.k.data[..p.k_span()])?;
        let v = s.clone_htod(&inputs.v.data[..p.v_span()])?;
        let o = s.clone_htod(&inputs.o.data[..p.o_span()])?;
        let d_o = s.clone_htod(&inputs.d_o.data[..p.o_span()])?;
        let lse = s.clone_htod(inputs.lse)?;
        let mut dq = s.alloc_zeros::<u16>(p.q_span())?;
        let mut dk = s.alloc_zeros::<u16>(p.k_span())?;
        let mut dv = s.alloc_zeros::<u16>(p.v_span())?;
        let (report, ms) = {
            let (qp, _g1) = q.device_ptr(s);
            let (kp, _g2) = k.device_ptr(s);
            let (vp, _g3) = v.device_ptr(s);
            let (op, _g4) = o.device_ptr(s);
            let (dop, _g5) = d_o.device_ptr(s);
            let (lp, _g6) = lse.device_ptr(s);
            let (dqp, _g7) = dq.device_ptr_mut(s);
            let (dkp, _g8) = dk.device_ptr_mut(s);
            let (dvp, _g9) = dv.device_ptr_mut(s);
            let io = IoPtrs {
                q: qp,
                k: kp,
                v: vp,
                o: op,
                lse: lp,
                d_o: dop,
                dq: dqp,
                dk: dkp,
                dv: dvp,
            };
            // SAFETY: freshly allocated buffers of the problem's spans on this device.
            unsafe { self.run_timed(p, Direction::Backward, &io) }?
        };
        let t = |d: Vec<u16>| HostTensor {
            dtype: p.dtype,
            data: d,
        };
        Ok(BackwardOutput {
            dq: t(s.clone_dtoh(&dq)?),
            dk: t(s.clone_dtoh(&dk)?),
            dv: t(s.clone_dtoh(&dv)?),
            stats: ExecStats {
                compute_ms: ms,
                workspace_bytes: report.workspace_bytes as u64,
                peak_bytes: Some(
                    (report.workspace_bytes + (p.q_span() + p.k_span() + p.v_span()) * 2) as u64,
                ),
            },
            d_sink: Vec::new(),
        })
    }
}

/// The executor is a shared handle ([`shared_on`] hands out an `Arc<CudnnExecutor>`): its plans
/// keep it alive.
impl Executor for Arc<CudnnExecutor> {
    fn name(&self) -> &str {
        convert::NAME
    }

    fn device_description(&self) -> String {
        let lib = loaded_library()
            .map(|(p, o)| format!(" ({p}, {})", o.describe()))
            .unwrap_or_default();
        format!(
            "{} (sm_{}{}), cuDNN {}{lib}",
            self.gpu, self.cc.0, self.cc.1, self.version
        )
    }

    fn manifest(&self) -> Manifest {
        manifest_cached().clone()
    }

    fn check(&self, problem: &AttentionProblem) -> Result<(), Unsupported> {
        self.gate(problem)
    }

    fn device_ordinal(&self) -> Option<usize> {
        Some(self.ordinal)
    }

    /// The warm-up: builds and caches the graph's plan on the calling thread
    /// ([`CudnnExecutor::workspace_for`]).
    fn plan(
        &self,
        problem: &AttentionProblem,
        dir: Direction,
    ) -> Result<Arc<dyn ExecPlan>, ExecError> {
        self.workspace_for(problem, dir)?;
        Ok(Arc::new(CudnnPlan {
            ex: Arc::clone(self),
            p: problem.clone(),
            dir,
        }))
    }
}

/// A cuDNN plan: the executor, the problem and the direction. The built graphs live in the
/// executor's per-thread cache (cuDNN handles are per thread), found again by each call.
struct CudnnPlan {
    ex: Arc<CudnnExecutor>,
    p: AttentionProblem,
    dir: Direction,
}

impl CudnnPlan {
    /// The io's pointers, if it is for this plan's direction.
    fn io(&self, io: &DeviceIo) -> Result<IoPtrs, ExecError> {
        match (self.dir, io) {
            (Direction::Forward, DeviceIo::Forward(a)) => Ok(IoPtrs::from(a)),
            (Direction::Backward, DeviceIo::Backward(a)) => Ok(IoPtrs::from(a)),
            _ => Err(direction_mismatch(self.dir, io.direction())),
        }
    }
}

impl ExecPlan for CudnnPlan {
    fn executor(&self) -> &str {
        convert::NAME
    }

    fn direction(&self) -> Direction {
        self.dir
    }

    /// Builds or finds the calling thread's plan ([`CudnnExecutor::workspace_for`]).
    fn workspace_bytes(&self) -> Result<u64, ExecError> {
        Ok(self.ex.workspace_for(&self.p, self.dir)?)
    }

    unsafe fn enqueue(&self, io: &DeviceIo, launch: &StreamLaunch) -> Result<(), ExecError> {
        let ptrs = self.io(io)?;
        self.ex.check_launch(launch)?;
        let ws = Some((launch.workspace, launch.workspace_bytes));
        // SAFETY: forwarded contract (`Plan::enqueue`).
        unsafe {
            self.ex
                .enqueue_raw(&self.p, self.dir, &ptrs, launch.stream, ws)
        }?;
        Ok(())
    }

    unsafe fn run_device(&self, io: &DeviceIo) -> Result<ExecStats, ExecError> {
        let ptrs = self.io(io)?;
        // SAFETY: forwarded contract (`Plan::run_device`).
        let (r, ms) = unsafe { self.ex.run_timed(&self.p, self.dir, &ptrs) }?;
        Ok(ExecStats {
            compute_ms: ms,
            workspace_bytes: r.workspace_bytes as u64,
            peak_bytes: None,
        })
    }

    fn run_host(&self, io: HostIo<'_>) -> Result<HostOutput, ExecError> {
        let p = &self.p;
        match (self.dir, io) {
            (Direction::Forward, HostIo::Forward(inputs)) => {
                validate_forward_inputs(p, &inputs)?;
                Ok(HostOutput::Forward(self.ex.host_forward(p, &inputs)?))
            }
            (Direction::Backward, HostIo::Backward(inputs)) => {
                validate_backward_inputs(p, &inputs)?;
                Ok(HostOutput::Backward(self.ex.host_backward(p, &inputs)?))
            }
            _ => Err(direction_mismatch(self.dir, io.direction())),
        }
    }
}

impl CudnnExecutor {
    fn check_launch(&self, launch: &StreamLaunch) -> Result<(), ExecError> {
        if launch.device != self.ordinal {
            return Err(ExecError::invalid(format!(
                "the call is on CUDA device {}, this executor on device {}",
                launch.device, self.ordinal
            )));
        }
        Ok(())
    }
}

/// The process-wide executor on device 0 (created on first use).
pub fn shared() -> Result<Arc<CudnnExecutor>, CudnnError> {
    shared_on(0)
}

/// The process-wide executor on CUDA device `ordinal` (created on first use; a failure is
/// remembered too, so a missing device is not probed on every call).
pub fn shared_on(ordinal: usize) -> Result<Arc<CudnnExecutor>, CudnnError> {
    type Slot = Result<Arc<CudnnExecutor>, CudnnError>;
    static SHARED: OnceLock<std::sync::Mutex<HashMap<usize, Slot>>> = OnceLock::new();
    let map = SHARED.get_or_init(Default::default);
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    map.entry(ordinal)
        .or_insert_with(|| CudnnExecutor::new(ordinal).map(Arc::new))
        .clone()
}

#[cfg(test)]
mod tests {
    use super::is_main_thread;

    #[test]
    fn threads_other_than_main_are_not_the_main_thread() {
        // The test harness runs each test on a thread of its own, never the main thread.
        assert!(!is_main_thread());
        assert!(!std::thread::spawn(is_main_thread).join().unwrap());
    }
}
