//! The chunked executor on CUDA: cuBLAS strided-batched GEMMs + NVRTC kernels (`kernels.cu`).

use super::plan::{
    self, BwdArgs, BwdScoresArgs, CastArgs, CublasGemm, Elem, FillF32Args, Ops, PlanKind,
    RowDotArgs, ScoreKernel, SinkArg, SinkGradArgs, SoftmaxArgs, ZeroRowsArgs,
};
use super::{ChunkedConfig, NAME};
use crate::device::{Availability, cuda_devices};
use crate::executor::{
    BackwardInputs, BackwardOutput, DeviceBackwardArgs, DeviceForwardArgs, DeviceIo, Direction,
    ExecError, ExecStats, Executor, ForwardInputs, ForwardOutput, HostIo, HostOutput, HostTensor,
    Manifest, Plan as ExecPlan, StreamLaunch, Unsupported, direction_mismatch,
    validate_backward_inputs, validate_forward_inputs,
};
use crate::problem::{AttentionProblem, DType, EffectiveMask};
use cudarc::cublas::{result as blas_result, sys as blas_sys};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError, LaunchConfig,
    result as drv_result, sys as drv_sys,
};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// The kernel source after the prelude shared with the other NVRTC executor.
const SRC: &str = concat!(
    include_str!("../nvrtc_prelude.cu"),
    include_str!("kernels.cu")
);

/// Kernel parameters as the driver wants them: pointers to each argument's value.
macro_rules! params {
    ($($x:expr),* $(,)?) => {
        [$((&$x) as *const _ as *mut c_void),*]
    };
}

fn drv(e: DriverError) -> ExecError {
    ExecError::Backend {
        library: "cuda",
        message: format!("{e:?}"),
    }
}

fn blas_err(e: cudarc::cublas::result::CublasError) -> ExecError {
    ExecError::Backend {
        library: "cublas",
        message: format!("{e:?}"),
    }
}

struct Kernels {
    softmax: CudaFunction,
    bwd: CudaFunction,
    row_dot: CudaFunction,
    cast: CudaFunction,
    zero: CudaFunction,
    fill: CudaFunction,
    normal: CudaFunction,
    sink_grad: CudaFunction,
}

impl Kernels {
    fn load(ctx: &Arc<CudaContext>, arch: &'static str, bf16: bool) -> Result<Kernels, ExecError> {
        let src = format!("#define LOWP_BF16 {}\n{SRC}", u8::from(bf16));
        let opts = CompileOptions {
            arch: Some(arch),
            name: Some(format!("chunked_{}.cu", if bf16 { "bf16" } else { "f16" })),
            ..Default::default()
        };
        let ptx = compile_ptx_with_opts(src, opts).map_err(|e| ExecError::Backend {
            library: "nvrtc",
            message: format!("{e:?}"),
        })?;
        let m = ctx.load_module(ptx).map_err(drv)?;
        let f = |n: &str| m.load_function(n).map_err(drv);
        Ok(Kernels {
            softmax: f("softmax_fwd")?,
            bwd: f("bwd_elementwise")?,
            row_dot: f("row_dot")?,
            cast: f("cast_rows")?,
            zero: f("zero_rows")?,
            fill: f("fill_f32")?,
            normal: f("fill_normal")?,
            sink_grad: f("sink_grad")?,
        })
    }
}

/// Run-time probe: a CUDA device, cuBLAS and NVRTC loadable.
pub fn availability() -> Availability {
    let n = match cuda_devices() {
        Ok(n) => n,
        Err(why) => return Availability::unavailable(why),
    };
    // SAFETY: dlopen probes only.
    let libs = unsafe {
        [
            ("cuBLAS", blas_sys::is_culib_present()),
            ("NVRTC", cudarc::nvrtc::sys::is_culib_present()),
        ]
    };
    if let Some((lib, _)) = libs.iter().find(|(_, ok)| !ok) {
        return Availability::unavailable(format!("library missing: {lib}"));
    }
    Availability::Available {
        detail: format!("{n} CUDA device(s); cuBLAS and NVRTC found"),
    }
}

/// Compile the kernels for a compute capability (used by a CPU-side compile test too).
pub fn nvrtc_arch(cc: (i32, i32)) -> &'static str {
    match cc {
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        (8, 7) => "sm_87",
        (8, 9) => "sm_89",
        (9, 0) => "sm_90",
        (10, 0) => "sm_100",
        (12, 0) => "sm_120",
        _ => "compute_80",
    }
}

/// cuBLAS workspace each call hands to its handle (`cublasSetWorkspace`), inside the call's
/// workspace: without one cuBLAS allocates its own per stream, which a CUDA graph capture
/// cannot do. 32 MiB is what cuBLAS recommends for Hopper; 4 MiB before it.
fn cublas_workspace_bytes(cc: (i32, i32)) -> u64 {
    if cc.0 >= 9 { 32 << 20 } else { 4 << 20 }
}

/// A cuBLAS handle, destroyed on drop.
struct BlasHandle(blas_sys::cublasHandle_t);

// SAFETY: a cuBLAS handle may be used from any thread as long as one thread uses it at a time;
// the pool hands each handle to one call at a time.
unsafe impl Send for BlasHandle {}

impl Drop for BlasHandle {
    fn drop(&mut self) {
        // SAFETY: created by cublasCreate, destroyed once.
        let _ = unsafe { blas_result::destroy_handle(self.0) };
    }
}

/// The chunked CUDA executor on one device.
pub struct Chunked {
    config: ChunkedConfig,
    ordinal: usize,
    cc: (i32, i32),
    ctx: Arc<CudaContext>,
    /// The executor's own stream (host path and the synchronous device path).
    stream: Arc<CudaStream>,
    /// cuBLAS handles, one per concurrent call: a call takes one (creating it only when every
    /// handle is in use), binds its stream and workspace, and gives it back.
    handles: Mutex<Vec<BlasHandle>>,
    /// Streams for the lanes of a forked plan, one call at a time each.
    aux_streams: Mutex<Vec<Arc<CudaStream>>>,
    bf16: Kernels,
    f16: Kernels,
    desc: String,
    sm_count: u32,
}

