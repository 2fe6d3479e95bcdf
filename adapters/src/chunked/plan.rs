//! Device-independent orchestration of the chunked algorithm: chunk sizing, workspace layout,
//! and the exact sequence of GEMMs (as cuBLAS column-major calls) and kernels.
//!
//! Addresses are plain `u64` (CUDA device pointers, or offsets into the CPU mock's arena).

use super::ChunkedConfig;
use crate::executor::{DeviceBackwardArgs, DeviceForwardArgs, ExecError};
use crate::problem::{AttentionProblem, EffectiveMask, SeqRows, SoftmaxKind};

/// Element kind of a GEMM operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Elem {
    /// The problem's 16-bit dtype.
    Low,
    /// fp32.
    F32,
}

impl Elem {
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn bytes(self) -> u64 {
        match self {
            Elem::Low => 2,
            Elem::F32 => 4,
        }
    }
}

/// One `cublasGemmStridedBatchedEx` call (column-major semantics, fp32 compute):
/// `C_i = alpha * op(A_i) op(B_i) + beta * C_i`, `op(A_i)` is `m x k`, `op(B_i)` is `k x n`,
/// `X_i = X + i * stride_x` (strides in elements).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct CublasGemm {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: u64,
    pub lda: usize,
    pub stride_a: usize,
    pub b: u64,
    pub ldb: usize,
    pub stride_b: usize,
    pub c: u64,
    pub ldc: usize,
    pub stride_c: usize,
    pub c_elem: Elem,
    pub alpha: f32,
    pub beta: f32,
    pub batch: usize,
}

/// A row-major matrix operand: element `(r, c)` at `ptr + (r * ld + c) * elem`.
#[derive(Clone, Copy, Debug)]
struct RowMajor {
    ptr: u64,
    ld: usize,
    /// Batch stride in elements.
    stride: usize,
}

/// Row-major `C (M x N) = alpha op(A) op(B) + beta C` expressed as the column-major cuBLAS call
/// computing `C^T = op(B)^T op(A)^T`.
#[allow(clippy::too_many_arguments)]
fn gemm_rm(
    trans_a: bool,
    trans_b: bool,
    m: usize,
    n: usize,
    k: usize,
    a: RowMajor,
    b: RowMajor,
    c: RowMajor,
    c_elem: Elem,
    alpha: f32,
    beta: f32,
    batch: usize,
) -> CublasGemm {
    CublasGemm {
        trans_a: trans_b,
        trans_b: trans_a,
        m: n,
        n: m,
        k,
        a: b.ptr,
        lda: b.ld,
        stride_a: b.stride,
        b: a.ptr,
        ldb: a.ld,
        stride_b: a.stride,
        c: c.ptr,
        ldc: c.ld,
        stride_c: c.stride,
        c_elem,
        alpha,
        beta,
        batch,
    }
}

/// Fused forward softmax over a block of score rows (`heads` x `rows`, row `r*rows + i` at
/// `s + (r*rows + i) * lds` floats): writes `P` (dtype, same indexing, all `lds` columns, zeros
/// outside the admitted range) and `lse[r * lse_head_stride + i]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SoftmaxArgs {
    pub s: u64,
    pub p: u64,
    pub lds: usize,
    pub rows: usize,
    pub heads: usize,
    pub n: usize,
    /// Global query index of row 0.
    pub i0: usize,
    /// Global key index of column 0.
    pub kv_lo: usize,
    pub lse: u64,
    pub lse_head_stride: usize,
    pub mask: EffectiveMask,
    pub scale: f32,
    /// Soft-capping `c` (scores `c tanh(scale S / c)`), `None`: none.
    pub softcap: Option<f32>,
    /// The sink of the block's heads.
    pub sink: SinkArg,
}

/// The sink a softmax adds to each row's denominator (`exp(s_h - max)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SinkArg {
    None,
    /// Logit 0 for every head (off-by-one).
    Zero,
    /// fp32 logits, the block's head `r` at `ptr + 4 r` (learnable).
    Logits(u64),
}

impl SinkArg {
    /// The sink of the heads `h0..` of `p` whose logits (learnable) are at `sink`.
    fn of(p: &AttentionProblem, sink: u64, h0: usize) -> SinkArg {
        match p.softmax {
            SoftmaxKind::Vanilla => SinkArg::None,
            SoftmaxKind::OffByOne => SinkArg::Zero,
            SoftmaxKind::Learnable => SinkArg::Logits(sink + 4 * h0 as u64),
        }
    }
}

/// Fused backward elementwise: `P = exp(scale S - lse)`, `dS = P (dP - D)`, both dtype; with
/// soft-capping `P = exp(c t - lse)`, `dS = P (dP - D) (1 - t^2)`, `t = tanh(scale S / c)` (the
/// gradient with respect to `scale S`: the dQ / dK GEMMs multiply by `scale`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct BwdArgs {
    pub s: u64,
    pub dp: u64,
    pub p: u64,
    pub ds: u64,
    pub lds: usize,
    pub rows: usize,
    pub heads: usize,
    pub n: usize,
    pub i0: usize,
    pub kv_lo: usize,
    /// LSE and D of (row 0, head 0); head stride `head_stride`, row stride 1.
    pub lse: u64,
    pub dvec: u64,
    pub head_stride: usize,
    pub mask: EffectiveMask,
    pub scale: f32,
    pub softcap: Option<f32>,
}

/// `d_sink[h] = -sum_(b, i) exp(s_h - LSE[b, h, i]) D[b, h, i]` over the rows whose LSE is
/// finite and D non-zero (padding rows have D = 0, fully masked ones LSE = -inf), for the
/// `[batch, heads, rows]` contiguous LSE and D: overwrites `d_sink[0..heads]` (fp32), fixed
/// reduction order (deterministic).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SinkGradArgs {
    pub lse: u64,
    pub dvec: u64,
    pub sink: u64,
    pub d_sink: u64,
    pub batch: usize,
    pub heads: usize,
    pub rows: usize,
}

