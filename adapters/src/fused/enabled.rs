//! The fused executor on CUDA: NVRTC-compiled wgmma kernels (`kernels.cu`), one variant per
//! (dtype, padded head dims), compiled on first use of a shape and cached.

use super::{
    BLOCK_M, BLOCK_N, NAME, backward_shared_bytes, padded_dims, seq_table, seq_table_bytes,
    seq_v_columns, shared_bytes, transposed_v_bytes,
};
use crate::chunked::plan::{BwdScoresArgs, ScoreKernel};
use crate::chunked::{Chunked, ChunkedConfig, DeviceBuffer, StreamKernels, StreamPlan};
use crate::device::{Availability, cuda_devices, device_identity};
use crate::executor::{
    DeviceBackwardArgs, DeviceForwardArgs, DeviceIo, Direction, ExecError, ExecStats, Executor,
    HostIo, HostOutput, Manifest, Plan, StreamLaunch, Unsupported, direction_mismatch,
    validate_backward_inputs, validate_forward_inputs,
};
use crate::problem::{AttentionProblem, DType, SoftmaxKind, Strides};
use cudarc::driver::{CudaFunction, DriverError, result as drv_result, sys as drv_sys};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};
use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The kernel source after the prelude shared with the other NVRTC executor.
const SRC: &str = concat!(
    include_str!("../nvrtc_prelude.cu"),
    include_str!("kernels.cu"),
    include_str!("backward.cu")
);

/// Kernel parameters as the driver wants them: pointers to each argument's value.
macro_rules! params {
    ($($x:expr),* $(,)?) => {
        [$((&$x) as *const _ as *mut c_void),*]
    };
}

/// Threads per CTA: the score warpgroup and two output warpgroups (`NTHREADS` in `kernels.cu`).
const THREADS: u32 = 384;

/// NVRTC target: wgmma and `setmaxnreg` exist only in the architecture-specific `sm_90a`.
const ARCH: &str = "sm_90a";

fn drv(e: DriverError) -> ExecError {
    ExecError::Backend {
        library: "cuda",
        message: format!("{e:?}"),
    }
}

/// One `wgmma.mma_async` m64nNk16 wrapper with fp32 accumulators: `A` from shared memory
/// (descriptor) or from four registers. Generated because the operand list is N/2 long.
fn wgmma_wrapper(name: &str, n: usize, ty: &str, a_in_registers: bool) -> String {
    let nd = n / 2;
    let mut s = String::new();
    let a_params = if a_in_registers {
        "unsigned a0, unsigned a1, unsigned a2, unsigned a3"
    } else {
        "u64 da"
    };
    let scale = if a_in_registers { "1" } else { "int scale_d" };
    let _ = writeln!(
        s,
        "__device__ __forceinline__ void {name}(float* d, {a_params}, u64 db{}) {{",
        if a_in_registers { "" } else { ", int scale_d" }
    );
    let d_list: Vec<String> = (0..nd).map(|i| format!("%{i}")).collect();
    let (a_operand, b_idx, p_idx) = if a_in_registers {
        (
            format!("{{%{}, %{}, %{}, %{}}}", nd, nd + 1, nd + 2, nd + 3),
            nd + 4,
            None,
        )
    } else {
        (format!("%{nd}"), nd + 1, Some(nd + 2))
    };
    let _ = write!(s, "    asm volatile(\"{{\\n.reg .pred p;\\n");
    match p_idx {
        Some(i) => {
            let _ = write!(s, "setp.ne.b32 p, %{i}, 0;\\n");
        }
        None => {
            let _ = write!(s, "setp.ne.b32 p, {scale}, 0;\\n");
        }
    }
    let imm = if a_in_registers {
        "1, 1, 0"
    } else {
        "1, 1, 0, 0"
    };
    let _ = write!(
        s,
        "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{}}}, {a_operand}, %{b_idx}, p, {imm};\\n}}\\n\"\n        : ",
        d_list.join(", ")
    );
    let outs: Vec<String> = (0..nd).map(|i| format!("\"+f\"(d[{i}])")).collect();
    let _ = write!(s, "{}\n        : ", outs.join(", "));
    if a_in_registers {
        let _ = writeln!(s, "\"r\"(a0), \"r\"(a1), \"r\"(a2), \"r\"(a3), \"l\"(db));");
    } else {
        let _ = writeln!(s, "\"l\"(da), \"l\"(db), \"r\"(scale_d));");
    }
    s.push_str("}\n");
    s
}

/// One compiled variant: dtype, padded head dims, and the compile-time features (`SEQ`: per-
/// sequence lengths, `SOFTCAP`: soft-capping). Sinks need no variant: they change only the
/// forward's epilogue, a uniform branch on a kernel parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VariantKey {
    /// bf16 (else fp16).
    pub bf16: bool,
    /// Q/K head dim padded to a multiple of 64.
    pub dqk_pad: usize,
    /// V head dim padded to a multiple of 64.
    pub dv_pad: usize,
    /// Per-sequence lengths (the forward reads the sequence table).
    pub seq: bool,
    /// Soft-capping (forward and backward score kernels).
    pub softcap: bool,
}

impl VariantKey {
    /// The variant a problem runs.
    pub fn of(p: &AttentionProblem) -> VariantKey {
        let (dqk_pad, dv_pad) = padded_dims(p.head_dim_qk, p.head_dim_v);
        VariantKey {
            bf16: p.dtype == DType::BF16,
            dqk_pad,
            dv_pad,
            seq: p.seqlens.is_some(),
            softcap: p.softcap.is_some(),
        }
    }
}

/// The complete NVRTC source of one plain variant (no feature): the defines, the generated
/// wgmma wrappers and `kernels.cu` (or the file [`SOURCE_OVERRIDE`] names).
pub fn kernel_source(bf16: bool, dqk_pad: usize, dv_pad: usize) -> String {
    kernel_source_for(VariantKey {
        bf16,
        dqk_pad,
        dv_pad,
        seq: false,
        softcap: false,
    })
}

/// The complete NVRTC source of a variant (see [`kernel_source`]).
pub fn kernel_source_for(key: VariantKey) -> String {
    let body_file = std::env::var_os(SOURCE_OVERRIDE);
    kernel_source_with(key, body_file.as_deref().map(Path::new))
}

fn kernel_source_with(key: VariantKey, body: Option<&Path>) -> String {
    let VariantKey {
        bf16,
        dqk_pad,
        dv_pad,
        seq,
        softcap,
    } = key;
    let ty = if bf16 { "bf16" } else { "f16" };
    // SMEM_BYTES: what the launch allocates; the kernel asserts its layout fits.
    let mut s = format!(
        "#define LOWP_BF16 {}\n#define DQK {dqk_pad}\n#define DV {dv_pad}\n#define SMEM_BYTES {}\n#define BSMEM_BYTES {}\n#define SEQ {}\n#define SOFTCAP {}\ntypedef unsigned long long u64;\n",
        u8::from(bf16),
        shared_bytes(dqk_pad, dv_pad),
        backward_shared_bytes(),
        u8::from(seq),
        u8::from(softcap),
    );
    // Scores: Q from registers (past column 384: shared memory), K from shared memory.
    // Output: P and V^T from shared memory.
    s.push_str(&wgmma_wrapper("wg_rs_s", BLOCK_N, ty, true));
    s.push_str(&wgmma_wrapper("wg_ss_s", BLOCK_N, ty, false));
    s.push_str(&wgmma_wrapper("wg_ss_o", dv_pad / 2, ty, false));
    // Backward scores: 128 keys per tile, both operands from shared memory.
    s.push_str(&wgmma_wrapper("wg_ss_b", 128, ty, false));
    match body {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => {
                s.push_str(include_str!("../nvrtc_prelude.cu"));
                s.push_str(&text);
            }
            // Compiles to an error that names the file, never silently to the built-in kernel.
            Err(e) => {
                let why = format!("{SOURCE_OVERRIDE}={}: {e}", path.display()).replace('"', "'");
                let _ = writeln!(s, "#error \"{why}\"");
            }
        },
        None => s.push_str(SRC),
    }
    s
}