/// A device buffer owned by the executor's context (bench and test helper).
pub struct DeviceBuffer {
    slice: CudaSlice<u8>,
    ptr: u64,
}

impl DeviceBuffer {
    /// Raw device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.slice.len()
    }
}

impl Chunked {
    /// Open device 0; see [`Chunked::on_device`].
    pub fn new(config: ChunkedConfig) -> Result<Chunked, ExecError> {
        Chunked::on_device(config, 0)
    }

    /// Open CUDA device `ordinal` (its primary context, the one frameworks use), compile the
    /// kernels, create a cuBLAS handle. Fails with [`ExecError::NoDevice`] when the driver,
    /// cuBLAS or NVRTC cannot be loaded or the device is missing or older than compute
    /// capability 8.0.
    pub fn on_device(config: ChunkedConfig, ordinal: usize) -> Result<Chunked, ExecError> {
        // SAFETY: only probes whether the shared libraries can be loaded.
        let present = unsafe {
            [
                ("libcuda (driver)", drv_sys::is_culib_present()),
                ("cuBLAS", blas_sys::is_culib_present()),
                ("NVRTC", cudarc::nvrtc::sys::is_culib_present()),
            ]
        };
        if let Some((lib, _)) = present.iter().find(|(_, ok)| !ok) {
            return Err(ExecError::NoDevice {
                reason: format!("{lib} library not found"),
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| ExecError::NoDevice {
            reason: format!("no CUDA device {ordinal}: {e:?}"),
        })?;
        let cc = ctx.compute_capability().map_err(drv)?;
        if cc.0 < 8 {
            return Err(ExecError::NoDevice {
                reason: format!("compute capability {}.{} < 8.0", cc.0, cc.1),
            });
        }
        let name = ctx.name().map_err(drv)?;
        let sm_count = ctx
            .attribute(drv_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(drv)? as u32;
        // SAFETY: the executor's own buffers live on its own stream only, so cross-stream
        // tracking is not needed.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv)?;
        ctx.bind_to_thread().map_err(drv)?;
        let first = BlasHandle(blas_result::create_handle().map_err(blas_err)?);
        let arch = nvrtc_arch(cc);
        let bf16 = Kernels::load(&ctx, arch, true)?;
        let f16 = Kernels::load(&ctx, arch, false)?;
        let mut drv_ver = 0i32;
        // SAFETY: writes one int.
        unsafe { drv_sys::cuDriverGetVersion(&mut drv_ver) };
        let desc = format!(
            "{name} (sm_{}{}, {sm_count} SMs), CUDA driver {drv_ver}, cuBLAS + NVRTC ({arch})",
            cc.0, cc.1
        );
        Ok(Chunked {
            config,
            ordinal,
            cc,
            ctx,
            stream,
            handles: Mutex::new(vec![first]),
            aux_streams: Mutex::new(Vec::new()),
            bf16,
            f16,
            desc,
            sm_count,
        })
    }

    /// A cuBLAS handle for one call (from the pool, or a new one when all are in use).
    fn take_handle(&self) -> Result<BlasHandle, ExecError> {
        let pooled = self.handles.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match pooled {
            Some(h) => Ok(h),
            None => {
                self.ctx.bind_to_thread().map_err(drv)?;
                Ok(BlasHandle(blas_result::create_handle().map_err(blas_err)?))
            }
        }
    }

    fn give_handle(&self, h: BlasHandle) {
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(h);
    }

    /// Runs `f` with device operations bound to `stream` and a cuBLAS handle whose workspace is
    /// `[blas_ws, blas_ws + blas_ws_bytes)`.
    fn with_ops<R>(
        &self,
        dtype: DType,
        stream: drv_sys::CUstream,
        blas_ws: u64,
        blas_ws_bytes: u64,
        scorer: Option<&dyn ScoreKernel>,
        f: impl FnOnce(&mut CudaOps<'_>) -> Result<R, ExecError>,
    ) -> Result<R, ExecError> {
        let k = self.kernels(dtype)?;
        self.ctx.bind_to_thread().map_err(drv)?;
        let h = self.take_handle()?;
        // SAFETY: the handle is ours for this call; setting the stream resets the workspace to
        // cuBLAS's default, so the caller's workspace is set after it.
        let bound = unsafe {
            blas_result::set_stream(h.0, stream as _)
                .and_then(|_| {
                    blas_sys::cublasSetWorkspace_v2(
                        h.0,
                        blas_ws as *mut c_void,
                        blas_ws_bytes as usize,
                    )
                    .result()
                })
                .map_err(blas_err)
        };
        let r = bound.and_then(|_| {
            let mut ops = CudaOps {
                ex: self,
                k,
                dtype,
                stream,
                blas: h.0,
                scorer,
                main: stream,
                blas_ws: (blas_ws, blas_ws_bytes),
                aux: Vec::new(),
            };
            let r = f(&mut ops);
            let mut pool = self.aux_streams.lock().unwrap_or_else(|e| e.into_inner());
            pool.append(&mut ops.aux);
            r
        });
        self.give_handle(h);
        r
    }

    /// Bytes of the call's workspace: the plan's buffers, then cuBLAS's workspace.
    /// One cuBLAS workspace per lane of the plan: lanes run GEMMs concurrently.
    fn split_workspace(&self, plan: &plan::Plan) -> (u64, u64) {
        let blas_off = plan.bytes.div_ceil(256) * 256;
        (
            blas_off,
            blas_off + plan.lanes as u64 * cublas_workspace_bytes(self.cc),
        )
    }

    fn check_launch(&self, launch: &StreamLaunch, plan: &plan::Plan) -> Result<u64, ExecError> {
        if launch.device != self.ordinal {
            return Err(ExecError::invalid(format!(
                "the call is on CUDA device {}, this executor on device {}",
                launch.device, self.ordinal
            )));
        }
        let (blas_off, total) = self.split_workspace(plan);
        if launch.workspace_bytes < total || (launch.workspace == 0 && total > 0) {
            return Err(ExecError::invalid(format!(
                "workspace of {} bytes at {:#x}; this call needs {total}",
                launch.workspace_bytes, launch.workspace
            )));
        }
        if !launch.workspace.is_multiple_of(256) {
            return Err(ExecError::invalid(format!(
                "workspace {:#x} is not 256-byte aligned",
                launch.workspace
            )));
        }
        Ok(blas_off)
    }

    /// The host path of a forward, after the caller's checks: uploads Q, K and V, allocates O
    /// (zeroed: padding between rows is never written) and LSE, runs `run` on the device
    /// pointers (synchronously), downloads O and LSE.
    pub(crate) fn forward_on_host(
        &self,
        p: &AttentionProblem,
        inputs: &ForwardInputs<'_>,
        run: impl FnOnce(&DeviceForwardArgs) -> Result<ExecStats, ExecError>,
    ) -> Result<ForwardOutput, ExecError> {
        let q = self.upload(&inputs.q.data[..p.q_span()])?;
        let k = self.upload(&inputs.k.data[..p.k_span()])?;
        let v = self.upload(&inputs.v.data[..p.v_span()])?;
        let o = self.alloc(2 * p.o_span())?;
        self.poison(&o, 0)?;
        let lse = self.alloc(4 * p.lse_len())?;
        let sink = self.upload_sink(p, inputs.sink)?;
        let args = DeviceForwardArgs {
            q: q.ptr,
            k: k.ptr,
            v: v.ptr,
            o: o.ptr,
            lse: lse.ptr,
            sink: sink.as_ref().map_or(0, |s| s.ptr),
        };
        let stats = run(&args)?;
        Ok(ForwardOutput {
            o: HostTensor {
                dtype: p.dtype,
                data: self.download_u16(&o, p.o_span())?,
            },
            lse: self.download_f32(&lse, p.lse_len())?,
            stats,
        })
    }

    /// The host path of a backward, after the caller's checks: uploads the inputs, allocates
    /// dQ, dK and dV (zeroed), runs `run` on the device pointers (synchronously), downloads the
    /// gradients.
    pub(crate) fn backward_on_host(
        &self,
        p: &AttentionProblem,
        inputs: &BackwardInputs<'_>,
        run: impl FnOnce(&DeviceBackwardArgs) -> Result<ExecStats, ExecError>,
    ) -> Result<BackwardOutput, ExecError> {
        let q = self.upload(&inputs.q.data[..p.q_span()])?;
        let k = self.upload(&inputs.k.data[..p.k_span()])?;
        let v = self.upload(&inputs.v.data[..p.v_span()])?;
        let o = self.upload(&inputs.o.data[..p.o_span()])?;
        let d_o = self.upload(&inputs.d_o.data[..p.o_span()])?;
        let lse = self.upload_f32(inputs.lse)?;
        let sink = self.upload_sink(p, inputs.sink)?;
        // The sink gradient is overwritten: NaN first shows a missed write.
        let d_sink = match &sink {
            Some(_) => {
                let b = self.alloc(4 * p.sink_len())?;
                self.poison(&b, 0xff)?;
                Some(b)
            }
            None => None,
        };
        let dq = self.alloc(2 * p.q_span())?;
        let dk = self.alloc(2 * p.k_span())?;
        let dv = self.alloc(2 * p.v_span())?;
        for b in [&dq, &dk, &dv] {
            self.poison(b, 0)?;
        }
        let args = DeviceBackwardArgs {
            q: q.ptr,
            k: k.ptr,
            v: v.ptr,
            o: o.ptr,
            d_o: d_o.ptr,
            lse: lse.ptr,
            dq: dq.ptr,
            dk: dk.ptr,
            dv: dv.ptr,
            sink: sink.as_ref().map_or(0, |s| s.ptr),
            d_sink: d_sink.as_ref().map_or(0, |s| s.ptr),
        };
        let stats = run(&args)?;
        Ok(BackwardOutput {
            dq: HostTensor {
                dtype: p.dtype,
                data: self.download_u16(&dq, p.q_span())?,
            },
            dk: HostTensor {
                dtype: p.dtype,
                data: self.download_u16(&dk, p.k_span())?,
            },
            dv: HostTensor {
                dtype: p.dtype,
                data: self.download_u16(&dv, p.v_span())?,
            },
            stats,
            d_sink: match &d_sink {
                Some(b) => self.download_f32(b, p.sink_len())?,
                None => Vec::new(),
            },
        })
    }

    /// fp32 values to the device (as pairs of 16-bit halves, little-endian).
    pub fn upload_f32(&self, x: &[f32]) -> Result<DeviceBuffer, ExecError> {
        let bits: Vec<u16> = x
            .iter()
            .flat_map(|x| [x.to_bits() as u16, (x.to_bits() >> 16) as u16])
            .collect();
        self.upload(&bits)
    }

    /// The sink logits of a learnable-sink problem on the device (`None` for other problems);
    /// a learnable problem without `h_q` logits is invalid input, never a vanilla softmax.
    fn upload_sink(
        &self,
        p: &AttentionProblem,
        sink: Option<&[f32]>,
    ) -> Result<Option<DeviceBuffer>, ExecError> {
        if p.sink_len() == 0 {
            return Ok(None);
        }
        match sink {
            Some(s) if s.len() == p.sink_len() => self.upload_f32(s).map(Some),
            Some(s) => Err(ExecError::invalid(format!(
                "sink has {} logits, a learnable sink needs h_q = {}",
                s.len(),
                p.sink_len()
            ))),
            None => Err(ExecError::invalid(
                "a learnable sink needs its logits (inputs.sink)",
            )),
        }
    }

    /// Streaming multiprocessors of the device.
    pub(crate) fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// The configuration in use.
    pub fn config(&self) -> &ChunkedConfig {
        &self.config
    }

    /// Workspace bytes of a stream-path call of `p` in direction `dir` (the chunked plan's
    /// buffers, then cuBLAS's workspace): what its plan's [`crate::Plan::workspace_bytes`] says.
    pub fn workspace_for(&self, p: &AttentionProblem, dir: Direction) -> Result<u64, ExecError> {
        super::check_problem(p)?;
        let pl = plan::make_plan(p, &self.config, PlanKind::of(dir == Direction::Backward))?;
        Ok(self.split_workspace(&pl).1)
    }

    /// Workspace bytes of the chunked plan alone for a forward (`backward = false`) or
    /// backward call of `p` (the stream path adds cuBLAS's workspace, see
    /// [`Chunked::workspace_for`]).
    pub fn plan_bytes(&self, p: &AttentionProblem, backward: bool) -> Result<u64, ExecError> {
        Ok(plan::make_plan(p, &self.config, PlanKind::of(backward))?.bytes)
    }

    /// Allocate `bytes` of uninitialised device memory.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, ExecError> {
        // SAFETY: callers write before reading (uninitialised memory is never returned to
        // safe code as values).
        let slice = unsafe { self.stream.alloc::<u8>(bytes.max(16)) }.map_err(drv)?;
        let ptr = {
            let (p, _g) = slice.device_ptr(&self.stream);
            p
        };
        Ok(DeviceBuffer { slice, ptr })
    }

    /// Allocate `len` elements of `dtype` filled with standard-normal values drawn on the device
    /// from `seed` (counter-based: reproducible).
    pub fn random(&self, dtype: DType, len: usize, seed: u64) -> Result<DeviceBuffer, ExecError> {
        let buf = self.alloc(2 * len)?;
        let k = self.kernels(dtype)?;
        let n = len as i64;
        let cfg = self.grid_stride(len);
        // SAFETY: kernel writes len u16 into a buffer of 2*len bytes.
        unsafe {
            launch(
                &k.normal,
                cfg,
                self.stream.cu_stream(),
                &mut params![buf.ptr, n, seed],
            )
        }?;
        self.stream.synchronize().map_err(drv)?;
        Ok(buf)
    }

    /// Upload host 16-bit data.
    pub fn upload(&self, data: &[u16]) -> Result<DeviceBuffer, ExecError> {
        let buf = self.alloc(2 * data.len())?;
        // SAFETY: the buffer holds 2*len bytes; the copy is synchronous on our stream.
        unsafe {
            drv_sys::cuMemcpyHtoDAsync_v2(
                buf.ptr,
                data.as_ptr() as *const _,
                2 * data.len(),
                self.stream.cu_stream(),
            )
            .result()
            .map_err(drv)?;
        }
        self.stream.synchronize().map_err(drv)?;
        Ok(buf)
    }

    /// Download `len` 16-bit elements.
    pub fn download_u16(&self, buf: &DeviceBuffer, len: usize) -> Result<Vec<u16>, ExecError> {
        if 2 * len > buf.bytes() {
            return Err(ExecError::invalid("download longer than the buffer"));
        }
        let mut out = vec![0u16; len];
        // SAFETY: sizes checked above.
        unsafe {
            drv_sys::cuMemcpyDtoHAsync_v2(
                out.as_mut_ptr() as *mut _,
                buf.ptr,
                2 * len,
                self.stream.cu_stream(),
            )
            .result()
            .map_err(drv)?;
        }
        self.stream.synchronize().map_err(drv)?;
        Ok(out)
    }

    /// Download `len` f32 elements.
    pub fn download_f32(&self, buf: &DeviceBuffer, len: usize) -> Result<Vec<f32>, ExecError> {
        let raw = self.download_u16(buf, 2 * len)?;
        Ok(raw
            .chunks_exact(2)
            .map(|c| f32::from_bits(c[0] as u32 | ((c[1] as u32) << 16)))
            .collect())
    }

    /// Fill a buffer with a byte pattern (used to poison outputs before a run).
    pub fn poison(&self, buf: &DeviceBuffer, byte: u8) -> Result<(), ExecError> {
        // SAFETY: the whole buffer is ours.
        unsafe {
            drv_sys::cuMemsetD8Async(buf.ptr, byte, buf.bytes(), self.stream.cu_stream())
                .result()
                .map_err(drv)?;
        }
        self.stream.synchronize().map_err(drv)
    }

    /// Measure this device's cuBLAS rate for an `n x n x n` GEMM on random data (the ceiling the
    /// benches report against): 3 warm-ups, then the mean of 10 timed products.
    pub fn probe_gemm_tflops(&self, dtype: DType, n: usize) -> Result<f64, ExecError> {
        let a = self.random(dtype, n * n, 1)?;
        let b = self.random(dtype, n * n, 2)?;
        let c = self.alloc(2 * n * n)?;
        let g = CublasGemm {
            trans_a: false,
            trans_b: false,
            m: n,
            n,
            k: n,
            a: a.ptr,
            lda: n,
            stride_a: 0,
            b: b.ptr,
            ldb: n,
            stride_b: 0,
            c: c.ptr,
            ldc: n,
            stride_c: 0,
            c_elem: Elem::Low,
            alpha: 1.0,
            beta: 0.0,
            batch: 1,
        };
        let ws = self.alloc(cublas_workspace_bytes(self.cc) as usize)?;
        let cu = self.stream.cu_stream();
        let ms = self.with_ops(dtype, cu, ws.ptr, ws.bytes() as u64, None, |ops| {
            for _ in 0..3 {
                ops.gemm(&g)?;
            }
            self.timed(|| (0..10).try_for_each(|_| ops.gemm(&g)))
        })?;
        Ok(2.0 * (n as f64).powi(3) / (ms / 10.0 * 1e-3) / 1e12)
    }

    fn kernels(&self, dtype: DType) -> Result<&Kernels, ExecError> {
        match dtype {
            DType::BF16 => Ok(&self.bf16),
            DType::F16 => Ok(&self.f16),
            DType::F32 | DType::F64 => Err(ExecError::Unsupported {
                reason: format!("dtype {dtype} not supported"),
            }),
        }
    }

    fn grid_stride(&self, n: usize) -> LaunchConfig {
        let blocks = n.div_ceil(256).clamp(1, self.sm_count as usize * 16) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Refuses null device pointers and ones not 16-byte aligned (vector loads, TMA).
    pub(crate) fn check_ptrs(ptrs: &[(&str, u64)]) -> Result<(), ExecError> {
        for (name, p) in ptrs {
            if *p == 0 || p % 16 != 0 {
                return Err(ExecError::invalid(format!(
                    "{name} pointer {p:#x} is null or not 16-byte aligned"
                )));
            }
        }
        Ok(())
    }

    /// The executor's CUDA context (the device's primary context).
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The executor's own stream, as a raw `CUstream` value.
    pub(crate) fn own_stream(&self) -> u64 {
        self.stream.cu_stream() as u64
    }

    /// Run `f` (work enqueued on the executor's own stream) between two timing events; returns
    /// milliseconds.
    pub(crate) fn timed(
        &self,
        f: impl FnOnce() -> Result<(), ExecError>,
    ) -> Result<f64, ExecError> {
        let flags = Some(drv_sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.ctx.new_event(flags).map_err(drv)?;
        let end = self.ctx.new_event(flags).map_err(drv)?;
        start.record(&self.stream).map_err(drv)?;
        f()?;
        end.record(&self.stream).map_err(drv)?;
        end.synchronize().map_err(drv)?;
        Ok(start.elapsed_ms(&end).map_err(drv)? as f64)
    }

    /// Workspace bytes of a backward whose P and dS come from a score kernel (the fused
    /// executor's): the plan without fp32 score buffers, then cuBLAS's workspace.
    pub(crate) fn fused_scores_workspace_bytes(
        &self,
        p: &AttentionProblem,
    ) -> Result<u64, ExecError> {
        let pl = plan::make_plan(p, &self.config, PlanKind::BackwardFusedScores)?;
        Ok(self.split_workspace(&pl).1)
    }

    /// The backward plan on `launch`; with a `scorer` (the fused executor's score kernel) the
    /// plan is of kind `BackwardFusedScores`. The caller has checked the problem and the
    /// pointers ([`backward_ptrs`]).
    pub(crate) fn enqueue_backward_plan(
        &self,
        p: &AttentionProblem,
        a: &DeviceBackwardArgs,
        launch: &StreamLaunch,
        scorer: Option<&dyn ScoreKernel>,
    ) -> Result<(), ExecError> {
        let kind = if scorer.is_some() {
            PlanKind::BackwardFusedScores
        } else {
            PlanKind::Backward
        };
        let pl = plan::make_plan(p, &self.config, kind)?;
        let blas_off = self.check_launch(launch, &pl)?;
        let ws = launch.workspace;
        let blas_bytes = launch.workspace_bytes - blas_off;
        self.with_ops(
            p.dtype,
            launch.stream as drv_sys::CUstream,
            ws + blas_off,
            blas_bytes,
            scorer,
            |ops| plan::backward(ops, p, &pl, a, ws),
        )
    }

    /// A launch on the executor's own stream with a workspace allocated for `dir`.
    fn own_launch(
        &self,
        p: &AttentionProblem,
        dir: Direction,
    ) -> Result<(DeviceBuffer, StreamLaunch), ExecError> {
        let bytes = self.workspace_for(p, dir)?;
        let ws = self.alloc(bytes as usize)?;
        let launch = StreamLaunch {
            device: self.ordinal,
            stream: self.stream.cu_stream() as u64,
            workspace: ws.ptr,
            workspace_bytes: ws.bytes() as u64,
        };
        Ok((ws, launch))
    }
}

/// A backward call's pointers by name, for [`Chunked::check_ptrs`].
pub(crate) fn backward_ptrs(a: &DeviceBackwardArgs) -> [(&'static str, u64); 9] {
    [
        ("q", a.q),
        ("k", a.k),
        ("v", a.v),
        ("o", a.o),
        ("d_o", a.d_o),
        ("lse", a.lse),
        ("dq", a.dq),
        ("dk", a.dk),
        ("dv", a.dv),
    ]
}

/// Launches `f` on a raw stream.
///
/// # Safety
/// `params` must match the kernel's signature, and every buffer it names must be live.
unsafe fn launch(
    f: &CudaFunction,
    cfg: LaunchConfig,
    stream: drv_sys::CUstream,
    params: &mut [*mut c_void],
) -> Result<(), ExecError> {
    // SAFETY: per the contract.
    unsafe {
        drv_result::launch_kernel(
            f.cu_function(),
            cfg.grid_dim,
            cfg.block_dim,
            cfg.shared_mem_bytes,
            stream,
            params,
        )
    }
    .map_err(drv)
}

/// The device operations on CUDA, bound to one stream and one cuBLAS handle.
struct CudaOps<'a> {
    ex: &'a Chunked,
    k: &'a Kernels,
    dtype: DType,
    stream: drv_sys::CUstream,
    blas: blas_sys::cublasHandle_t,
    /// The fused executor's score kernel, for plans of kind `BackwardFusedScores`.
    scorer: Option<&'a dyn ScoreKernel>,
    /// The caller's stream (lane 0) and its cuBLAS workspace.
    main: drv_sys::CUstream,
    blas_ws: (u64, u64),
    /// Streams of lanes 1.. while forked (from the executor's pool, given back by `with_ops`).
    aux: Vec<Arc<CudaStream>>,
}

impl CudaOps<'_> {
    /// Order everything enqueued on `waiter` from now on after everything enqueued on `on` so
    /// far (an event, released at once: the wait already holds it).
    fn order_after(
        &self,
        waiter: drv_sys::CUstream,
        on: drv_sys::CUstream,
    ) -> Result<(), ExecError> {
        let mut ev: drv_sys::CUevent = std::ptr::null_mut();
        // SAFETY: creates, records, waits on and releases one event of the current context;
        // both streams are live.
        unsafe {
            drv_sys::cuEventCreate(
                &mut ev,
                drv_sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
            )
            .result()
            .map_err(drv)?;
            let r = drv_sys::cuEventRecord(ev, on)
                .result()
                .and_then(|_| drv_sys::cuStreamWaitEvent(waiter, ev, 0).result())
                .map_err(drv);
            drv_sys::cuEventDestroy_v2(ev).result().map_err(drv)?;
            r
        }
    }

    /// Point the following operations (kernels and cuBLAS) at `stream`, with cuBLAS workspace
    /// `[ws, ws + bytes)`.
    fn bind_blas(
        &mut self,
        stream: drv_sys::CUstream,
        ws: u64,
        bytes: u64,
    ) -> Result<(), ExecError> {
        self.stream = stream;
        // SAFETY: the handle is this call's; the workspace slice lies in the call's workspace.
        unsafe {
            blas_result::set_stream(self.blas, stream as _)
                .and_then(|_| {
                    blas_sys::cublasSetWorkspace_v2(self.blas, ws as *mut c_void, bytes as usize)
                        .result()
                })
                .map_err(blas_err)
        }
    }
}

fn mask_args(m: &EffectiveMask) -> (i64, i64, i64, i64) {
    (
        m.offset,
        m.left.unwrap_or(-1),
        m.right.unwrap_or(-1),
        m.seqlen_kv,
    )
}

/// Soft-capping as the kernels take it: `(scale / c, c log2(e))`, `(0, 0)` without.
fn cap_args(scale: f32, softcap: Option<f32>) -> (f32, f32) {
    softcap.map_or((0.0, 0.0), |c| (scale / c, c * std::f32::consts::LOG2_E))
}

fn i32_of(x: usize, what: &str) -> Result<i32, ExecError> {
    i32::try_from(x).map_err(|_| ExecError::Unsupported {
        reason: format!("{what} {x} >= 2^31"),
    })
}

impl Ops for CudaOps<'_> {
    fn gemm(&mut self, g: &CublasGemm) -> Result<(), ExecError> {
        let low = match self.dtype {
            DType::BF16 => blas_sys::cudaDataType::CUDA_R_16BF,
            DType::F16 => blas_sys::cudaDataType::CUDA_R_16F,
            DType::F32 | DType::F64 => {
                return Err(ExecError::Unsupported {
                    reason: format!("dtype {} not supported", self.dtype),
                });
            }
        };
        let c_type = match g.c_elem {
            Elem::Low => low,
            Elem::F32 => blas_sys::cudaDataType::CUDA_R_32F,
        };
        let op = |t: bool| {
            if t {
                blas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let (alpha, beta) = (g.alpha, g.beta);
        // SAFETY: pointers come from the plan over validated spans; alpha/beta are host f32
        // (default host pointer mode) matching CUBLAS_COMPUTE_32F.
        unsafe {
            blas_result::gemm_strided_batched_ex(
                self.blas,
                op(g.trans_a),
                op(g.trans_b),
                i32_of(g.m, "gemm m")?,
                i32_of(g.n, "gemm n")?,
                i32_of(g.k, "gemm k")?,
                &alpha as *const f32 as *const _,
                g.a as *const _,
                low,
                i32_of(g.lda, "lda")?,
                g.stride_a as i64,
                g.b as *const _,
                low,
                i32_of(g.ldb, "ldb")?,
                g.stride_b as i64,
                &beta as *const f32 as *const _,
                g.c as *mut _,
                c_type,
                i32_of(g.ldc, "ldc")?,
                g.stride_c as i64,
                i32_of(g.batch, "batch")?,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
            )
        }
        .map_err(blas_err)
    }

    fn softmax_fwd(&mut self, a: &SoftmaxArgs) -> Result<(), ExecError> {
        let (off, left, right, skv) = mask_args(&a.mask);
        let (lds, rows, n) = (a.lds as i32, a.rows as i32, a.n as i32);
        let (i0, kv_lo, lhs) = (a.i0 as i64, a.kv_lo as i64, a.lse_head_stride as i64);
        let scale_log2 = a.scale * std::f32::consts::LOG2_E;
        let (cap_in, cap_out) = cap_args(a.scale, a.softcap);
        let (sink_mode, sink) = match a.sink {
            SinkArg::None => (0i32, 0u64),
            SinkArg::Zero => (1, 0),
            SinkArg::Logits(ptr) => (2, ptr),
        };
        let cfg = LaunchConfig {
            grid_dim: (a.rows as u32, a.heads as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut args = params![
            a.s, a.p, lds, rows, n, i0, kv_lo, a.lse, lhs, off, left, right, skv, scale_log2,
            cap_in, cap_out, sink_mode, sink
        ];
        // SAFETY: argument list matches the kernel signature; buffers sized by the plan.
        unsafe { launch(&self.k.softmax, cfg, self.stream, &mut args) }
    }

    fn bwd_elementwise(&mut self, a: &BwdArgs) -> Result<(), ExecError> {
        let (off, left, right, skv) = mask_args(&a.mask);
        let (lds, rows, n) = (a.lds as i32, a.rows as i32, a.n as i32);
        let (i0, kv_lo, hs) = (a.i0 as i64, a.kv_lo as i64, a.head_stride as i64);
        let scale_log2 = a.scale * std::f32::consts::LOG2_E;
        let (cap_in, cap_out) = cap_args(a.scale, a.softcap);
        let cfg = LaunchConfig {
            grid_dim: (a.rows as u32, a.heads as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut args = params![
            a.s, a.dp, a.p, a.ds, lds, rows, n, i0, kv_lo, a.lse, a.dvec, hs, off, left, right,
            skv, scale_log2, cap_in, cap_out
        ];
        // SAFETY: as above.
        unsafe { launch(&self.k.bwd, cfg, self.stream, &mut args) }
    }

    fn row_dot(&mut self, a: &RowDotArgs) -> Result<(), ExecError> {
        let rows = a.batch * a.heads * a.seqlen;
        let blocks = (rows * 32).div_ceil(256) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (bt, h, s, d) = (
            a.batch as i32,
            a.heads as i32,
            a.seqlen as i32,
            a.dim as i32,
        );
        let (sb, sh, ss) = (a.stride_b as i64, a.stride_h as i64, a.stride_s as i64);
        let mut args = params![a.o, a.d_o, a.out, bt, h, s, d, sb, sh, ss];
        // SAFETY: as above.
        unsafe { launch(&self.k.row_dot, cfg, self.stream, &mut args) }
    }

    fn cast_rows(&mut self, a: &CastArgs) -> Result<(), ExecError> {
        let cfg = self.ex.grid_stride(a.rows * a.cols);
        let (ld, rows, cols) = (a.dst_ld as i64, a.rows as i32, a.cols as i32);
        let mut args = params![a.src, a.dst, ld, rows, cols];
        // SAFETY: as above.
        unsafe { launch(&self.k.cast, cfg, self.stream, &mut args) }
    }

    fn zero_rows(&mut self, a: &ZeroRowsArgs) -> Result<(), ExecError> {
        let cfg = self.ex.grid_stride(a.rows * a.cols * a.heads);
        let (rs, hs) = (a.row_stride as i64, a.head_stride as i64);
        let (rows, heads, cols) = (a.rows as i32, a.heads as i32, a.cols as i32);
        let mut args = params![a.dst, rs, hs, rows, heads, cols];
        // SAFETY: as above.
        unsafe { launch(&self.k.zero, cfg, self.stream, &mut args) }
    }

    fn fill_f32(&mut self, a: &FillF32Args) -> Result<(), ExecError> {
        let cfg = self.ex.grid_stride(a.rows * a.cols);
        let (ld, rows, cols) = (a.ld as i64, a.rows as i32, a.cols as i64);
        let mut args = params![a.dst, ld, rows, cols, a.value];
        // SAFETY: as above.
        unsafe { launch(&self.k.fill, cfg, self.stream, &mut args) }
    }

    fn sink_grad(&mut self, a: &SinkGradArgs) -> Result<(), ExecError> {
        let cfg = LaunchConfig {
            grid_dim: (a.heads as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (batch, heads) = (i32_of(a.batch, "batch")?, i32_of(a.heads, "heads")?);
        let rows = a.rows as i64;
        let mut args = params![a.lse, a.dvec, a.sink, a.d_sink, batch, heads, rows];
        // SAFETY: as above; LSE and D hold batch x heads x rows floats, sink and d_sink heads.
        unsafe { launch(&self.k.sink_grad, cfg, self.stream, &mut args) }
    }

    fn fork(&mut self, lanes: usize) -> Result<(), ExecError> {
        if lanes <= 1 {
            return Ok(());
        }
        let per = cublas_workspace_bytes(self.ex.cc);
        if (lanes as u64) * per > self.blas_ws.1 {
            return Err(ExecError::invalid(format!(
                "{lanes} lanes need {} bytes of cuBLAS workspace, the call has {}",
                lanes as u64 * per,
                self.blas_ws.1
            )));
        }
        for _ in 1..lanes {
            let pooled = self
                .ex
                .aux_streams
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop();
            let s = match pooled {
                Some(s) => s,
                None => self.ex.ctx.new_stream().map_err(drv)?,
            };
            self.order_after(s.cu_stream(), self.main)?;
            self.aux.push(s);
        }
        Ok(())
    }

    fn lane(&mut self, lane: usize) -> Result<(), ExecError> {
        if self.aux.is_empty() {
            return Ok(());
        }
        let stream = match lane {
            0 => self.main,
            l => self
                .aux
                .get(l - 1)
                .ok_or_else(|| ExecError::invalid(format!("lane {l} was not forked")))?
                .cu_stream(),
        };
        // Each lane's GEMMs get their own slice of the cuBLAS workspace (set after the stream:
        // setting the stream resets it).
        let per = cublas_workspace_bytes(self.ex.cc);
        self.bind_blas(stream, self.blas_ws.0 + lane as u64 * per, per)
    }

    fn join(&mut self) -> Result<(), ExecError> {
        for s in &self.aux {
            self.order_after(self.main, s.cu_stream())?;
        }
        if !self.aux.is_empty() {
            self.bind_blas(self.main, self.blas_ws.0, self.blas_ws.1)?;
        }
        Ok(())
    }

    fn bwd_scores(&mut self, a: &BwdScoresArgs) -> Result<(), ExecError> {
        match self.scorer {
            Some(k) => k.enqueue(self.stream as u64, a),
            None => Err(ExecError::Unsupported {
                reason: "a fused-score backward plan without a score kernel".into(),
            }),
        }
    }
}

/// The executor is a shared handle ([`crate::chunked::create`] registers an `Arc<Chunked>`):
/// its plans keep it alive.
impl Executor for Arc<Chunked> {
    fn name(&self) -> &str {
        NAME
    }

    fn device_description(&self) -> String {
        self.desc.clone()
    }

    fn manifest(&self) -> Manifest {
        super::manifest()
    }

    fn check(&self, p: &AttentionProblem) -> Result<(), Unsupported> {
        super::check_problem(p)
    }

    fn device_ordinal(&self) -> Option<usize> {
        Some(self.ordinal)
    }

    /// Checks the problem and computes the workspace of the chunking (the chunked executor
    /// caches nothing per shape: each call makes its chunking, which is arithmetic).
    fn plan(&self, p: &AttentionProblem, dir: Direction) -> Result<Arc<dyn ExecPlan>, ExecError> {
        let workspace = self.workspace_for(p, dir)?;
        Ok(Arc::new(StreamPlan {
            ex: Arc::clone(self),
            p: p.clone(),
            dir,
            workspace,
        }))
    }
}

impl StreamKernels for Chunked {
    const NAME: &'static str = NAME;

    /// The stream path's forward: checks, then enqueues on `launch.stream`.
    fn enqueue_fwd(
        &self,
        p: &AttentionProblem,
        a: &DeviceForwardArgs,
        launch: &StreamLaunch,
    ) -> Result<(), ExecError> {
        super::check_problem(p)?;
        Self::check_ptrs(&[
            ("q", a.q),
            ("k", a.k),
            ("v", a.v),
            ("o", a.o),
            ("lse", a.lse),
        ])?;
        let pl = plan::make_plan(p, &self.config, PlanKind::Forward)?;
        let blas_off = self.check_launch(launch, &pl)?;
        let ws = launch.workspace;
        let blas_bytes = launch.workspace_bytes - blas_off;
        self.with_ops(
            p.dtype,
            launch.stream as drv_sys::CUstream,
            ws + blas_off,
            blas_bytes,
            None,
            |ops| plan::forward(ops, p, &pl, a, ws),
        )
    }
    /// The stream path's backward.
    fn enqueue_bwd(
        &self,
        p: &AttentionProblem,
        a: &DeviceBackwardArgs,
        launch: &StreamLaunch,
    ) -> Result<(), ExecError> {
        super::check_problem(p)?;
        Self::check_ptrs(&backward_ptrs(a))?;
        self.enqueue_backward_plan(p, a, launch, None)
    }
    fn fwd_impl(
        &self,
        p: &AttentionProblem,
        a: &DeviceForwardArgs,
    ) -> Result<ExecStats, ExecError> {
        super::check_problem(p)?;
        let (_ws, launch) = self.own_launch(p, Direction::Forward)?;
        let ms = self.timed(|| self.enqueue_fwd(p, a, &launch))?;
        let out_bytes = 2 * p.o_span() as u64 + 4 * p.lse_len() as u64;
        Ok(ExecStats {
            compute_ms: ms,
            workspace_bytes: launch.workspace_bytes,
            peak_bytes: Some(out_bytes + launch.workspace_bytes),
        })
    }
    fn bwd_impl(
        &self,
        p: &AttentionProblem,
        a: &DeviceBackwardArgs,
    ) -> Result<ExecStats, ExecError> {
        super::check_problem(p)?;
        let (_ws, launch) = self.own_launch(p, Direction::Backward)?;
        let ms = self.timed(|| self.enqueue_bwd(p, a, &launch))?;
        let out_bytes = 2 * (p.q_span() + p.k_span() + p.v_span()) as u64;
        Ok(ExecStats {
            compute_ms: ms,
            workspace_bytes: launch.workspace_bytes,
            peak_bytes: Some(out_bytes + launch.workspace_bytes),
        })
    }

    fn buffers(&self) -> &Chunked {
        self
    }
}

/// An executor whose kernels run from device pointers on a stream (chunked, fused): their
/// plans are the same dispatch over these entry points, so they share [`StreamPlan`].
pub(crate) trait StreamKernels: Send + Sync + 'static {
    /// Registry name.
    const NAME: &'static str;
    /// Enqueues a forward on the caller's stream (see [`ExecPlan::enqueue`]).
    fn enqueue_fwd(
        &self,
        p: &AttentionProblem,
        a: &DeviceForwardArgs,
        launch: &StreamLaunch,
    ) -> Result<(), ExecError>;
    /// Enqueues a backward on the caller's stream.
    fn enqueue_bwd(
        &self,
        p: &AttentionProblem,
        a: &DeviceBackwardArgs,
        launch: &StreamLaunch,
    ) -> Result<(), ExecError>;
    /// A synchronous forward on device memory (see [`ExecPlan::run_device`]).
    fn fwd_impl(&self, p: &AttentionProblem, a: &DeviceForwardArgs)
    -> Result<ExecStats, ExecError>;
    /// A synchronous backward on device memory.
    fn bwd_impl(
        &self,
        p: &AttentionProblem,
        a: &DeviceBackwardArgs,
    ) -> Result<ExecStats, ExecError>;
    /// The device buffers the host path uploads to and downloads from.
    fn buffers(&self) -> &Chunked;
}

/// A stream executor's plan: the executor, the problem, the direction and its workspace size.
pub(crate) struct StreamPlan<E> {
    pub(crate) ex: Arc<E>,
    pub(crate) p: AttentionProblem,
    pub(crate) dir: Direction,
    pub(crate) workspace: u64,
}

impl<E: StreamKernels> ExecPlan for StreamPlan<E> {
    fn executor(&self) -> &str {
        E::NAME
    }

    fn direction(&self) -> Direction {
        self.dir
    }

    fn workspace_bytes(&self) -> Result<u64, ExecError> {
        Ok(self.workspace)
    }

    unsafe fn enqueue(&self, io: &DeviceIo, launch: &StreamLaunch) -> Result<(), ExecError> {
        match (self.dir, io) {
            (Direction::Forward, DeviceIo::Forward(a)) => self.ex.enqueue_fwd(&self.p, a, launch),
            (Direction::Backward, DeviceIo::Backward(a)) => self.ex.enqueue_bwd(&self.p, a, launch),
            _ => Err(direction_mismatch(self.dir, io.direction())),
        }
    }

    unsafe fn run_device(&self, io: &DeviceIo) -> Result<ExecStats, ExecError> {
        match (self.dir, io) {
            (Direction::Forward, DeviceIo::Forward(a)) => self.ex.fwd_impl(&self.p, a),
            (Direction::Backward, DeviceIo::Backward(a)) => self.ex.bwd_impl(&self.p, a),
            _ => Err(direction_mismatch(self.dir, io.direction())),
        }
    }

    fn run_host(&self, io: HostIo<'_>) -> Result<HostOutput, ExecError> {
        let (ex, p) = (&self.ex, &self.p);
        match (self.dir, io) {
            (Direction::Forward, HostIo::Forward(inputs)) => {
                validate_forward_inputs(p, &inputs)?;
                ex.buffers()
                    .forward_on_host(p, &inputs, |args| ex.fwd_impl(p, args))
                    .map(HostOutput::Forward)
            }
            (Direction::Backward, HostIo::Backward(inputs)) => {
                validate_backward_inputs(p, &inputs)?;
                ex.buffers()
                    .backward_on_host(p, &inputs, |args| ex.bwd_impl(p, args))
                    .map(HostOutput::Backward)
            }
            _ => Err(direction_mismatch(self.dir, io.direction())),
        }
    }
}

/// Compile the kernel source with NVRTC only (no device needed): used by a test that runs
/// wherever the NVRTC library is found.
pub fn compile_kernels_only(arch: &'static str) -> Result<(), ExecError> {
    // SAFETY: probes library presence only.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(ExecError::NoDevice {
            reason: "NVRTC library not found".into(),
        });
    }
    for bf16 in [true, false] {
        let src = format!("#define LOWP_BF16 {}\n{SRC}", u8::from(bf16));
        let opts = CompileOptions {
            arch: Some(arch),
            ..Default::default()
        };
        compile_ptx_with_opts(src, opts).map_err(|e| ExecError::Backend {
            library: "nvrtc",
            message: format!("{e:?}"),
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvrtc_compiles_kernels_for_hopper_and_ampere() {
        for arch in ["sm_90", "sm_80"] {
            match compile_kernels_only(arch) {
                Ok(()) => {}
                Err(ExecError::NoDevice { reason }) => {
                    println!("skipped: {reason} (set LD_LIBRARY_PATH to an NVRTC 13 library)");
                    return;
                }
                Err(e) => panic!("{arch}: {e}"),
            }
        }
    }
}