/// `D[b, h, i] = sum_d dO[b,h,i,d] * O[b,h,i,d]` into a contiguous `[b, h_q, s_q]` fp32 buffer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowDotArgs {
    pub o: u64,
    pub d_o: u64,
    pub out: u64,
    pub batch: usize,
    pub heads: usize,
    pub seqlen: usize,
    pub dim: usize,
    pub stride_b: usize,
    pub stride_h: usize,
    pub stride_s: usize,
}

/// Cast a contiguous fp32 `[rows, cols]` matrix into dtype rows at `dst + r * dst_ld`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CastArgs {
    pub src: u64,
    pub dst: u64,
    pub dst_ld: usize,
    pub rows: usize,
    pub cols: usize,
}

/// Fill `heads x rows` rows of `cols` dtype elements with zero: row `(h, r)` at
/// `dst + (h * head_stride + r * row_stride) * 2` bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ZeroRowsArgs {
    pub dst: u64,
    pub row_stride: usize,
    pub head_stride: usize,
    pub rows: usize,
    pub heads: usize,
    pub cols: usize,
}

/// Fill an fp32 `rows x cols` block with leading dimension `ld` with `value`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FillF32Args {
    pub dst: u64,
    pub ld: usize,
    pub rows: usize,
    pub cols: usize,
    pub value: f32,
}

/// The device operations the algorithm needs. All are stream-ordered.
pub(crate) trait Ops {
    fn gemm(&mut self, g: &CublasGemm) -> Result<(), ExecError>;
    fn softmax_fwd(&mut self, a: &SoftmaxArgs) -> Result<(), ExecError>;
    fn bwd_elementwise(&mut self, a: &BwdArgs) -> Result<(), ExecError>;
    fn row_dot(&mut self, a: &RowDotArgs) -> Result<(), ExecError>;
    fn cast_rows(&mut self, a: &CastArgs) -> Result<(), ExecError>;
    fn zero_rows(&mut self, a: &ZeroRowsArgs) -> Result<(), ExecError>;
    fn fill_f32(&mut self, a: &FillF32Args) -> Result<(), ExecError>;
    fn sink_grad(&mut self, a: &SinkGradArgs) -> Result<(), ExecError>;
    /// Only plans of kind [`PlanKind::BackwardFusedScores`] call it.
    fn bwd_scores(&mut self, a: &BwdScoresArgs) -> Result<(), ExecError>;
    /// Start `lanes` lanes, each ordered after everything enqueued so far; operations go to
    /// lane 0 until [`Ops::lane`] says otherwise. Lanes may run concurrently (CUDA streams).
    fn fork(&mut self, lanes: usize) -> Result<(), ExecError> {
        let _ = lanes;
        Ok(())
    }
    /// Send the following operations to `lane`.
    fn lane(&mut self, lane: usize) -> Result<(), ExecError> {
        let _ = lane;
        Ok(())
    }
    /// Order everything after this after all lanes' work; back to lane 0.
    fn join(&mut self) -> Result<(), ExecError> {
        Ok(())
    }
}

/// A kernel that writes a chunk's `P` and `dS` straight from Q, K, dO and V (the fused
/// executor's `bwd_scores`), in place of the two fp32 score GEMMs and `bwd_elementwise`.
pub(crate) trait ScoreKernel {
    /// Enqueue on `stream` (a `CUstream`).
    fn enqueue(&self, stream: u64, a: &BwdScoresArgs) -> Result<(), ExecError>;
}

/// One chunk of the fused-score backward: for the `heads` query heads `h0..h0 + heads` of KV
/// head `kv_head` in batch `batch`, rows `i0..i0 + rows` and keys `kv_lo..kv_lo + n`, write
/// `P = exp(scale S - lse)` and `dS = P (dP - D)` (dtype, zero outside the mask) with the same
/// indexing as [`BwdArgs`]: head `r`, row `i`, column `c` at element `(r * rows + i) * lds + c`,
/// all `lds` columns. `batch`, `i0` and `kv_lo` are tensor coordinates (batch index, physical
/// rows); the mask is the sequence's (`seq_mask`), in its own coordinates: row `i0 + i` is the
/// sequence's row `i0 + i - seq_q0`, key `kv_lo + c` its key `kv_lo + c - seq_kv0` (both 0
/// without per-sequence lengths).
#[derive(Clone, Copy, Debug)]
pub(crate) struct BwdScoresArgs {
    pub batch: usize,
    pub kv_head: usize,
    pub h0: usize,
    pub heads: usize,
    pub i0: usize,
    pub rows: usize,
    pub kv_lo: usize,
    pub n: usize,
    pub p: u64,
    pub ds: u64,
    pub lds: usize,
    /// LSE and D of (row 0, head 0); head stride `head_stride`, row stride 1.
    pub lse: u64,
    pub dvec: u64,
    pub head_stride: usize,
    // The fused executor's kernel reads none of these: it refuses per-sequence lengths and
    // soft-capping (its manifest), so its mask is the problem's and there is no cap.
    #[cfg_attr(not(test), allow(dead_code))]
    pub mask: EffectiveMask,
    #[cfg_attr(not(test), allow(dead_code))]
    pub seq_q0: usize,
    #[cfg_attr(not(test), allow(dead_code))]
    pub seq_kv0: usize,
    /// Soft-capping (see [`BwdArgs`]).
    #[cfg_attr(not(test), allow(dead_code))]
    pub softcap: Option<f32>,
}

