//! Per-sequence lengths around the cuDNN call: the per-call tensors the padding-mask graphs
//! read (seq lengths, ragged offsets), LSE between cuDNN's dense Stats and the caller's layout,
//! and zeroed padding rows (cuDNN promises nothing past a sequence's length).
//!
//! Everything runs on the call's stream as small NVRTC kernels (the lengths travel as kernel
//! parameters, no host-to-device copy), so a call stays stream-ordered and capturable.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, result as drv, sys as drv_sys};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};

use super::io::IoPtrs;
use crate::cudnn::graph::VarlenScratch;
use crate::cudnn::spec::Direction;
use crate::problem::{AttentionProblem, SeqPacking};

const SRC: &str = include_str!("varlen.cu");

/// Sequences per `varlen_setup` launch (`VARLEN_CHUNK` in varlen.cu): the chunk travels as a
/// kernel parameter, 2 KiB, under the 4 KiB parameter limit.
const CHUNK: usize = 128;

/// `struct VarlenChunk` of varlen.cu.
#[repr(C)]
#[derive(Clone, Copy)]
struct VarlenChunk {
    b0: i32,
    n: i32,
    len_q: [i32; CHUNK],
    len_kv: [i32; CHUNK],
    start_q: [i32; CHUNK],
    start_kv: [i32; CHUNK],
}

/// The compiled kernels of one device.
pub(crate) struct VarlenKernels {
    setup: CudaFunction,
    lse_out: CudaFunction,
    lse_in: CudaFunction,
    zero_rows: CudaFunction,
}

fn nvrtc(arch: &'static str) -> Result<cudarc::nvrtc::Ptx, String> {
    let opts = CompileOptions {
        arch: Some(arch),
        name: Some("cudnn_varlen.cu".into()),
        ..Default::default()
    };
    compile_ptx_with_opts(SRC, opts).map_err(|e| format!("NVRTC (cudnn varlen kernels): {e:?}"))
}

/// Compiles the kernels without a device (the NVRTC test).
#[cfg(test)]
fn compile_only(arch: &'static str) -> Result<(), String> {
    nvrtc(arch).map(|_| ())
}

impl VarlenKernels {
    pub(crate) fn load(ctx: &Arc<CudaContext>, cc: (i32, i32)) -> Result<VarlenKernels, String> {
        let ptx = nvrtc(crate::chunked::nvrtc_arch(cc))?;
        let m = ctx.load_module(ptx).map_err(|e| format!("{e:?}"))?;
        let f = |n: &str| m.load_function(n).map_err(|e| format!("{n}: {e:?}"));
        Ok(VarlenKernels {
            setup: f("varlen_setup")?,
            lse_out: f("varlen_lse_out")?,
            lse_in: f("varlen_lse_in")?,
            zero_rows: f("varlen_zero_rows")?,
        })
    }
}

/// Kernel parameters as the driver wants them: pointers to each argument's value.
macro_rules! params {
    ($($x:expr),* $(,)?) => {
        [$((&$x) as *const _ as *mut c_void),*]
    };
}

const THREADS: u32 = 256;

fn grid(total: u64) -> u32 {
    total.div_ceil(THREADS as u64).clamp(1, 4096) as u32
}

/// # Safety
/// `params` must match the kernel's signature and every pointer in it must be live.
unsafe fn launch(
    f: &CudaFunction,
    blocks: u32,
    stream: drv_sys::CUstream,
    params: &mut [*mut c_void],
) -> Result<(), drv::DriverError> {
    // SAFETY: per the contract.
    unsafe {
        drv::launch_kernel(
            f.cu_function(),
            (blocks, 1, 1),
            (THREADS, 1, 1),
            0,
            stream,
            params,
        )
    }
}

/// The per-call pieces of a varlen call: scratch addresses and the problem's extents.
pub(crate) struct VarlenCall<'a> {
    pub(crate) k: &'a VarlenKernels,
    pub(crate) p: &'a AttentionProblem,
    pub(crate) vs: VarlenScratch,
    /// Device address of the executor scratch (offset 0).
    pub(crate) ws: u64,
    pub(crate) stream: drv_sys::CUstream,
}