/// Development hook: a path to a file to compile instead of the built-in `kernels.cu` and
/// `backward.cu` (same entry points and parameters), so kernel variants can be measured side by side on a GPU machine
/// without a Rust toolchain. Unset in normal use.
pub const SOURCE_OVERRIDE: &str = "ATTN_POLICY_FUSED_SOURCE";

/// A variant's name, e.g. `fused_bf16_512_512_softcap`: NVRTC's program name (with `.cu`) and
/// the file name of its dumped PTX.
fn variant_name(key: VariantKey) -> String {
    format!(
        "fused_{}_{}_{}{}{}",
        if key.bf16 { "bf16" } else { "f16" },
        key.dqk_pad,
        key.dv_pad,
        if key.seq { "_seq" } else { "" },
        if key.softcap { "_softcap" } else { "" }
    )
}

fn compile(key: VariantKey) -> Result<cudarc::nvrtc::Ptx, ExecError> {
    let opts = CompileOptions {
        arch: Some(ARCH),
        name: Some(format!("{}.cu", variant_name(key))),
        ..Default::default()
    };
    compile_ptx_with_opts(kernel_source_for(key), opts).map_err(|e| ExecError::Backend {
        library: "nvrtc",
        message: format!("{e:?}"),
    })
}

/// Compile six plain variants (the widest and narrowest head dims, Q partly in shared memory,
/// unequal qk and v dims) in both dtypes, and the feature variants (per-sequence lengths,
/// soft-capping, both) at three head-dim pairs in both dtypes, with NVRTC only (no device): the
/// test that runs wherever the NVRTC library is found. Each PTX comes with its variant's name.
/// `only`: compile just the variants whose name contains it (all when empty), for a quick check
/// of one kernel edit (`ptxas_check.sh`'s `ONLY`).
pub fn compile_only(only: &str) -> Result<Vec<(String, String)>, ExecError> {
    // SAFETY: probes library presence only.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(ExecError::NoDevice {
            reason: "NVRTC library not found".into(),
        });
    }
    let mut ptx = Vec::new();
    let mut push = |key: VariantKey| -> Result<(), ExecError> {
        let name = variant_name(key);
        if name.contains(only) {
            ptx.push((name, compile(key)?.to_src()));
        }
        Ok(())
    };
    for bf16 in [true, false] {
        for (d, dv) in [
            (512, 512),
            (264, 264),
            (512, 320),
            (392, 456),
            (456, 392),
            (328, 512),
        ] {
            let (dqk_pad, dv_pad) = padded_dims(d, dv);
            push(VariantKey {
                bf16,
                dqk_pad,
                dv_pad,
                seq: false,
                softcap: false,
            })?;
        }
        for (d, dv) in [(512, 512), (320, 320), (456, 392)] {
            let (dqk_pad, dv_pad) = padded_dims(d, dv);
            for (seq, softcap) in [(true, false), (false, true), (true, true)] {
                push(VariantKey {
                    bf16,
                    dqk_pad,
                    dv_pad,
                    seq,
                    softcap,
                })?;
            }
        }
    }
    Ok(ptx)
}

/// One compiled variant.
struct Variant {
    fwd: CudaFunction,
    transpose: CudaFunction,
    transpose_seq: CudaFunction,
    /// Per-sequence lengths and sinks: the table's upload, padding rows, LSE gather, d_sink.
    seq_table: CudaFunction,
    seq_pad_fwd: CudaFunction,
    seq_zero_rows: CudaFunction,
    seq_lse_gather: CudaFunction,
    sink_grad_partial: CudaFunction,
    sink_grad_final: CudaFunction,
    shared: u32,
    /// The backward's score kernel (`bwd_scores`) and its dynamic shared memory.
    bwd_scores: CudaFunction,
    bwd_shared: u32,
}

/// The fused executor on one SM90 device.
pub struct Fused {
    ordinal: usize,
    /// Device buffers, uploads, the context and the own stream (host path and the synchronous
    /// device path) come from a chunked executor on the same device; its backward plan, with
    /// P and dS from `bwd_scores`, is the fused backward.
    buffers: Chunked,
    variants: Mutex<HashMap<VariantKey, Arc<Variant>>>,
    desc: String,
}

/// Run-time probe: an SM90 device and NVRTC.
pub fn availability() -> Availability {
    let n = match cuda_devices() {
        Ok(n) => n,
        Err(why) => return Availability::unavailable(why),
    };
    // SAFETY: dlopen probe only.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Availability::unavailable("library missing: NVRTC");
    }
    let sm90: Vec<usize> = (0..n)
        .filter(|&i| device_identity(i).is_ok_and(|(_, cc)| cc == super::COMPUTE_CAPABILITY))
        .collect();
    if sm90.is_empty() {
        return Availability::unavailable("no compute capability 9.0 (Hopper) device");
    }
    Availability::Available {
        detail: format!("SM90 device(s) {sm90:?}; NVRTC found"),
    }
}

impl Fused {
    /// Open CUDA device `ordinal`. Fails with [`ExecError::NoDevice`] when the driver or NVRTC
    /// cannot be loaded, or the device is not compute capability 9.0.
    pub fn on_device(ordinal: usize) -> Result<Fused, ExecError> {
        Fused::with_chunking(ordinal, ChunkedConfig::default())
    }

    /// [`Fused::on_device`] with the backward's chunking (rows per chunk, workspace budget) set
    /// by `backward_chunks` (the tests use small chunks to cross chunk boundaries).
    pub fn with_chunking(
        ordinal: usize,
        backward_chunks: ChunkedConfig,
    ) -> Result<Fused, ExecError> {
        let (name, cc) =
            device_identity(ordinal).map_err(|reason| ExecError::NoDevice { reason })?;
        if cc != super::COMPUTE_CAPABILITY {
            return Err(ExecError::NoDevice {
                reason: format!(
                    "{name} is sm_{}{}; the fused kernels use sm_90a wgmma (Hopper only)",
                    cc.0, cc.1
                ),
            });
        }
        let buffers = Chunked::on_device(backward_chunks, ordinal)?;
        Ok(Fused {
            ordinal,
            buffers,
            variants: Mutex::new(HashMap::new()),
            desc: format!("{name} (sm_90), NVRTC wgmma kernels ({ARCH})"),
        })
    }

    /// The chunked executor on the same device, used for device buffers (allocation, upload,
    /// download) by the host path, the tests and the bench.
    pub fn buffers(&self) -> &Chunked {
        &self.buffers
    }