/// What a plan is for; it decides which workspace buffers exist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PlanKind {
    Forward,
    /// fp32 S and dP buffers, P and dS by `bwd_elementwise`.
    Backward,
    /// P and dS only, written by [`Ops::bwd_scores`] (4 bytes per score instead of 12).
    BackwardFusedScores,
}

impl PlanKind {
    /// The chunked executor's own kinds.
    pub(crate) fn of(backward: bool) -> PlanKind {
        if backward {
            PlanKind::Backward
        } else {
            PlanKind::Forward
        }
    }
}

/// Chunking and workspace layout (byte offsets from the workspace base, 256-aligned).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub kind: PlanKind,
    /// Concurrent lanes of (batch, KV head) groups (streams on CUDA); each lane has its own
    /// score buffers and dK/dV accumulators, `lane_bytes` apart (the `off_*` of those buffers
    /// are lane 0's).
    pub lanes: usize,
    pub lane_bytes: u64,
    pub chunk_rows: usize,
    /// Row blocks per backward chunk ([`ChunkedConfig::bwd_row_blocks`], at least 1).
    pub row_blocks: usize,
    /// Padded key count of the widest chunk (leading dimension bound).
    pub lds_max: usize,
    pub off_s: u64,
    pub off_p: u64,
    pub off_dp: u64,
    pub off_ds: u64,
    pub off_acc_dk: u64,
    pub off_acc_dv: u64,
    pub off_d: u64,
    pub bytes: u64,
}

fn align256(x: u64) -> u64 {
    x.div_ceil(256) * 256
}

