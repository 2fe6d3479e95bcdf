//! The chunked executor on CUDA: cuBLAS strided-batched GEMMs + NVRTC kernels (`kernels.cu`).

use super::plan::{
    self, BwdArgs, CastArgs, CublasGemm, Elem, FillF32Args, Ops, RowDotArgs, SoftmaxArgs,
    ZeroRowsArgs,
};
use super::{ChunkedConfig, NAME};
use crate::executor::{
    BackwardInputs, BackwardOutput, DeviceBackwardArgs, DeviceForwardArgs, ExecError, ExecStats,
    Executor, ForwardInputs, ForwardOutput, HostTensor, Manifest, Unsupported,
    validate_backward_inputs, validate_forward_inputs,
};
use crate::problem::{AttentionProblem, DType, EffectiveMask};
use cudarc::cublas::{CudaBlas, result as blas_result, sys as blas_sys};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError, LaunchConfig,
    PushKernelArg, sys as drv_sys,
};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};
use std::sync::{Arc, Mutex};

const SRC: &str = include_str!("kernels.cu");

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
        })
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

/// The chunked CUDA executor (device 0).
pub struct Chunked {
    config: ChunkedConfig,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    bf16: Kernels,
    f16: Kernels,
    desc: String,
    sm_count: u32,
    // One call at a time: the stream and cuBLAS handle are shared.
    lock: Mutex<()>,
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
    /// Open device 0, compile the kernels, create the cuBLAS handle. Fails with
    /// [`ExecError::NoDevice`] when the driver, cuBLAS or NVRTC cannot be loaded or no GPU of
    /// compute capability >= 8.0 is present.
    pub fn new(config: ChunkedConfig) -> Result<Chunked, ExecError> {
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
        let ctx = CudaContext::new(0).map_err(|e| ExecError::NoDevice {
            reason: format!("no CUDA device 0: {e:?}"),
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
        // SAFETY: one stream is used for everything, so cross-stream tracking is not needed.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv)?;
        let blas = CudaBlas::new(stream.clone()).map_err(blas_err)?;
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
            ctx,
            stream,
            blas,
            bf16,
            f16,
            desc,
            sm_count,
            lock: Mutex::new(()),
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &ChunkedConfig {
        &self.config
    }

    /// Workspace bytes a forward (`backward = false`) or backward call of `p` allocates.
    pub fn workspace_bytes(&self, p: &AttentionProblem, backward: bool) -> Result<u64, ExecError> {
        Ok(plan::make_plan(p, &self.config, backward)?.bytes)
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
        let k = self.kernels(dtype);
        let n = len as i64;
        let cfg = self.grid_stride(len);
        let mut b = self.stream.launch_builder(&k.normal);
        b.arg(&buf.ptr).arg(&n).arg(&seed);
        // SAFETY: kernel writes len u16 into a buffer of 2*len bytes.
        unsafe { b.launch(cfg) }.map_err(drv)?;
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
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut ops = CudaOps {
            ex: self,
            k: self.kernels(dtype),
            dtype,
        };
        for _ in 0..3 {
            ops.gemm(&g)?;
        }
        let ms = self.timed(|| (0..10).try_for_each(|_| ops.gemm(&g)))?;
        Ok(2.0 * (n as f64).powi(3) / (ms / 10.0 * 1e-3) / 1e12)
    }

    fn kernels(&self, dtype: DType) -> &Kernels {
        match dtype {
            DType::BF16 => &self.bf16,
            DType::F16 => &self.f16,
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

    fn check_ptrs(ptrs: &[(&str, u64)]) -> Result<(), ExecError> {
        for (name, p) in ptrs {
            if *p == 0 || p % 16 != 0 {
                return Err(ExecError::invalid(format!(
                    "{name} pointer {p:#x} is null or not 16-byte aligned"
                )));
            }
        }
        Ok(())
    }

    /// Run `f` between two timing events; returns milliseconds.
    fn timed(&self, f: impl FnOnce() -> Result<(), ExecError>) -> Result<f64, ExecError> {
        let flags = Some(drv_sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.ctx.new_event(flags).map_err(drv)?;
        let end = self.ctx.new_event(flags).map_err(drv)?;
        start.record(&self.stream).map_err(drv)?;
        f()?;
        end.record(&self.stream).map_err(drv)?;
        end.synchronize().map_err(drv)?;
        Ok(start.elapsed_ms(&end).map_err(drv)? as f64)
    }

    fn fwd_impl(
        &self,
        p: &AttentionProblem,
        a: &DeviceForwardArgs,
    ) -> Result<ExecStats, ExecError> {
        super::check_problem(p)?;
        Self::check_ptrs(&[
            ("q", a.q),
            ("k", a.k),
            ("v", a.v),
            ("o", a.o),
            ("lse", a.lse),
        ])?;
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let pl = plan::make_plan(p, &self.config, false)?;
        let ws = self.alloc(pl.bytes as usize)?;
        let mut ops = CudaOps {
            ex: self,
            k: self.kernels(p.dtype),
            dtype: p.dtype,
        };
        let ms = self.timed(|| plan::forward(&mut ops, p, &pl, a, ws.ptr))?;
        let out_bytes = 2 * p.o_span() as u64 + 4 * p.lse_len() as u64;
        Ok(ExecStats {
            compute_ms: ms,
            workspace_bytes: pl.bytes,
            peak_bytes: Some(out_bytes + pl.bytes),
        })
    }

    fn bwd_impl(
        &self,
        p: &AttentionProblem,
        a: &DeviceBackwardArgs,
    ) -> Result<ExecStats, ExecError> {
        super::check_problem(p)?;
        Self::check_ptrs(&[
            ("q", a.q),
            ("k", a.k),
            ("v", a.v),
            ("o", a.o),
            ("d_o", a.d_o),
            ("lse", a.lse),
            ("dq", a.dq),
            ("dk", a.dk),
            ("dv", a.dv),
        ])?;
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let pl = plan::make_plan(p, &self.config, true)?;
        let ws = self.alloc(pl.bytes as usize)?;
        let mut ops = CudaOps {
            ex: self,
            k: self.kernels(p.dtype),
            dtype: p.dtype,
        };
        let ms = self.timed(|| plan::backward(&mut ops, p, &pl, a, ws.ptr))?;
        let out_bytes = 2 * (p.q_span() + p.k_span() + p.v_span()) as u64;
        Ok(ExecStats {
            compute_ms: ms,
            workspace_bytes: pl.bytes,
            peak_bytes: Some(out_bytes + pl.bytes),
        })
    }
}

/// The device operations on CUDA.
struct CudaOps<'a> {
    ex: &'a Chunked,
    k: &'a Kernels,
    dtype: DType,
}

fn mask_args(m: &EffectiveMask) -> (i64, i64, i64, i64) {
    (
        m.offset,
        m.left.unwrap_or(-1),
        m.right.unwrap_or(-1),
        m.seqlen_kv,
    )
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
                *self.ex.blas.handle(),
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
        let cfg = LaunchConfig {
            grid_dim: (a.rows as u32, a.heads as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.ex.stream.launch_builder(&self.k.softmax);
        b.arg(&a.s)
            .arg(&a.p)
            .arg(&lds)
            .arg(&rows)
            .arg(&n)
            .arg(&i0)
            .arg(&kv_lo)
            .arg(&a.lse);
        b.arg(&lhs)
            .arg(&off)
            .arg(&left)
            .arg(&right)
            .arg(&skv)
            .arg(&scale_log2);
        // SAFETY: argument list matches the kernel signature; buffers sized by the plan.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(drv)
    }

    fn bwd_elementwise(&mut self, a: &BwdArgs) -> Result<(), ExecError> {
        let (off, left, right, skv) = mask_args(&a.mask);
        let (lds, rows, n) = (a.lds as i32, a.rows as i32, a.n as i32);
        let (i0, kv_lo, hs) = (a.i0 as i64, a.kv_lo as i64, a.head_stride as i64);
        let scale_log2 = a.scale * std::f32::consts::LOG2_E;
        let cfg = LaunchConfig {
            grid_dim: (a.rows as u32, a.heads as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.ex.stream.launch_builder(&self.k.bwd);
        b.arg(&a.s)
            .arg(&a.dp)
            .arg(&a.p)
            .arg(&a.ds)
            .arg(&lds)
            .arg(&rows)
            .arg(&n)
            .arg(&i0);
        b.arg(&kv_lo)
            .arg(&a.lse)
            .arg(&a.dvec)
            .arg(&hs)
            .arg(&off)
            .arg(&left)
            .arg(&right);
        b.arg(&skv).arg(&scale_log2);
        // SAFETY: as above.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(drv)
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
        let mut b = self.ex.stream.launch_builder(&self.k.row_dot);
        b.arg(&a.o)
            .arg(&a.d_o)
            .arg(&a.out)
            .arg(&bt)
            .arg(&h)
            .arg(&s)
            .arg(&d);
        b.arg(&sb).arg(&sh).arg(&ss);
        // SAFETY: as above.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(drv)
    }

    fn cast_rows(&mut self, a: &CastArgs) -> Result<(), ExecError> {
        let cfg = self.ex.grid_stride(a.rows * a.cols);
        let (ld, rows, cols) = (a.dst_ld as i64, a.rows as i32, a.cols as i32);
        let mut b = self.ex.stream.launch_builder(&self.k.cast);
        b.arg(&a.src).arg(&a.dst).arg(&ld).arg(&rows).arg(&cols);
        // SAFETY: as above.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(drv)
    }

    fn zero_rows(&mut self, a: &ZeroRowsArgs) -> Result<(), ExecError> {
        let cfg = self.ex.grid_stride(a.rows * a.cols * a.heads);
        let (rs, hs) = (a.row_stride as i64, a.head_stride as i64);
        let (rows, heads, cols) = (a.rows as i32, a.heads as i32, a.cols as i32);
        let mut b = self.ex.stream.launch_builder(&self.k.zero);
        b.arg(&a.dst)
            .arg(&rs)
            .arg(&hs)
            .arg(&rows)
            .arg(&heads)
            .arg(&cols);
        // SAFETY: as above.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(drv)
    }

    fn fill_f32(&mut self, a: &FillF32Args) -> Result<(), ExecError> {
        let cfg = self.ex.grid_stride(a.rows * a.cols);
        let (ld, rows, cols) = (a.ld as i64, a.rows as i32, a.cols as i64);
        let mut b = self.ex.stream.launch_builder(&self.k.fill);
        b.arg(&a.dst).arg(&ld).arg(&rows).arg(&cols).arg(&a.value);
        // SAFETY: as above.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(drv)
    }
}

impl Executor for Chunked {
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

    fn forward(
        &self,
        p: &AttentionProblem,
        inputs: &ForwardInputs<'_>,
    ) -> Result<ForwardOutput, ExecError> {
        self.check(p)?;
        validate_forward_inputs(p, inputs)?;
        let q = self.upload(&inputs.q.data[..p.q_span()])?;
        let k = self.upload(&inputs.k.data[..p.k_span()])?;
        let v = self.upload(&inputs.v.data[..p.v_span()])?;
        let o = self.alloc(2 * p.o_span())?;
        // Padding between rows is never written: start it at zero.
        self.poison(&o, 0)?;
        let lse = self.alloc(4 * p.lse_len())?;
        let args = DeviceForwardArgs {
            q: q.ptr,
            k: k.ptr,
            v: v.ptr,
            o: o.ptr,
            lse: lse.ptr,
        };
        let stats = self.fwd_impl(p, &args)?;
        Ok(ForwardOutput {
            o: HostTensor {
                dtype: p.dtype,
                data: self.download_u16(&o, p.o_span())?,
            },
            lse: self.download_f32(&lse, p.lse_len())?,
            stats,
        })
    }

    fn backward(
        &self,
        p: &AttentionProblem,
        inputs: &BackwardInputs<'_>,
    ) -> Result<BackwardOutput, ExecError> {
        self.check(p)?;
        validate_backward_inputs(p, inputs)?;
        let q = self.upload(&inputs.q.data[..p.q_span()])?;
        let k = self.upload(&inputs.k.data[..p.k_span()])?;
        let v = self.upload(&inputs.v.data[..p.v_span()])?;
        let o = self.upload(&inputs.o.data[..p.o_span()])?;
        let d_o = self.upload(&inputs.d_o.data[..p.o_span()])?;
        let lse_bits: Vec<u16> = inputs
            .lse
            .iter()
            .flat_map(|x| [x.to_bits() as u16, (x.to_bits() >> 16) as u16])
            .collect();
        let lse = self.upload(&lse_bits)?;
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
        };
        let stats = self.bwd_impl(p, &args)?;
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
        })
    }

    unsafe fn forward_device(
        &self,
        p: &AttentionProblem,
        args: &DeviceForwardArgs,
    ) -> Result<ExecStats, ExecError> {
        self.fwd_impl(p, args)
    }

    unsafe fn backward_device(
        &self,
        p: &AttentionProblem,
        args: &DeviceBackwardArgs,
    ) -> Result<ExecStats, ExecError> {
        self.bwd_impl(p, args)
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