impl VarlenCall<'_> {
    fn at(&self, off: usize) -> u64 {
        self.ws + off as u64
    }

    fn packed(&self) -> i32 {
        i32::from(self.vs.packing == SeqPacking::Packed)
    }

    /// Before cuDNN: the lengths, row starts and ragged offsets; in the backward, the dense
    /// Stats from the caller's LSE.
    ///
    /// # Safety
    /// `ws` must hold the graph's scratch; `io` the problem's live tensors on this device.
    pub(crate) unsafe fn before(
        &self,
        dir: Direction,
        io: &IoPtrs,
    ) -> Result<(), drv::DriverError> {
        let p = self.p;
        let Some(s) = &p.seqlens else {
            return Ok(());
        };
        let l = &p.layout;
        let (rows_q, rows_kv) = (p.rows_q() as i64, p.rows_kv() as i64);
        let batch = p.batch as i32;
        let packed = self.packed();
        let wide = i32::from(self.vs.ragged_wide);
        let (qb, qs) = (l.q.batch as i64, l.q.seq as i64);
        let (kb, ks) = (l.k.batch as i64, l.k.seq as i64);
        let (vb, vs) = (l.v.batch as i64, l.v.seq as i64);
        let (ob, os) = (l.o.batch as i64, l.o.seq as i64);
        let (seq_q, seq_kv) = (self.at(self.vs.seq_q), self.at(self.vs.seq_kv));
        let (start_q, start_kv) = (self.at(self.vs.start_q), self.at(self.vs.start_kv));
        let [rq, rk, rv, ro] = self
            .vs
            .ragged
            .map_or([0u64; 4], |r| r.map(|off| self.at(off)));
        for b0 in (0..p.batch).step_by(CHUNK) {
            let n = CHUNK.min(p.batch - b0);
            let mut c = VarlenChunk {
                b0: b0 as i32,
                n: n as i32,
                len_q: [0; CHUNK],
                len_kv: [0; CHUNK],
                start_q: [0; CHUNK],
                start_kv: [0; CHUNK],
            };
            for i in 0..n {
                let (q, kv) = p.seq_rows(b0 + i);
                c.len_q[i] = s.q[b0 + i] as i32;
                c.len_kv[i] = s.kv[b0 + i] as i32;
                c.start_q[i] = q.start as i32;
                c.start_kv[i] = kv.start as i32;
            }
            let mut params = params![
                c, batch, packed, wide, rows_q, rows_kv, qb, qs, kb, ks, vb, vs, ob, os, seq_q,
                seq_kv, start_q, start_kv, rq, rk, rv, ro
            ];
            // SAFETY: the arguments match varlen_setup; the scratch holds every array (b or
            // b + 1 entries); the driver copies the parameters at launch.
            unsafe { launch(&self.k.setup, grid(n as u64), self.stream, &mut params) }?;
        }
        if dir == Direction::Backward {
            let (heads, s_max) = (p.heads_q as i32, p.seqlen_q as i32);
            let dense = self.at(self.vs.stats);
            let mut params = params![
                io.lse, dense, seq_q, start_q, batch, heads, s_max, rows_q, packed
            ];
            let total = (p.batch * p.heads_q * p.seqlen_q) as u64;
            // SAFETY: LSE spans [batch_dim, h_q, rows_q]; the dense copy [b, h_q, s_q] in scratch.
            unsafe { launch(&self.k.lse_in, grid(total), self.stream, &mut params) }?;
        }
        Ok(())
    }

    /// After cuDNN: LSE in the caller's layout (-inf in padding rows), and zeroed padding rows
    /// of O (forward) or dQ, dK, dV (backward).
    ///
    /// # Safety
    /// As for [`VarlenCall::before`].
    pub(crate) unsafe fn after(&self, dir: Direction, io: &IoPtrs) -> Result<(), drv::DriverError> {
        let p = self.p;
        let packed = self.packed();
        let batch = p.batch as i32;
        let bdim = p.batch_dim() as i32;
        let (seq_q, seq_kv) = (self.at(self.vs.seq_q), self.at(self.vs.seq_kv));
        let (start_q, start_kv) = (self.at(self.vs.start_q), self.at(self.vs.start_kv));
        if dir == Direction::Forward {
            let (heads, s_max, rows) = (p.heads_q as i32, p.seqlen_q as i32, p.rows_q() as i64);
            let dense = self.at(self.vs.stats);
            let mut params = params![
                dense, io.lse, seq_q, start_q, batch, heads, s_max, bdim, rows, packed
            ];
            // SAFETY: as in `before`.
            unsafe {
                launch(
                    &self.k.lse_out,
                    grid(p.lse_len() as u64),
                    self.stream,
                    &mut params,
                )
            }?;
        }
        // a packed batch has no padding rows: every token belongs to a sequence
        if packed == 1 {
            return Ok(());
        }
        let l = &p.layout;
        let tensors = match dir {
            Direction::Forward => vec![(io.o, l.o, p.heads_q, p.rows_q(), p.head_dim_v, true)],
            Direction::Backward => vec![
                (io.dq, l.q, p.heads_q, p.rows_q(), p.head_dim_qk, true),
                (io.dk, l.k, p.heads_kv, p.rows_kv(), p.head_dim_qk, false),
                (io.dv, l.v, p.heads_kv, p.rows_kv(), p.head_dim_v, false),
            ],
        };
        for (ptr, st, heads, rows, cols, is_q) in tensors {
            let (len, start) = if is_q {
                (seq_q, start_q)
            } else {
                (seq_kv, start_kv)
            };
            let (heads, rows, cols) = (heads as i32, rows as i64, cols as i32);
            let (sb, sh, ss) = (st.batch as i64, st.head as i64, st.seq as i64);
            let mut params = params![ptr, len, start, bdim, heads, rows, cols, sb, sh, ss];
            let total = (bdim as u64) * (heads as u64) * (rows as u64) * (cols as u64);
            // SAFETY: the tensor spans its strides over [batch_dim, heads, rows, cols].
            unsafe { launch(&self.k.zero_rows, grid(total), self.stream, &mut params) }?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvrtc_compiles_cudnn_varlen_kernels() {
        // SAFETY: probes library presence only.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            println!(
                "skipped: NVRTC library not found (set LD_LIBRARY_PATH to an NVRTC 13 library)"
            );
            return;
        }
        for arch in ["sm_90", "sm_80"] {
            compile_only(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        }
    }

    #[test]
    fn the_chunk_fits_the_kernel_parameter_limit() {
        // 4 KiB for all parameters on every architecture; the chunk leaves room for the rest
        assert!(std::mem::size_of::<VarlenChunk>() + 20 * 8 <= 4096);
    }
}