/// Leading dimension of the score buffers for `n` keys: a multiple of 8 so every row starts
/// 32-byte aligned (fp32) and 16-byte aligned (dtype).
pub(crate) fn lds_for(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// Workspace layout for a chunk size.
fn layout(p: &AttentionProblem, chunk: usize, kind: PlanKind, lanes: usize) -> Plan {
    let ratio = p.group_size() as u64;
    let lds = lds_for(p.seqlen_kv);
    let block = ratio * chunk as u64 * lds as u64;
    let mut off = 0u64;
    let mut take = |bytes: u64| {
        let o = off;
        off = align256(off + bytes);
        o
    };
    let backward = kind != PlanKind::Forward;
    let fp32_scores = kind != PlanKind::BackwardFusedScores;
    // One lane's buffers: scores, then the fp32 dK/dV accumulators.
    let off_s = if fp32_scores { take(block * 4) } else { 0 };
    let off_p = take(block * 2);
    let (off_dp, off_ds, off_acc_dk, off_acc_dv) = if backward {
        (
            if fp32_scores { take(block * 4) } else { 0 },
            take(block * 2),
            take(p.seqlen_kv as u64 * p.head_dim_qk as u64 * 4),
            take(p.seqlen_kv as u64 * p.head_dim_v as u64 * 4),
        )
    } else {
        (0, 0, 0, 0)
    };
    let lane_bytes = off;
    // More than one group in flight only where there are groups to overlap.
    let lanes = if kind == PlanKind::BackwardFusedScores {
        lanes.min(p.batch * p.heads_kv).max(1)
    } else {
        1
    };
    // D (one float per query row), shared by the lanes.
    let off_d = lanes as u64 * lane_bytes;
    let bytes = if backward {
        align256(off_d + p.lse_len() as u64 * 4)
    } else {
        lane_bytes
    };
    Plan {
        kind,
        lanes,
        lane_bytes,
        chunk_rows: chunk,
        row_blocks: 1,
        lds_max: lds,
        off_s,
        off_p,
        off_dp,
        off_ds,
        off_acc_dk,
        off_acc_dv,
        off_d,
        bytes: bytes.max(256),
    }
}

/// Choose the chunk: as large as the config allows, halved until the workspace fits the budget.
pub(crate) fn make_plan(
    p: &AttentionProblem,
    cfg: &ChunkedConfig,
    kind: PlanKind,
) -> Result<Plan, ExecError> {
    let ratio = p.group_size().max(1);
    let min = cfg.min_chunk_rows.max(1);
    // A fused-score plan keeps 4 bytes per score instead of 12, so it aims at twice the rows per
    // GEMM (H200, Gemma shape b1 hq32 hkv4 s=16k: chunks of 1024 rows 69.4 ms, of 512 81.4 ms).
    let target = if kind == PlanKind::BackwardFusedScores {
        cfg.target_rows_per_gemm.saturating_mul(2)
    } else {
        cfg.target_rows_per_gemm
    };
    let mut chunk = (target / ratio).clamp(min, cfg.max_chunk_rows.max(min));
    chunk = chunk.min(p.seqlen_q.max(1));
    loop {
        let plan = layout(p, chunk, kind, 1);
        if plan.bytes <= cfg.workspace_budget {
            // Then as many lanes as fit at that chunk: larger chunks gain more than lanes (H200,
            // s=32k: one lane with chunks of 2048 rows 132.7 ms, two with 1024 138.9 ms).
            let mut best = plan;
            for lanes in 2..=cfg.fused_score_lanes {
                let wider = layout(p, chunk, kind, lanes);
                if wider.lanes <= best.lanes || wider.bytes > cfg.workspace_budget {
                    break;
                }
                best = wider;
            }
            return Ok(Plan {
                row_blocks: cfg.bwd_row_blocks.max(1),
                ..best
            });
        }
        if chunk <= min {
            return Err(ExecError::Workspace {
                needed: plan.bytes,
                budget: cfg.workspace_budget,
            });
        }
        chunk = (chunk / 2).max(min);
    }
}

/// Byte address of element `(b, h, s, 0)` of a dtype tensor.
fn at(base: u64, st: &crate::problem::Strides, b: usize, h: usize, s: usize) -> u64 {
    base + 2 * st.offset(b, h, s, 0) as u64
}

/// Leading dimension for a row stride: with a single row the stride may be anything (even 0),
/// but cuBLAS wants `ld >= cols`.
fn ld(stride: usize, cols: usize) -> usize {
    stride.max(cols)
}

/// The key range of query rows `[i0, i0 + rows)`, clipped; `None` when fully masked.
fn chunk_range(m: &EffectiveMask, i0: usize, rows: usize, skv: usize) -> Option<(usize, usize)> {
    let (lo, hi) = m.rows_range(i0, i0 + rows);
    let (lo, hi) = (lo.max(0) as usize, (hi.max(0) as usize).min(skv));
    (lo < hi).then_some((lo, hi))
}

/// The rows `[lo, hi)` of a padded tensor's sequence dimension (`total` rows) outside sequence
/// `seq`: its padding, at most two ranges. Packed tensors have none.
fn padding(p: &AttentionProblem, seq: SeqRows, total: usize) -> Vec<(usize, usize)> {
    if p.is_packed() {
        return Vec::new();
    }
    [(0, seq.start), (seq.start + seq.len, total)]
        .into_iter()
        .filter(|(a, b)| a < b)
        .collect()
}

/// A learnable sink's device pointer: present and fp32-aligned, never a silent vanilla softmax.
fn sink_ptr(ptr: u64, what: &str) -> Result<(), ExecError> {
    if ptr == 0 || !ptr.is_multiple_of(4) {
        return Err(ExecError::invalid(format!(
            "learnable sink: {what} pointer {ptr:#x} is null or not 4-byte aligned"
        )));
    }
    Ok(())
}

/// Run the forward pass: O and LSE. Each sequence is computed on its own rows and keys only
/// (per-sequence lengths); padding rows get O = 0, LSE = -inf.
pub(crate) fn forward(
    ops: &mut impl Ops,
    p: &AttentionProblem,
    plan: &Plan,
    io: &DeviceForwardArgs,
    ws: u64,
) -> Result<(), ExecError> {
    let (hq, dqk, dv) = (p.heads_q, p.head_dim_qk, p.head_dim_v);
    let rows_q = p.rows_q();
    let ratio = p.group_size();
    let (lq, lk, lv, lo_) = (p.layout.q, p.layout.k, p.layout.v, p.layout.o);
    if p.softmax == SoftmaxKind::Learnable {
        sink_ptr(io.sink, "sink")?;
    }
    let softcap = p.softcap.map(|c| c as f32);
    let (s_buf, p_buf) = (ws + plan.off_s, ws + plan.off_p);
    let lse_at = |b: usize, h: usize, row: usize| io.lse + 4 * p.lse_index(b, h, row) as u64;
    for b in 0..p.batch {
        let (qr, kr) = p.seq_rows(b);
        let m = p.seq_mask(b);
        for (r0, r1) in padding(p, qr, rows_q) {
            ops.zero_rows(&ZeroRowsArgs {
                dst: at(io.o, &lo_, qr.batch, 0, r0),
                row_stride: lo_.seq,
                head_stride: lo_.head,
                rows: r1 - r0,
                heads: hq,
                cols: dv,
            })?;
            ops.fill_f32(&FillF32Args {
                dst: lse_at(qr.batch, 0, r0),
                ld: rows_q,
                rows: hq,
                cols: r1 - r0,
                value: f32::NEG_INFINITY,
            })?;
        }
        for g in 0..p.heads_kv {
            let h0 = g * ratio;
            // i0: the chunk's first row in the sequence; row: in the tensors.
            for i0 in (0..qr.len).step_by(plan.chunk_rows) {
                let rows = plan.chunk_rows.min(qr.len - i0);
                let row = qr.start + i0;
                let lse_ptr = lse_at(qr.batch, h0, row);
                let Some((klo, khi)) = chunk_range(&m, i0, rows, kr.len) else {
                    ops.zero_rows(&ZeroRowsArgs {
                        dst: at(io.o, &lo_, qr.batch, h0, row),
                        row_stride: lo_.seq,
                        head_stride: lo_.head,
                        rows,
                        heads: ratio,
                        cols: dv,
                    })?;
                    ops.fill_f32(&FillF32Args {
                        dst: lse_ptr,
                        ld: rows_q,
                        rows: ratio,
                        cols: rows,
                        value: f32::NEG_INFINITY,
                    })?;
                    continue;
                };
                let n = khi - klo;
                let lds = lds_for(n);
                let blk = rows * lds;
                // S = Q_c K^T for every head of the group (K shared: batch stride 0).
                ops.gemm(&gemm_rm(
                    false,
                    true,
                    rows,
                    n,
                    dqk,
                    RowMajor {
                        ptr: at(io.q, &lq, qr.batch, h0, row),
                        ld: ld(lq.seq, dqk),
                        stride: lq.head,
                    },
                    RowMajor {
                        ptr: at(io.k, &lk, kr.batch, g, kr.start + klo),
                        ld: ld(lk.seq, dqk),
                        stride: 0,
                    },
                    RowMajor {
                        ptr: s_buf,
                        ld: lds,
                        stride: blk,
                    },
                    Elem::F32,
                    1.0,
                    0.0,
                    ratio,
                ))?;
                ops.softmax_fwd(&SoftmaxArgs {
                    s: s_buf,
                    p: p_buf,
                    lds,
                    rows,
                    heads: ratio,
                    n,
                    i0,
                    kv_lo: klo,
                    lse: lse_ptr,
                    lse_head_stride: rows_q,
                    mask: m,
                    scale: p.softmax_scale as f32,
                    softcap,
                    sink: SinkArg::of(p, io.sink, h0),
                })?;
                // O_c = P V.
                ops.gemm(&gemm_rm(
                    false,
                    false,
                    rows,
                    dv,
                    n,
                    RowMajor {
                        ptr: p_buf,
                        ld: lds,
                        stride: blk,
                    },
                    RowMajor {
                        ptr: at(io.v, &lv, kr.batch, g, kr.start + klo),
                        ld: ld(lv.seq, dv),
                        stride: 0,
                    },
                    RowMajor {
                        ptr: at(io.o, &lo_, qr.batch, h0, row),
                        ld: ld(lo_.seq, dv),
                        stride: lo_.head,
                    },
                    Elem::Low,
                    1.0,
                    0.0,
                    ratio,
                ))?;
            }
        }
    }
    Ok(())
}

/// Run the backward pass: dQ, dK, dV (and d_sink of a learnable sink). Padding rows get
/// dQ = 0, padding keys dK = dV = 0.
pub(crate) fn backward(
    ops: &mut impl Ops,
    p: &AttentionProblem,
    plan: &Plan,
    io: &DeviceBackwardArgs,
    ws: u64,
) -> Result<(), ExecError> {
    let (hq, hkv, dqk, dv) = (p.heads_q, p.heads_kv, p.head_dim_qk, p.head_dim_v);
    let (rows_q, rows_kv) = (p.rows_q(), p.rows_kv());
    let ratio = p.group_size();
    let (lq, lk, lv, lo_) = (p.layout.q, p.layout.k, p.layout.v, p.layout.o);
    let learnable = p.softmax == SoftmaxKind::Learnable;
    if learnable {
        sink_ptr(io.sink, "sink")?;
        sink_ptr(io.d_sink, "d_sink")?;
    }
    let scale = p.softmax_scale as f32;
    let d_buf = ws + plan.off_d;
    ops.row_dot(&RowDotArgs {
        o: io.o,
        d_o: io.d_o,
        out: d_buf,
        batch: p.batch_dim(),
        heads: hq,
        seqlen: rows_q,
        dim: dv,
        stride_b: lo_.batch,
        stride_h: lo_.head,
        stride_s: lo_.seq,
    })?;
    // Padding: dQ rows and dK / dV keys are zeros; D = 0 there, so d_sink ignores those rows
    // whatever LSE the caller passes for them.
    for b in 0..p.batch {
        let (qr, kr) = p.seq_rows(b);
        for (r0, r1) in padding(p, qr, rows_q) {
            ops.zero_rows(&ZeroRowsArgs {
                dst: at(io.dq, &lq, qr.batch, 0, r0),
                row_stride: lq.seq,
                head_stride: lq.head,
                rows: r1 - r0,
                heads: hq,
                cols: dqk,
            })?;
            if learnable {
                ops.fill_f32(&FillF32Args {
                    dst: d_buf + 4 * p.lse_index(qr.batch, 0, r0) as u64,
                    ld: rows_q,
                    rows: hq,
                    cols: r1 - r0,
                    value: 0.0,
                })?;
            }
        }
        for (r0, r1) in padding(p, kr, rows_kv) {
            for (buf, st, cols) in [(io.dk, lk, dqk), (io.dv, lv, dv)] {
                ops.zero_rows(&ZeroRowsArgs {
                    dst: at(buf, &st, kr.batch, 0, r0),
                    row_stride: st.seq,
                    head_stride: st.head,
                    rows: r1 - r0,
                    heads: hkv,
                    cols,
                })?;
            }
        }
    }
    let c = Bwd {
        p,
        plan,
        io,
        ratio,
        scale,
        softcap: p.softcap.map(|c| c as f32),
        d_buf,
    };
    // Groups go round-robin to the lanes; within a lane everything is in order, so every sum
    // keeps its order (deterministic) whatever the lanes' relative timing.
    ops.fork(plan.lanes)?;
    for b in 0..p.batch {
        let (qr, kr) = p.seq_rows(b);
        for g in 0..p.heads_kv {
            let lane = (b * p.heads_kv + g) % plan.lanes;
            ops.lane(lane)?;
            let base = ws + lane as u64 * plan.lane_bytes;
            let grp = BwdGroup {
                qr,
                kr,
                m: p.seq_mask(b),
                g,
                h0: g * ratio,
                s_buf: base + plan.off_s,
                p_buf: base + plan.off_p,
                dp_buf: base + plan.off_dp,
                ds_buf: base + plan.off_ds,
                acc_dk: base + plan.off_acc_dk,
                acc_dv: base + plan.off_acc_dv,
            };
            backward_group(ops, &c, &grp)?;
        }
    }
    ops.join()?;
    if learnable {
        ops.sink_grad(&SinkGradArgs {
            lse: io.lse,
            dvec: d_buf,
            sink: io.sink,
            d_sink: io.d_sink,
            batch: p.batch_dim(),
            heads: hq,
            rows: rows_q,
        })?;
    }
    Ok(())
}

/// What every step of the backward pass reads, computed once by [`backward`].
struct Bwd<'a> {
    p: &'a AttentionProblem,
    plan: &'a Plan,
    io: &'a DeviceBackwardArgs,
    /// Query heads per KV head.
    ratio: usize,
    scale: f32,
    softcap: Option<f32>,
    /// `D = rowsum(dO * O)`, fp32 per query row (LSE's indexing).
    d_buf: u64,
}