    /// Workspace bytes of a stream-path call of `p` in direction `dir` (what its plan's
    /// [`Plan::workspace_bytes`] says); compiles and loads the variant (the warm-up).
    pub fn workspace_for(&self, p: &AttentionProblem, dir: Direction) -> Result<u64, ExecError> {
        super::check_problem(p)?;
        // The warm-up: compile and load the variant now, not inside a graph capture.
        self.variant(p)?;
        match dir {
            Direction::Forward => Ok(super::forward_workspace_bytes(p)),
            Direction::Backward => Ok(self.backward_layout(p)?.total),
        }
    }

    /// The backward's workspace: the chunked plan's (of the whole problem, or the largest of the
    /// per-sequence problems), then what the features add (none for a plain problem).
    fn backward_layout(&self, p: &AttentionProblem) -> Result<BwdLayout, ExecError> {
        let plan = match &p.seqlens {
            None => self
                .buffers
                .fused_scores_workspace_bytes(&plan_problem(p))?,
            Some(s) => {
                let mut shapes: Vec<(usize, usize)> =
                    s.q.iter()
                        .zip(&s.kv)
                        .filter(|(q, kv)| **q > 0 && **kv > 0)
                        .map(|(q, kv)| (*q, *kv))
                        .collect();
                shapes.sort_unstable();
                shapes.dedup();
                let mut most = 0;
                for (q, kv) in shapes {
                    let sub = seq_problem_of(p, q, kv);
                    most = most.max(self.buffers.fused_scores_workspace_bytes(&sub)?);
                }
                most
            }
        };
        let align = |x: u64| x.div_ceil(256) * 256;
        let table = seq_table_bytes(p);
        let max_q = p
            .seqlens
            .as_ref()
            .map_or(0, |s| s.q.iter().copied().max().unwrap_or(0));
        let lse = align((p.heads_q * max_q * 4) as u64);
        let sink = if p.softmax == SoftmaxKind::Learnable {
            align((p.heads_q * SINK_CHUNKS * 4) as u64)
        } else {
            0
        };
        Ok(BwdLayout {
            plan,
            table_off: plan,
            lse_off: plan + table,
            sink_off: plan + table + lse,
            total: plan + table + lse + sink,
        })
    }

    /// Writes the per-sequence table to `dst` (device memory of the call's workspace) with
    /// kernels whose parameters carry it: stream-ordered and capturable, no host copy.
    fn write_table(
        &self,
        var: &Variant,
        stream: drv_sys::CUstream,
        dst: u64,
        table: &[i32],
    ) -> Result<(), ExecError> {
        for (i, part) in table.chunks(SEQ_CHUNK_INTS).enumerate() {
            let mut chunk = [0i32; SEQ_CHUNK_INTS];
            chunk[..part.len()].copy_from_slice(part);
            let at = dst + (i * SEQ_CHUNK_INTS * 4) as u64;
            let n = part.len() as i32;
            // SAFETY: argument list matches `seq_table_write` (the array is the by-value
            // `SeqChunk`); the table region of the workspace holds the whole table.
            unsafe {
                launch_raw(
                    &var.seq_table,
                    (1, 1, 1),
                    (256, 1, 1),
                    0,
                    stream,
                    &mut params![at, n, chunk],
                )?;
            }
        }
        Ok(())
    }

    /// The compiled variant for `p` (compiles and loads it on first use).
    fn variant(&self, p: &AttentionProblem) -> Result<Arc<Variant>, ExecError> {
        let key = VariantKey::of(p);
        let (dq, dv) = (key.dqk_pad, key.dv_pad);
        let mut map = self.variants.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = map.get(&key) {
            return Ok(v.clone());
        }
        let ptx = compile(key)?;
        let ctx = self.buffers.context();
        ctx.bind_to_thread().map_err(drv)?;
        let m = ctx.load_module(ptx).map_err(drv)?;
        let fwd = m.load_function("fused_fwd").map_err(drv)?;
        let transpose = m.load_function("transpose_v").map_err(drv)?;
        let shared = shared_bytes(dq, dv) as u32;
        fwd.set_attribute(
            drv_sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            shared as i32,
        )
        .map_err(drv)?;
        let bwd_scores = m.load_function("bwd_scores").map_err(drv)?;
        let bwd_shared = backward_shared_bytes() as u32;
        bwd_scores
            .set_attribute(
                drv_sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bwd_shared as i32,
            )
            .map_err(drv)?;
        let v = Arc::new(Variant {
            fwd,
            transpose,
            transpose_seq: m.load_function("transpose_v_seq").map_err(drv)?,
            seq_table: m.load_function("seq_table_write").map_err(drv)?,
            seq_pad_fwd: m.load_function("seq_pad_fwd").map_err(drv)?,
            seq_zero_rows: m.load_function("seq_zero_rows").map_err(drv)?,
            seq_lse_gather: m.load_function("seq_lse_gather").map_err(drv)?,
            sink_grad_partial: m.load_function("sink_grad_partial").map_err(drv)?,
            sink_grad_final: m.load_function("sink_grad_final").map_err(drv)?,
            shared,
            bwd_scores,
            bwd_shared,
        });
        map.insert(key, v.clone());
        Ok(v)
    }

    fn check_launch(&self, p: &AttentionProblem, launch: &StreamLaunch) -> Result<(), ExecError> {
        if launch.device != self.ordinal {
            return Err(ExecError::invalid(format!(
                "launch on device {}, executor on device {}",
                launch.device, self.ordinal
            )));
        }
        let need = super::forward_workspace_bytes(p);
        if launch.workspace_bytes < need {
            return Err(ExecError::invalid(format!(
                "workspace of {} bytes, the call needs {need}",
                launch.workspace_bytes
            )));
        }
        if launch.workspace == 0 || !launch.workspace.is_multiple_of(256) {
            return Err(ExecError::invalid(format!(
                "workspace {:#x} is null or not 256-byte aligned",
                launch.workspace
            )));
        }
        Ok(())
    }

    /// The synchronous device path: compile the variant (before timing: the first call of a
    /// shape pays NVRTC once), allocate the workspace, run `enqueue` on the own stream, time it.
    fn timed_call(
        &self,
        p: &AttentionProblem,
        dir: Direction,
        out_bytes: u64,
        enqueue: impl FnOnce(&StreamLaunch) -> Result<(), ExecError>,
    ) -> Result<ExecStats, ExecError> {
        super::check_problem(p)?;
        let bytes = self.workspace_for(p, dir)?;
        let ws: DeviceBuffer = self.buffers.alloc(bytes as usize)?;
        let launch = StreamLaunch {
            device: self.ordinal,
            stream: self.buffers.own_stream(),
            workspace: ws.ptr(),
            workspace_bytes: ws.bytes() as u64,
        };
        let ms = self.buffers.timed(|| enqueue(&launch))?;
        Ok(ExecStats {
            compute_ms: ms,
            workspace_bytes: launch.workspace_bytes,
            peak_bytes: Some(out_bytes + launch.workspace_bytes),
        })
    }
}

/// The TMA descriptors of one call: K (4-D: d, then its row, head and batch dimensions by
/// increasing stride) and the transposed V (3-D: keys, d_v, batch * h_kv).
struct TensorMaps {
    k: drv_sys::CUtensorMap,
    v: drv_sys::CUtensorMap,
    /// Slot (1..=3) of K's row and head coordinates; the batch takes the remaining one.
    pos_row: i32,
    pos_head: i32,
}