/// One (sequence, KV head) group of the backward pass: the sequence's rows and keys and its
/// mask, its first query head and its lane's buffers.
struct BwdGroup {
    qr: SeqRows,
    kr: SeqRows,
    m: EffectiveMask,
    g: usize,
    h0: usize,
    s_buf: u64,
    p_buf: u64,
    dp_buf: u64,
    ds_buf: u64,
    acc_dk: u64,
    acc_dv: u64,
}

/// One chunk of query rows from `i0` (in the sequence; `row` in the tensors) and the key range
/// `klo..klo + n` (in the sequence) its mask admits, with the score block's row length `lds`,
/// batch stride `blk` and the rows' byte offset into LSE / D.
struct BwdChunk {
    i0: usize,
    row: usize,
    rows: usize,
    klo: usize,
    n: usize,
    lds: usize,
    blk: usize,
    row_off: u64,
}

/// One group: every chunk, the last first, then dK and dV cast once. The fp32 dK / dV
/// accumulators are not zeroed as a whole: the first chunk's GEMMs write its keys (beta = 0),
/// and only keys a later chunk adds to the written range, or that no chunk reaches, are filled
/// with zeros. Under a causal mask the last chunk reaches every key, so nothing is filled (a
/// fill, and the first GEMMs' read of its zeros, were a pass over both accumulators).
fn backward_group(ops: &mut impl Ops, c: &Bwd<'_>, grp: &BwdGroup) -> Result<(), ExecError> {
    let (p, plan, io) = (c.p, c.plan, c.io);
    let (dqk, dv) = (p.head_dim_qk, p.head_dim_v);
    let (lk, lv) = (p.layout.k, p.layout.v);
    let (qr, kr, g) = (grp.qr, grp.kr, grp.g);
    let skv = kr.len;
    // The keys [lo, hi) of the accumulators written so far (None: none).
    let mut written: Option<(usize, usize)> = None;
    for i0 in (0..qr.len).step_by(plan.chunk_rows).rev() {
        backward_chunk(ops, c, grp, i0, &mut written)?;
    }
    if skv > 0 {
        let (lo, hi) = written.unwrap_or((0, 0));
        zero_keys(ops, c, grp, 0, lo)?;
        zero_keys(ops, c, grp, hi, skv)?;
        ops.cast_rows(&CastArgs {
            src: grp.acc_dk,
            dst: at(io.dk, &lk, kr.batch, g, kr.start),
            dst_ld: lk.seq,
            rows: skv,
            cols: dqk,
        })?;
        ops.cast_rows(&CastArgs {
            src: grp.acc_dv,
            dst: at(io.dv, &lv, kr.batch, g, kr.start),
            dst_ld: lv.seq,
            rows: skv,
            cols: dv,
        })?;
    }
    Ok(())
}

/// Zeros for keys [lo, hi) of both fp32 accumulators.
fn zero_keys(
    ops: &mut impl Ops,
    c: &Bwd<'_>,
    grp: &BwdGroup,
    lo: usize,
    hi: usize,
) -> Result<(), ExecError> {
    if lo >= hi {
        return Ok(());
    }
    for (acc, dim) in [(grp.acc_dk, c.p.head_dim_qk), (grp.acc_dv, c.p.head_dim_v)] {
        ops.fill_f32(&FillF32Args {
            dst: acc + 4 * (lo * dim) as u64,
            ld: (hi - lo) * dim,
            rows: 1,
            cols: (hi - lo) * dim,
            value: 0.0,
        })?;
    }
    Ok(())
}

/// The chunk of query rows from `i0`: its rows of dQ zeroed when the mask admits no key, else
/// P and dS, then dQ_c, then its share of dK and dV, both by row blocks ([`row_blocks`]) so
/// the GEMMs skip what the mask declines. `written` is the accumulators' written key range,
/// which the chunk's keys join.
fn backward_chunk(
    ops: &mut impl Ops,
    c: &Bwd<'_>,
    grp: &BwdGroup,
    i0: usize,
    written: &mut Option<(usize, usize)>,
) -> Result<(), ExecError> {
    let (p, plan, io, ratio) = (c.p, c.plan, c.io, c.ratio);
    let (qr, kr, g, h0) = (grp.qr, grp.kr, grp.g, grp.h0);
    let rows = plan.chunk_rows.min(qr.len - i0);
    let row = qr.start + i0;
    let Some((klo, khi)) = chunk_range(&grp.m, i0, rows, kr.len) else {
        return zero_dq(ops, c, grp, row, rows);
    };
    let n = khi - klo;
    let lds = lds_for(n);
    let blk = rows * lds;
    let row_off = 4 * p.lse_index(qr.batch, h0, row) as u64;
    let ch = BwdChunk {
        i0,
        row,
        rows,
        klo,
        n,
        lds,
        blk,
        row_off,
    };
    if plan.kind == PlanKind::BackwardFusedScores {
        ops.bwd_scores(&BwdScoresArgs {
            batch: qr.batch,
            kv_head: g,
            h0,
            heads: ratio,
            i0: row,
            rows,
            kv_lo: kr.start + klo,
            n,
            p: grp.p_buf,
            ds: grp.ds_buf,
            lds,
            lse: io.lse + row_off,
            dvec: c.d_buf + row_off,
            head_stride: p.rows_q(),
            mask: grp.m,
            seq_q0: qr.start,
            seq_kv0: kr.start,
            softcap: c.softcap,
        })?;
    } else {
        backward_scores(ops, c, grp, &ch)?;
    }
    let blocks = row_blocks(&grp.m, &ch, kr.len, plan.row_blocks);
    backward_dq(ops, c, grp, &ch, &blocks)?;
    // The first chunk with keys writes them (beta = 0). Later chunks add (beta = 1): keys of
    // theirs not yet written, and any gap to the written range, are zeroed first, so the written
    // keys stay one range.
    let first_beta = match *written {
        None => {
            *written = Some((klo, khi));
            0.0
        }
        Some((lo, hi)) => {
            zero_keys(ops, c, grp, klo.min(lo), lo)?;
            zero_keys(ops, c, grp, hi, khi.max(hi))?;
            *written = Some((klo.min(lo), khi.max(hi)));
            1.0
        }
    };
    for seg in key_segments(&blocks, ch.n) {
        match seg.rows {
            Some(rows) => backward_accumulate(ops, c, grp, &ch, &seg, rows, first_beta)?,
            // Keys no row of the chunk sees: nothing to add, but a first write owes them zeros.
            None if first_beta == 0.0 => {
                zero_keys(ops, c, grp, klo + seg.c0, klo + seg.c1)?;
            }
            None => {}
        }
    }
    Ok(())
}