/// A learnable sink needs its logits (and, in the backward, its gradient's buffer): without
/// them the call is refused, never run as a plain softmax.
fn check_sink(p: &AttentionProblem, sink: u64, d_sink: Option<u64>) -> Result<(), ExecError> {
    if p.softmax != SoftmaxKind::Learnable {
        return Ok(());
    }
    let mut ptrs = vec![("sink", sink)];
    if let Some(d) = d_sink {
        ptrs.push(("d_sink", d));
    }
    for (name, ptr) in ptrs {
        if ptr == 0 || !ptr.is_multiple_of(4) {
            return Err(ExecError::invalid(format!(
                "a learnable sink needs `{name}` ([h_q] fp32): pointer {ptr:#x} is null or not \
                 4-byte aligned"
            )));
        }
    }
    Ok(())
}

impl Fused {
    /// The backward of per-sequence lengths: the table, zeros in every gradient row no sequence
    /// owns (padding, sequences without queries or keys), then per sequence its LSE rows
    /// gathered and the chunked backward plan of its own problem (rows, keys, mask) on its rows
    /// of the tensors. Sequences run one after another on the stream (the plan's lanes join
    /// before the next starts), so they share the workspace.
    fn enqueue_bwd_per_sequence(
        &self,
        p: &AttentionProblem,
        a: &DeviceBackwardArgs,
        var: &Arc<Variant>,
        lay: &BwdLayout,
        plan_launch: &StreamLaunch,
    ) -> Result<(), ExecError> {
        let stream = plan_launch.stream as drv_sys::CUstream;
        let ws = plan_launch.workspace;
        let tab = ws + lay.table_off;
        let lse_buf = ws + lay.lse_off;
        self.write_table(var, stream, tab, &seq_table(p))?;
        let nseq = p.batch as i32;
        let packed = i32::from(p.is_packed());
        let nb = p.batch_dim();
        let zero = [
            (a.dq, p.layout.q, 0i32, p.heads_q, p.rows_q(), p.head_dim_qk),
            (a.dk, p.layout.k, 1, p.heads_kv, p.rows_kv(), p.head_dim_qk),
            (a.dv, p.layout.v, 1, p.heads_kv, p.rows_kv(), p.head_dim_v),
        ];
        for (x, st, side, heads, rows, dim) in zero {
            let n = nb * heads * rows * dim / 8;
            let (sb, sh, ss) = (st.batch as i64, st.head as i64, st.seq as i64);
            let (nb32, h32, r32, d32) = (nb as i32, heads as i32, rows as i32, dim as i32);
            // SAFETY: argument list matches `seq_zero_rows`; the gradient spans the problem's
            // strides, the table has `nseq` entries.
            unsafe {
                launch_raw(
                    &var.seq_zero_rows,
                    (grid_for(n), 1, 1),
                    (256, 1, 1),
                    0,
                    stream,
                    &mut params![x, tab, nseq, packed, side, nb32, h32, r32, d32, sb, sh, ss],
                )?;
            }
        }
        let sm = self.buffers.sm_count();
        let (hq, lse_rows) = (p.heads_q as i32, p.rows_q() as i64);
        let (lq, lk, lv, lo) = (p.layout.q, p.layout.k, p.layout.v, p.layout.o);
        for b in 0..p.batch {
            let (qr, kr) = p.seq_rows(b);
            if qr.len == 0 || kr.len == 0 {
                continue;
            }
            let sub = seq_problem_of(p, qr.len, kr.len);
            let at_q =
                |base: u64, st: Strides| base + 2 * st.offset(qr.batch, 0, qr.start, 0) as u64;
            let at_k =
                |base: u64, st: Strides| base + 2 * st.offset(kr.batch, 0, kr.start, 0) as u64;
            let sa = DeviceBackwardArgs {
                q: at_q(a.q, lq),
                k: at_k(a.k, lk),
                v: at_k(a.v, lv),
                o: at_q(a.o, lo),
                d_o: at_q(a.d_o, lo),
                lse: lse_buf,
                dq: at_q(a.dq, lq),
                dk: at_k(a.dk, lk),
                dv: at_k(a.dv, lv),
                sink: 0,
                d_sink: 0,
            };
            let (b32, q0, qlen) = (qr.batch as i32, qr.start as i32, qr.len as i32);
            // SAFETY: argument list matches `seq_lse_gather`; LSE spans the problem, the buffer
            // holds h_q * (longest sequence) floats.
            unsafe {
                launch_raw(
                    &var.seq_lse_gather,
                    (grid_for(p.heads_q * qr.len), 1, 1),
                    (256, 1, 1),
                    0,
                    stream,
                    &mut params![a.lse, lse_buf, hq, lse_rows, b32, q0, qlen],
                )?;
            }
            let scorer = ScoreLaunch::new(&sub, var.clone(), &sa, sm)?;
            self.buffers
                .enqueue_backward_plan(&sub, &sa, plan_launch, Some(&scorer))?;
        }
        Ok(())
    }
}

/// Where the backward's buffers sit in its workspace (byte offsets, 256-aligned): the chunked
/// plan's (and cuBLAS's) first, then the sequence table, one sequence's LSE rows and the
/// d_sink partial sums.
#[derive(Clone, Copy, Debug)]
struct BwdLayout {
    plan: u64,
    table_off: u64,
    lse_off: u64,
    sink_off: u64,
    total: u64,
}

/// Ints of the sequence table per `seq_table_write` launch (`SEQ_CHUNK_INTS` in `kernels.cu`).
const SEQ_CHUNK_INTS: usize = 896;
/// Partial sums per head of the sink gradient (`SINK_CHUNKS` in `kernels.cu`).
const SINK_CHUNKS: usize = 64;

/// The problem of one sequence of `p` (`q` query and `kv` key rows at the same strides, no per-sequence lengths, no sink: its LSE already holds the sink term, so its
/// backward is the plain one); soft-capping, the mask and the scale carry over.
fn seq_problem_of(p: &AttentionProblem, q: usize, kv: usize) -> AttentionProblem {
    let mut sub = p.clone();
    sub.batch = 1;
    sub.seqlen_q = q;
    sub.seqlen_kv = kv;
    sub.seqlens = None;
    sub.softmax = SoftmaxKind::Vanilla;
    sub
}

/// The problem the chunked plan runs for a call without per-sequence lengths: `p` without its
/// sink (LSE holds the sink term, so P and dS are the plain ones; d_sink is computed here).
fn plan_problem(p: &AttentionProblem) -> AttentionProblem {
    let mut pp = p.clone();
    pp.softmax = SoftmaxKind::Vanilla;
    pp
}

/// Blocks of a grid-stride kernel of 256 threads over `n` items.
fn grid_for(n: usize) -> u32 {
    n.div_ceil(256).clamp(1, 4096) as u32
}

impl TensorMaps {
    fn encode(
        p: &AttentionProblem,
        k: u64,
        vt: u64,
        skv_pad: u64,
        slabs: u64,
    ) -> Result<TensorMaps, ExecError> {
        let (kmap, kpos) = row_map(
            p,
            k,
            p.layout.k,
            p.rows_kv(),
            p.heads_kv,
            p.head_dim_qk,
            (BLOCK_N / 2) as u32,
        )?;
        let (_, dv_pad) = padded_dims(p.head_dim_qk, p.head_dim_v);
        let dv = p.head_dim_v as u64;
        let vmap = encode_tiled(
            p.dtype,
            vt,
            &[skv_pad, dv, slabs],
            &[2 * skv_pad, 2 * skv_pad * dv],
            &[BLOCK_N as u32, (dv_pad / 2) as u32, 1],
        )?;
        Ok(TensorMaps {
            k: kmap,
            v: vmap,
            pos_row: kpos & 3,
            pos_head: kpos >> 2,
        })
    }
}