/// dQ rows `[row, row + rows)` (tensor rows) of every head of the group set to zero: rows that
/// see no key.
fn zero_dq(
    ops: &mut impl Ops,
    c: &Bwd<'_>,
    grp: &BwdGroup,
    row: usize,
    rows: usize,
) -> Result<(), ExecError> {
    let lq = c.p.layout.q;
    ops.zero_rows(&ZeroRowsArgs {
        dst: at(c.io.dq, &lq, grp.qr.batch, grp.h0, row),
        row_stride: lq.seq,
        head_stride: lq.head,
        rows,
        heads: c.ratio,
        cols: c.p.head_dim_qk,
    })
}

/// Rows `[r0, r1)` of a chunk (chunk-relative) and the score columns `[c0, c1)` (relative to
/// the chunk's first key) the mask admits for them, widened to multiples of 8 so every GEMM
/// operand stays 16-byte aligned (the score kernels write zeros wherever the mask declines,
/// so a wider range adds only zeros). `c0 == c1`: the rows see no key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RowBlock {
    r0: usize,
    r1: usize,
    c0: usize,
    c1: usize,
}

/// The chunk's rows in `blocks` blocks (multiples of 64 rows, whole GEMM tiles, where blocks are
/// larger than 64), each with its key columns; neighbours that see the same columns are one
/// block. Masks are monotone (a later row's key range starts and ends no earlier), so under a
/// causal mask the last block sees every column and the first only those up to its diagonal.
fn row_blocks(m: &EffectiveMask, ch: &BwdChunk, skv: usize, blocks: usize) -> Vec<RowBlock> {
    let size = ch.rows.div_ceil(blocks.max(1));
    let size = if size > 64 {
        size.div_ceil(64) * 64
    } else {
        size
    };
    let mut out: Vec<RowBlock> = Vec::new();
    for r0 in (0..ch.rows).step_by(size.max(1)) {
        let r1 = (r0 + size).min(ch.rows);
        let (c0, c1) = match chunk_range(m, ch.i0 + r0, r1 - r0, skv) {
            Some((lo, hi)) => {
                let c0 = lo.saturating_sub(ch.klo) / 8 * 8;
                let c1 = (hi.saturating_sub(ch.klo).div_ceil(8) * 8).min(ch.n);
                if c0 < c1 { (c0, c1) } else { (0, 0) }
            }
            None => (0, 0),
        };
        match out.last_mut() {
            Some(b) if (b.c0, b.c1) == (c0, c1) => b.r1 = r1,
            _ => out.push(RowBlock { r0, r1, c0, c1 }),
        }
    }
    out
}

/// Score columns `[c0, c1)` of a chunk and the rows `[r0, r1)` that see them (the smallest range
/// holding every row block whose columns cover them; `None`: no row does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct KeySegment {
    c0: usize,
    c1: usize,
    rows: Option<(usize, usize)>,
}

/// The chunk's `n` columns cut at every row block's column bounds, each piece with the rows
/// that see it; neighbours with the same rows are one segment.
fn key_segments(blocks: &[RowBlock], n: usize) -> Vec<KeySegment> {
    let mut cuts: Vec<usize> = blocks
        .iter()
        .filter(|b| b.c0 < b.c1)
        .flat_map(|b| [b.c0, b.c1])
        .chain([0, n])
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut out: Vec<KeySegment> = Vec::new();
    for w in cuts.windows(2) {
        let (c0, c1) = (w[0], w[1]);
        let rows = blocks.iter().filter(|b| b.c0 <= c0 && c1 <= b.c1).fold(
            None,
            |acc: Option<(usize, usize)>, b| {
                Some(acc.map_or((b.r0, b.r1), |(r0, r1)| (r0.min(b.r0), r1.max(b.r1))))
            },
        );
        match out.last_mut() {
            Some(s) if s.rows == rows => s.c1 = c1,
            _ => out.push(KeySegment { c0, c1, rows }),
        }
    }
    out
}

/// dQ_c = scale dS K, one GEMM per row block over the keys it sees (every head of the group at
/// once), written directly; a block that sees no key gets zeros.
fn backward_dq(
    ops: &mut impl Ops,
    c: &Bwd<'_>,
    grp: &BwdGroup,
    ch: &BwdChunk,
    blocks: &[RowBlock],
) -> Result<(), ExecError> {
    let (p, io, ratio) = (c.p, c.io, c.ratio);
    let dqk = p.head_dim_qk;
    let (lq, lk) = (p.layout.q, p.layout.k);
    let (qr, kr, g, h0) = (grp.qr, grp.kr, grp.g, grp.h0);
    for b in blocks {
        let rows = b.r1 - b.r0;
        if b.c0 == b.c1 {
            zero_dq(ops, c, grp, ch.row + b.r0, rows)?;
            continue;
        }
        ops.gemm(&gemm_rm(
            false,
            false,
            rows,
            dqk,
            b.c1 - b.c0,
            RowMajor {
                ptr: grp.ds_buf + 2 * (b.r0 * ch.lds + b.c0) as u64,
                ld: ch.lds,
                stride: ch.blk,
            },
            RowMajor {
                ptr: at(io.k, &lk, kr.batch, g, kr.start + ch.klo + b.c0),
                ld: ld(lk.seq, dqk),
                stride: 0,
            },
            RowMajor {
                ptr: at(io.dq, &lq, qr.batch, h0, ch.row + b.r0),
                ld: ld(lq.seq, dqk),
                stride: lq.head,
            },
            Elem::Low,
            c.scale,
            0.0,
            ratio,
        ))?;
    }
    Ok(())
}