/// A TMA descriptor of a 2..5-D tensor (`dims` innermost first, byte `strides` of dims 1..),
/// 128-byte swizzle, zero fill out of bounds.
fn encode_tiled(
    dtype: DType,
    addr: u64,
    dims: &[u64],
    strides: &[u64],
    boxd: &[u32],
) -> Result<drv_sys::CUtensorMap, ExecError> {
    use drv_sys::{
        CUtensorMapDataType as Ty, CUtensorMapFloatOOBfill as Fill, CUtensorMapInterleave as Il,
        CUtensorMapL2promotion as L2, CUtensorMapSwizzle as Sw,
    };
    let ty = match dtype {
        DType::BF16 => Ty::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        _ => Ty::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
    };
    // SAFETY: an all-zero CUtensorMap is a valid value to be overwritten.
    let mut map: drv_sys::CUtensorMap = unsafe { std::mem::zeroed() };
    let ones = [1u32; 5];
    // SAFETY: the arrays hold `dims.len()` (strides: one fewer) entries.
    unsafe {
        drv_sys::cuTensorMapEncodeTiled(
            &mut map,
            ty,
            dims.len() as u32,
            addr as *mut c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxd.as_ptr(),
            ones.as_ptr(),
            Il::CU_TENSOR_MAP_INTERLEAVE_NONE,
            Sw::CU_TENSOR_MAP_SWIZZLE_128B,
            L2::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            Fill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        .result()
    }
    .map(|_| map)
    .map_err(drv)
}

/// A 4-D map of a `[batch, heads, seqlen, dim]` tensor with any strides (dim contiguous): d,
/// then the row, head and batch dimensions ordered by stride. Boxes are 64 columns by
/// `box_rows` rows of one head. Returns the map and the slots (1..=3) of the row (bits 0..1) and
/// of the head (bits 2..3) coordinates; the batch takes the remaining slot.
fn row_map(
    p: &AttentionProblem,
    addr: u64,
    st: Strides,
    seqlen: usize,
    heads: usize,
    dim: usize,
    box_rows: u32,
) -> Result<(drv_sys::CUtensorMap, i32), ExecError> {
    // 0: row, 1: head, 2: batch; ties keep that order. A batch of one (packed tensors, whose
    // batch stride is 0, or one sequence's problem) is never stepped: it gets a stride past
    // the others, which the driver accepts, and sorts last.
    let nb = p.batch_dim();
    let batch_stride = if nb == 1 {
        (st.seq * seqlen).max(st.head * heads).max(dim) as u64
    } else {
        st.batch as u64
    };
    let mut outer = [
        (st.seq as u64, seqlen as u64, 0usize),
        (st.head as u64, heads as u64, 1),
        (batch_stride, nb as u64, 2),
    ];
    outer.sort_by_key(|&(stride, _, kind)| (stride, kind));
    let slot = |kind: usize| outer.iter().position(|o| o.2 == kind).unwrap_or(0) as i32 + 1;
    let dims = [dim as u64, outer[0].1, outer[1].1, outer[2].1];
    let strides = [2 * outer[0].0, 2 * outer[1].0, 2 * outer[2].0];
    let box_of = |kind: usize| if kind == 0 { box_rows } else { 1 };
    let boxd = [
        64,
        box_of(outer[0].2),
        box_of(outer[1].2),
        box_of(outer[2].2),
    ];
    let map = encode_tiled(p.dtype, addr, &dims, &strides, &boxd)?;
    Ok((map, slot(0) | (slot(1) << 2)))
}

/// Rows and keys of one `bwd_scores` CTA (`BTM`, `BTN` in `backward.cu`).
const BWD_TILE: usize = 128;

/// The backward's score kernel bound to one call: the TMA maps of Q, K, dO and V (encoded once
/// per call), the mask and the scale. The chunked plan calls it once per chunk.
struct ScoreLaunch {
    var: Arc<Variant>,
    maps: [drv_sys::CUtensorMap; 4],
    pos: [i32; 4],
    mask: (i64, i64, i64, i64),
    scale_log2: f32,
    /// Soft-capping: scale / c and c log2(e) (unused by the plain variant).
    cap_in: f32,
    cap_out: f32,
    sm_count: u32,
    dtype: DType,
}

impl ScoreLaunch {
    fn new(
        p: &AttentionProblem,
        var: Arc<Variant>,
        a: &DeviceBackwardArgs,
        sm_count: u32,
    ) -> Result<ScoreLaunch, ExecError> {
        let rows = BWD_TILE as u32;
        let keys = (BWD_TILE / 2) as u32;
        let (dqk, dv) = (p.head_dim_qk, p.head_dim_v);
        let (q, pq) = row_map(p, a.q, p.layout.q, p.seqlen_q, p.heads_q, dqk, rows)?;
        let (k, pk) = row_map(p, a.k, p.layout.k, p.seqlen_kv, p.heads_kv, dqk, keys)?;
        let (d_o, po) = row_map(p, a.d_o, p.layout.o, p.seqlen_q, p.heads_q, dv, rows)?;
        let (v, pv) = row_map(p, a.v, p.layout.v, p.seqlen_kv, p.heads_kv, dv, keys)?;
        let m = p.effective_mask();
        Ok(ScoreLaunch {
            var,
            maps: [q, k, d_o, v],
            pos: [pq, pk, po, pv],
            mask: (
                m.offset,
                m.left.unwrap_or(-1),
                m.right.unwrap_or(-1),
                m.seqlen_kv,
            ),
            scale_log2: (p.softmax_scale * std::f64::consts::LOG2_E) as f32,
            cap_in: p.softcap.map_or(0.0, |c| (p.softmax_scale / c) as f32),
            cap_out: p
                .softcap
                .map_or(0.0, |c| (c * std::f64::consts::LOG2_E) as f32),
            sm_count,
            dtype: p.dtype,
        })
    }
}

impl ScoreKernel for ScoreLaunch {
    fn enqueue(&self, stream: u64, a: &BwdScoresArgs) -> Result<(), ExecError> {
        let int = |x: usize, what: &str| {
            i32::try_from(x).map_err(|_| ExecError::Unsupported {
                reason: format!("fused backward: {what} {x} above 2^31-1"),
            })
        };
        let (lds, rows) = (int(a.lds, "score row length")?, int(a.rows, "chunk rows")?);
        let (b, h0, hk) = (
            int(a.batch, "batch")?,
            int(a.h0, "head")?,
            int(a.kv_head, "head")?,
        );
        let (i0, klo) = (int(a.i0, "row")?, int(a.kv_lo, "key")?);
        let hs = a.head_stride as i64;
        let (off, left, right, skv) = self.mask;
        let [mq, mk, mo, mv] = &self.maps;
        let [pq, pk, po, pv] = self.pos;
        let (scale_log2, cap_in, cap_out) = (self.scale_log2, self.cap_in, self.cap_out);
        // Units: (key tile, pair of query tiles, head of the group); persistent clusters of two
        // CTAs, at most one CTA per SM.
        let ktiles = a.n.div_ceil(BWD_TILE);
        let qpairs = a.rows.div_ceil(2 * BWD_TILE);
        let units = ktiles * qpairs * a.heads;
        let clusters = units.min((self.sm_count / 2).max(1) as usize) as u32;
        let (ktiles, qpairs, units) = (
            int(ktiles, "key tiles")?,
            int(qpairs, "query tiles")?,
            int(units, "score tiles")?,
        );
        let grid = (1, 2 * clusters, 1);
        // P and dS as (key, row, head) tensors in 64 x 64 boxes, for kernel variants that store
        // them with TMA (`bwd_scores`' last parameters). The box, not the kernel, clips rows past
        // `rows` and keys past `lds`, as the threads' stores do.
        let (cols, nrows, heads) = (a.lds as u64, a.rows as u64, a.heads as u64);
        let score_map = |addr: u64| {
            encode_tiled(
                self.dtype,
                addr,
                &[cols, nrows, heads],
                &[2 * cols, 2 * cols * nrows],
                &[64, 64, 1],
            )
        };
        let (mp, mds) = (score_map(a.p)?, score_map(a.ds)?);
        // SAFETY: argument list matches `bwd_scores`; the plan sized P and dS (heads x rows x
        // lds), LSE and D; the maps describe the call's live Q, K, dO, V, P and dS.
        unsafe {
            launch_cluster(
                &self.var.bwd_scores,
                grid,
                self.var.bwd_shared,
                stream as drv_sys::CUstream,
                &mut params![
                    *mq, *mk, *mo, *mv, a.p, a.ds, lds, rows, b, h0, hk, i0, klo, ktiles, qpairs,
                    units, a.lse, a.dvec, hs, off, left, right, skv, scale_log2, pq, pk, po, pv,
                    cap_in, cap_out, mp, mds
                ],
            )
        }
    }
}

/// Launches `f` as clusters of two CTAs along y, [`THREADS`] threads each.
///
/// # Safety
/// `params` must match the kernel's signature, and every buffer it names must be live.
unsafe fn launch_cluster(
    f: &CudaFunction,
    grid: (u32, u32, u32),
    shared: u32,
    stream: drv_sys::CUstream,
    params: &mut [*mut c_void],
) -> Result<(), ExecError> {
    // SAFETY: zero is a valid bit pattern for the attribute (a union of plain data).
    let mut attr: drv_sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = drv_sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = 1;
    attr.value.clusterDim.y = 2;
    attr.value.clusterDim.z = 1;
    let cfg = drv_sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: THREADS,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: shared,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: per the contract.
    unsafe {
        drv_sys::cuLaunchKernelEx(
            &cfg,
            f.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
        .result()
    }
    .map_err(drv)
}

/// Launches `f` on a raw stream.
///
/// # Safety
/// `params` must match the kernel's signature, and every buffer it names must be live.
unsafe fn launch_raw(
    f: &CudaFunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared: u32,
    stream: drv_sys::CUstream,
    params: &mut [*mut c_void],
) -> Result<(), ExecError> {
    // SAFETY: per the contract.
    unsafe { drv_result::launch_kernel(f.cu_function(), grid, block, shared, stream, params) }
        .map_err(drv)
}

/// The executor is a shared handle ([`crate::fused::create`] registers an `Arc<Fused>`): its
/// plans keep it alive.
impl Executor for Arc<Fused> {
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

    /// The warm-up: checks the problem and compiles and loads the variant now, not inside a
    /// graph capture.
    fn plan(&self, p: &AttentionProblem, dir: Direction) -> Result<Arc<dyn Plan>, ExecError> {
        let workspace = self.workspace_for(p, dir)?;
        Ok(Arc::new(FusedPlan(StreamPlan {
            ex: Arc::clone(self),
            p: p.clone(),
            dir,
            workspace,
        })))
    }
}

/// The fused executor's plan: the shared stream plan, with a host path that uploads a
/// learnable sink's logits and downloads their gradient (the shared host path carries none).
struct FusedPlan(StreamPlan<Fused>);

impl Plan for FusedPlan {
    fn executor(&self) -> &str {
        self.0.executor()
    }

    fn direction(&self) -> Direction {
        self.0.direction()
    }

    fn workspace_bytes(&self) -> Result<u64, ExecError> {
        self.0.workspace_bytes()
    }

    unsafe fn enqueue(&self, io: &DeviceIo, launch: &StreamLaunch) -> Result<(), ExecError> {
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { self.0.enqueue(io, launch) }
    }

    unsafe fn run_device(&self, io: &DeviceIo) -> Result<ExecStats, ExecError> {
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { self.0.run_device(io) }
    }

    fn run_host(&self, io: HostIo<'_>) -> Result<HostOutput, ExecError> {
        let (ex, p) = (&self.0.ex, &self.0.p);
        if p.softmax != SoftmaxKind::Learnable {
            return self.0.run_host(io);
        }
        let bufs = &ex.buffers;
        match (self.0.dir, io) {
            (Direction::Forward, HostIo::Forward(inputs)) => {
                validate_forward_inputs(p, &inputs)?;
                let sink = upload_sink(bufs, p, inputs.sink)?;
                bufs.forward_on_host(p, &inputs, |args| {
                    let args = DeviceForwardArgs {
                        sink: sink.ptr(),
                        ..*args
                    };
                    ex.fwd_impl(p, &args)
                })
                .map(HostOutput::Forward)
            }
            (Direction::Backward, HostIo::Backward(inputs)) => {
                validate_backward_inputs(p, &inputs)?;
                let sink = upload_sink(bufs, p, inputs.sink)?;
                let d_sink = bufs.alloc(4 * p.heads_q)?;
                let mut out = bufs.backward_on_host(p, &inputs, |args| {
                    let args = DeviceBackwardArgs {
                        sink: sink.ptr(),
                        d_sink: d_sink.ptr(),
                        ..*args
                    };
                    ex.bwd_impl(p, &args)
                })?;
                out.d_sink = bufs.download_f32(&d_sink, p.heads_q)?;
                Ok(HostOutput::Backward(out))
            }
            (dir, io) => Err(direction_mismatch(dir, io.direction())),
        }
    }
}

/// A learnable sink's logits on the device: `[h_q]` fp32, or `InvalidInput` without them.
fn upload_sink(
    bufs: &Chunked,
    p: &AttentionProblem,
    sink: Option<&[f32]>,
) -> Result<DeviceBuffer, ExecError> {
    let Some(sink) = sink.filter(|s| s.len() == p.heads_q) else {
        return Err(ExecError::invalid(format!(
            "a learnable sink needs its logits: {} fp32 values, one per query head",
            p.heads_q
        )));
    };
    let bits: Vec<u16> = sink
        .iter()
        .flat_map(|x| [x.to_bits() as u16, (x.to_bits() >> 16) as u16])
        .collect();
    bufs.upload(&bits)
}

impl StreamKernels for Fused {
    const NAME: &'static str = NAME;

    /// The stream path's forward: checks, then enqueues (with per-sequence lengths) the
    /// sequence table's upload and the padding rows, V's transpose and the fused kernel.
    fn enqueue_fwd(
        &self,
        p: &AttentionProblem,
        a: &DeviceForwardArgs,
        launch: &StreamLaunch,
    ) -> Result<(), ExecError> {
        super::check_problem(p)?;
        Chunked::check_ptrs(&[
            ("q", a.q),
            ("k", a.k),
            ("v", a.v),
            ("o", a.o),
            ("lse", a.lse),
        ])?;
        check_sink(p, a.sink, None)?;
        self.check_launch(p, launch)?;
        let var = self.variant(p)?;
        self.buffers.context().bind_to_thread().map_err(drv)?;
        let stream = launch.stream as drv_sys::CUstream;
        let vt = launch.workspace;
        let table = seq_table(p);
        let tab = vt + transposed_v_bytes(p);
        if !table.is_empty() {
            self.write_table(&var, stream, tab, &table)?;
        }
        let padded = p.seqlens.is_some() && !p.is_packed();
        let dv = p.head_dim_v as i32;
        let hkv = p.heads_kv as i32;
        let (vs, qs, os) = (p.layout.v, p.layout.q, p.layout.o);
        let (vsb, vsh, vss) = (vs.batch as i64, vs.head as i64, vs.seq as i64);
        // V^T columns (keys) and slabs: [b * h_kv] slabs of round_up(s_kv, 64) columns, or with
        // per-sequence lengths [h_kv] slabs of every sequence's keys from a multiple of 64.
        let (vcols, vslabs) = if table.is_empty() {
            (
                p.seqlen_kv.div_ceil(BLOCK_N) * BLOCK_N,
                p.batch * p.heads_kv,
            )
        } else {
            (seq_v_columns(p), p.heads_kv)
        };
        let vgrid = (
            (vcols as u32).div_ceil(32),
            (dv as u32).div_ceil(32),
            vslabs as u32,
        );
        if table.is_empty() {
            let (skv, skv_pad) = (p.seqlen_kv as i32, vcols as i32);
            // SAFETY: argument list matches `transpose_v`; V spans its strides, the workspace
            // holds b*h_kv*dv*skv_pad elements (checked above).
            unsafe {
                launch_raw(
                    &var.transpose,
                    vgrid,
                    (32, 8, 1),
                    0,
                    stream,
                    &mut params![a.v, vt, skv, skv_pad, dv, hkv, vsb, vsh, vss],
                )?;
            }
        } else {
            let (cols, nseq) = (vcols as i32, p.batch as i32);
            // SAFETY: argument list matches `transpose_v_seq`; V spans its strides, the
            // workspace holds h_kv*dv*cols elements and then the table (written above).
            unsafe {
                launch_raw(
                    &var.transpose_seq,
                    vgrid,
                    (32, 8, 1),
                    0,
                    stream,
                    &mut params![a.v, vt, cols, dv, tab, nseq, vsb, vsh, vss],
                )?;
            }
        }
        let (osb, osh, oss) = (os.batch as i64, os.head as i64, os.seq as i64);
        let hq = p.heads_q as i32;
        let rows_q = p.rows_q() as i32;
        if padded {
            let n = p.batch * p.heads_q * p.rows_q() * p.head_dim_v / 8;
            let nb = p.batch as i32;
            // SAFETY: argument list matches `seq_pad_fwd`; O and LSE span the problem's rows,
            // the table has one entry per batch.
            unsafe {
                launch_raw(
                    &var.seq_pad_fwd,
                    (grid_for(n), 1, 1),
                    (256, 1, 1),
                    0,
                    stream,
                    &mut params![a.o, a.lse, tab, nb, hq, rows_q, dv, osb, osh, oss],
                )?;
            }
        }
        let m = p.effective_mask();
        let (off, left, right) = (m.offset, m.left.unwrap_or(-1), m.right.unwrap_or(-1));
        let sq = p.seqlen_q as i32;
        let skv_all = p.seqlen_kv as i32;
        let group = (p.heads_q / p.heads_kv) as i32;
        let dqk = p.head_dim_qk as i32;
        let scale_log2 = (p.softmax_scale * std::f64::consts::LOG2_E) as f32;
        // Soft-capping folds the scale into the capped scores (scale_log2 = 1).
        let (scale_log2, cap_in, cap_out) = match p.softcap {
            Some(c) => (
                1.0f32,
                (p.softmax_scale / c) as f32,
                (c * std::f64::consts::LOG2_E) as f32,
            ),
            None => (scale_log2, 0.0f32, 0.0f32),
        };
        let sink_mode: i32 = match p.softmax {
            SoftmaxKind::Vanilla => 0,
            SoftmaxKind::OffByOne => 1,
            SoftmaxKind::Learnable => 2,
        };
        let sink = a.sink;
        let seqtab: u64 = if table.is_empty() { 0 } else { tab };
        let lse_rows = p.rows_q() as i64;
        let (qsb, qsh, qss) = (qs.batch as i64, qs.head as i64, qs.seq as i64);
        let maps = TensorMaps::encode(p, a.k, vt, vcols as u64, vslabs as u64)?;
        let (pos_row, pos_head) = (maps.pos_row, maps.pos_head);
        // Query tiles (of the longest sequence) rounded up to whole clusters of two.
        let longest = p.longest_seqs().0;
        let tiles = longest.div_ceil(BLOCK_M).div_ceil(2) as u32 * 2;
        if tiles == 0 {
            return Ok(());
        }
        // SAFETY: argument list matches `fused_fwd`; pointers checked by the caller's contract;
        // the tensor maps live until the launch returns (the driver copies parameters).
        unsafe {
            launch_cluster(
                &var.fwd,
                ((p.batch * p.heads_q) as u32, tiles, 1),
                var.shared,
                stream,
                &mut params![
                    maps.k, maps.v, a.q, a.o, a.lse, sq, skv_all, hq, group, dqk, dv, qsb, qsh,
                    qss, osb, osh, oss, off, left, right, scale_log2, pos_row, pos_head, cap_in,
                    cap_out, sink_mode, sink, seqtab, lse_rows
                ],
            )
        }
    }
    /// The stream path's backward: the chunked executor's backward plan with P and dS written by
    /// `bwd_scores` (no fp32 scores in device memory), then its cuBLAS GEMMs for dQ, dK, dV.
    /// With per-sequence lengths: one such plan per sequence (its rows, its mask), after the
    /// rows no sequence owns are zeroed. A learnable sink's gradient comes last.
    fn enqueue_bwd(
        &self,
        p: &AttentionProblem,
        a: &DeviceBackwardArgs,
        launch: &StreamLaunch,
    ) -> Result<(), ExecError> {
        super::check_problem(p)?;
        Chunked::check_ptrs(&crate::chunked::backward_ptrs(a))?;
        check_sink(p, a.sink, Some(a.d_sink))?;
        let var = self.variant(p)?;
        self.buffers.context().bind_to_thread().map_err(drv)?;
        let lay = self.backward_layout(p)?;
        if launch.workspace_bytes < lay.total {
            return Err(ExecError::invalid(format!(
                "workspace of {} bytes, the call needs {}",
                launch.workspace_bytes, lay.total
            )));
        }
        // The plan sees only its part (cuBLAS takes whatever the plan is given past its own).
        let plan_launch = if lay.total == lay.plan {
            *launch
        } else {
            StreamLaunch {
                workspace_bytes: lay.plan,
                ..*launch
            }
        };
        let stream = launch.stream as drv_sys::CUstream;
        let ws = launch.workspace;
        let sm = self.buffers.sm_count();
        if p.seqlens.is_none() {
            let scorer = ScoreLaunch::new(p, var.clone(), a, sm)?;
            let pp = plan_problem(p);
            self.buffers
                .enqueue_backward_plan(&pp, a, &plan_launch, Some(&scorer))?;
        } else {
            self.enqueue_bwd_per_sequence(p, a, &var, &lay, &plan_launch)?;
        }
        if p.softmax == SoftmaxKind::Learnable {
            let os = p.layout.o;
            let (osb, osh, oss) = (os.batch as i64, os.head as i64, os.seq as i64);
            let part = ws + lay.sink_off;
            let table = if p.seqlens.is_some() {
                ws + lay.table_off
            } else {
                0
            };
            let packed = i32::from(p.is_packed());
            let (nb, hq) = (p.batch_dim() as i32, p.heads_q as i32);
            let (rows, dv) = (p.rows_q() as i32, p.head_dim_v as i32);
            // SAFETY: argument lists match `sink_grad_partial` / `sink_grad_final`; O, dO and LSE
            // span the problem, the partial sums hold h_q * SINK_CHUNKS floats, the sink and its
            // gradient h_q (checked non-null).
            unsafe {
                launch_raw(
                    &var.sink_grad_partial,
                    (p.heads_q as u32, SINK_CHUNKS as u32, 1),
                    (256, 1, 1),
                    0,
                    stream,
                    &mut params![
                        a.o, a.d_o, a.lse, a.sink, part, table, packed, nb, hq, rows, dv, osb, osh,
                        oss
                    ],
                )?;
                launch_raw(
                    &var.sink_grad_final,
                    ((p.heads_q as u32).div_ceil(128), 1, 1),
                    (128, 1, 1),
                    0,
                    stream,
                    &mut params![part, a.d_sink, hq],
                )?;
            }
        }
        Ok(())
    }
    fn fwd_impl(
        &self,
        p: &AttentionProblem,
        a: &DeviceForwardArgs,
    ) -> Result<ExecStats, ExecError> {
        let out_bytes = 2 * p.o_span() as u64 + 4 * p.lse_len() as u64;
        self.timed_call(p, Direction::Forward, out_bytes, |launch| {
            self.enqueue_fwd(p, a, launch)
        })
    }
    fn bwd_impl(
        &self,
        p: &AttentionProblem,
        a: &DeviceBackwardArgs,
    ) -> Result<ExecStats, ExecError> {
        let out_bytes = 2 * (p.q_span() + p.k_span() + p.v_span()) as u64;
        self.timed_call(p, Direction::Backward, out_bytes, |launch| {
            self.enqueue_bwd(p, a, launch)
        })
    }

    fn buffers(&self) -> &Chunked {
        &self.buffers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generated_wrappers_name_every_accumulator_once() {
        let s = wgmma_wrapper("w", 256, "bf16", true);
        assert!(s.contains("m64n256k16.f32.bf16.bf16"));
        assert!(s.contains("\"+f\"(d[127])") && !s.contains("d[128]"));
        // Operands: 128 accumulators, 4 A registers (%128..%131), the B descriptor (%132).
        assert!(s.contains("{%128, %129, %130, %131}, %132, p, 1, 1, 0;"));
        let s = wgmma_wrapper("w", 64, "f16", false);
        assert!(s.contains("m64n64k16.f32.f16.f16"));
        assert!(s.contains("setp.ne.b32 p, %34, 0;"));
        assert!(s.contains("%32, %33, p, 1, 1, 0, 0;"));
    }

    #[test]
    fn the_source_hook_compiles_the_named_file_or_an_error_naming_it() {
        let key = |bf16, dqk_pad, dv_pad| VariantKey {
            bf16,
            dqk_pad,
            dv_pad,
            seq: false,
            softcap: false,
        };
        let built_in = kernel_source_with(key(true, 512, 512), None);
        assert!(built_in.contains("fused_fwd(") && built_in.contains("#define DQK 512"));
        let dir = std::env::temp_dir().join(format!("attn-policy-hook-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("variant.cu");
        std::fs::write(&file, "// variant body marker\n").unwrap();
        let s = kernel_source_with(key(false, 320, 384), Some(&file));
        assert!(s.contains("// variant body marker") && !s.contains("fused_fwd("));
        // The defines, wrappers and prelude still come first.
        assert!(s.contains("#define DV 384") && s.contains("wg_ss_o") && s.contains("row_range"));
        let missing = dir.join("missing.cu");
        let s = kernel_source_with(key(true, 512, 512), Some(&missing));
        assert!(s.contains("#error") && s.contains("missing.cu") && !s.contains("fused_fwd("));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// ptxas notes where it cannot keep the wgmma pipeline asynchronous: C7514 / C7515 (every
    /// wgmma of the kernel serialized: an accumulator read or written while, as far as ptxas can
    /// tell, a wgmma may still write it) and C7517 (a wait inserted). Kernels still compute the
    /// right values then, only slower (the wgmma no longer overlap other work): no numerics test
    /// notices, and a restructured loop easily triggers them (docs/fused.md).
    fn assert_wgmma_stays_asynchronous(ptxas: &Path, ptx: &[(String, String)]) {
        let dir = std::env::temp_dir().join(format!("attn-policy-ptxas-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, p) in ptx {
            let file = dir.join(format!("{name}.ptx"));
            std::fs::write(&file, p).unwrap();
            let out = std::process::Command::new(ptxas)
                .args(["-arch=sm_90a", "-v", "-o", "/dev/null"])
                .arg(&file)
                .output()
                .unwrap_or_else(|e| panic!("running {}: {e}", ptxas.display()));
            let log = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "ptxas failed on {name}:\n{log}");
            for note in ["C7514", "C7515", "C7517"] {
                let hit = log.lines().find(|l| l.contains(note));
                assert!(hit.is_none(), "{name}: {}", hit.unwrap_or_default());
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn nvrtc_compiles_the_variants_for_sm90a() {
        // A developer's quick check of one kernel edit; CI sets nothing and compiles them all.
        let only = std::env::var("ATTN_POLICY_NVRTC_ONLY").unwrap_or_default();
        match compile_only(&only) {
            Ok(ptx) => {
                if !only.is_empty() {
                    println!(
                        "ATTN_POLICY_NVRTC_ONLY={only}: {} variant(s) compiled",
                        ptx.len()
                    );
                }
                assert!(!ptx.is_empty(), "no variant name contains {only:?}");
                if let Ok(dir) = std::env::var("ATTN_POLICY_DUMP_PTX") {
                    // `ptxas -v` on these reports registers and spills (adapters/bench/ptxas_check.sh).
                    std::fs::create_dir_all(&dir).unwrap();
                    for (name, p) in &ptx {
                        std::fs::write(format!("{dir}/{name}.ptx"), p).unwrap();
                    }
                }
                for (_, p) in &ptx {
                    assert!(p.contains(".target sm_90a"));
                    assert!(p.contains("wgmma.mma_async.sync.aligned.m64n64k16"));
                    // P leaves the score warpgroup as 16-byte matrix rows (measured: 0.8%
                    // faster at s=32k than 32-bit stores, docs/fused.md).
                    assert!(p.contains("stmatrix.sync.aligned.m8n8.x4.shared.b16"));
                }
                match std::env::var_os("PTXAS") {
                    Some(ptxas) => assert_wgmma_stays_asynchronous(Path::new(&ptxas), &ptx),
                    None => println!("ptxas check skipped (set PTXAS to a CUDA 13 ptxas)"),
                }
            }
            Err(ExecError::NoDevice { reason }) => {
                println!("skipped: {reason} (set LD_LIBRARY_PATH to an NVRTC 13 library)");
            }
            Err(e) => panic!("{e}"),
        }
    }
}