/// P and dS of a chunk through GEMMs: `S = Q_c K^T`, `dP = dO_c V^T` (fp32), then the
/// elementwise kernel.
fn backward_scores(
    ops: &mut impl Ops,
    c: &Bwd<'_>,
    grp: &BwdGroup,
    ch: &BwdChunk,
) -> Result<(), ExecError> {
    let (p, io, ratio) = (c.p, c.io, c.ratio);
    let (dqk, dv) = (p.head_dim_qk, p.head_dim_v);
    let (lq, lk, lv, lo_) = (p.layout.q, p.layout.k, p.layout.v, p.layout.o);
    let (qr, kr, g, h0) = (grp.qr, grp.kr, grp.g, grp.h0);
    let (row, rows, klo, n, lds, blk) = (ch.row, ch.rows, ch.klo, ch.n, ch.lds, ch.blk);
    let q_c = RowMajor {
        ptr: at(io.q, &lq, qr.batch, h0, row),
        ld: ld(lq.seq, dqk),
        stride: lq.head,
    };
    let do_c = RowMajor {
        ptr: at(io.d_o, &lo_, qr.batch, h0, row),
        ld: ld(lo_.seq, dv),
        stride: lo_.head,
    };
    let k_r = RowMajor {
        ptr: at(io.k, &lk, kr.batch, g, kr.start + klo),
        ld: ld(lk.seq, dqk),
        stride: 0,
    };
    let v_r = RowMajor {
        ptr: at(io.v, &lv, kr.batch, g, kr.start + klo),
        ld: ld(lv.seq, dv),
        stride: 0,
    };
    // S = Q_c K^T, dP = dO_c V^T.
    ops.gemm(&gemm_rm(
        false,
        true,
        rows,
        n,
        dqk,
        q_c,
        k_r,
        RowMajor {
            ptr: grp.s_buf,
            ld: lds,
            stride: blk,
        },
        Elem::F32,
        1.0,
        0.0,
        ratio,
    ))?;
    ops.gemm(&gemm_rm(
        false,
        true,
        rows,
        n,
        dv,
        do_c,
        v_r,
        RowMajor {
            ptr: grp.dp_buf,
            ld: lds,
            stride: blk,
        },
        Elem::F32,
        1.0,
        0.0,
        ratio,
    ))?;
    ops.bwd_elementwise(&BwdArgs {
        s: grp.s_buf,
        dp: grp.dp_buf,
        p: grp.p_buf,
        ds: grp.ds_buf,
        lds,
        rows,
        heads: ratio,
        n,
        i0: ch.i0,
        kv_lo: klo,
        lse: io.lse + ch.row_off,
        dvec: c.d_buf + ch.row_off,
        head_stride: p.rows_q(),
        mask: grp.m,
        scale: c.scale,
        softcap: c.softcap,
    })?;
    Ok(())
}

/// dV += P^T dO_c, dK += scale dS^T Q_c for the segment's keys over the rows `[r0, r1)` that
/// see them: heads of the group in a fixed order, accumulated in fp32 by GEMM beta = 1
/// (deterministic); the first head's beta is `first_beta` (0: the first writes of these keys).
/// The accumulators hold the sequence's keys.
fn backward_accumulate(
    ops: &mut impl Ops,
    c: &Bwd<'_>,
    grp: &BwdGroup,
    ch: &BwdChunk,
    seg: &KeySegment,
    (r0, r1): (usize, usize),
    first_beta: f32,
) -> Result<(), ExecError> {
    let (p, io, ratio, scale) = (c.p, c.io, c.ratio, c.scale);
    let (dqk, dv) = (p.head_dim_qk, p.head_dim_v);
    let (lq, lo_) = (p.layout.q, p.layout.o);
    let (qr, h0) = (grp.qr, grp.h0);
    let (lds, blk) = (ch.lds, ch.blk);
    let (m, k, key) = (seg.c1 - seg.c0, r1 - r0, ch.klo + seg.c0);
    let row = ch.row + r0;
    for r in 0..ratio {
        let h = h0 + r;
        let beta = if r == 0 { first_beta } else { 1.0 };
        // Head r's block, row r0, column c0 of the segment.
        let off = 2 * (r * blk + r0 * lds + seg.c0) as u64;
        ops.gemm(&gemm_rm(
            true,
            false,
            m,
            dv,
            k,
            RowMajor {
                ptr: grp.p_buf + off,
                ld: lds,
                stride: 0,
            },
            RowMajor {
                ptr: at(io.d_o, &lo_, qr.batch, h, row),
                ld: ld(lo_.seq, dv),
                stride: 0,
            },
            RowMajor {
                ptr: grp.acc_dv + 4 * (key * dv) as u64,
                ld: dv,
                stride: 0,
            },
            Elem::F32,
            1.0,
            beta,
            1,
        ))?;
        ops.gemm(&gemm_rm(
            true,
            false,
            m,
            dqk,
            k,
            RowMajor {
                ptr: grp.ds_buf + off,
                ld: lds,
                stride: 0,
            },
            RowMajor {
                ptr: at(io.q, &lq, qr.batch, h, row),
                ld: ld(lq.seq, dqk),
                stride: 0,
            },
            RowMajor {
                ptr: grp.acc_dk + 4 * (key * dqk) as u64,
                ld: dqk,
                stride: 0,
            },
            Elem::F32,
            scale,
            beta,
            1,
        ))?;
    }
    Ok(())
}
