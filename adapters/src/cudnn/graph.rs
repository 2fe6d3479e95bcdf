//! The cuDNN SDPA operation graphs as plain data (an IR), lowered to `cudnnBackend*` descriptors
//! by `backend.rs`.
//!
//! Three graphs, following how cudnn-frontend lowers an SDPA node (see
//! `shared/reference/cudnn_sdpa.md`, sections 2-3):
//! - the composite forward (matmul, scale, mask, softmax with LSE, matmul), which the fused
//!   attention engines pattern-match on every cuDNN 9;
//! - the native forward op `OPERATION_SDPA_FWD` (cuDNN >= 9.13.1; masks through a
//!   `DIAGONAL_BAND_MASK` subgraph and LSE through a `SOFTMAX` op only from 9.21);
//! - the composite backward.
//!
//! Building the IR needs no GPU, so its invariants (exact variant-pack UID sets, mask lowering,
//! GQA folds, scratch layout) are unit-tested on any machine.

use std::collections::{BTreeMap, BTreeSet};

use super::spec::{Diagonal, Direction, IoDtype, SdpaSpec, SeqPacking, Strides};
use super::version::CudnnVersion;

/// Element types used in the graphs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// fp32.
    Float,
    /// fp16.
    Half,
    /// bf16.
    Bf16,
    /// int32 (indices, sequence lengths).
    Int32,
    /// int64 (ragged offsets).
    Int64,
    /// boolean (mask conditions).
    Boolean,
}

impl From<IoDtype> for DType {
    fn from(d: IoDtype) -> Self {
        match d {
            IoDtype::Bf16 => DType::Bf16,
            IoDtype::F16 => DType::Half,
        }
    }
}

/// The caller's tensors a graph binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IoRole {
    /// Query.
    Q,
    /// Key (also bound through the transposed view Kᵀ).
    K,
    /// Value (also bound through Vᵀ in the backward).
    V,
    /// Output.
    O,
    /// Log-sum-exp of the scaled scores, fp32 [b, h_q, s_q, 1].
    Stats,
    /// Output gradient.
    DO,
    /// Query gradient.
    DQ,
    /// Key gradient.
    DK,
    /// Value gradient.
    DV,
}

/// What a non-virtual tensor is bound to in the variant pack.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Binding {
    /// An intermediate (not in the variant pack).
    Virtual,
    /// A caller tensor.
    Io(IoRole),
    /// The softmax scale (by value, fp32, given per call).
    Scale,
    /// A by-value fp32 constant baked into the graph.
    ConstF32(f32),
    /// A by-value int32 constant baked into the graph.
    ConstI32(i32),
    /// A region of the executor-owned scratch at this byte offset.
    Scratch(usize),
}

/// One tensor descriptor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tensor {
    /// Unique id within the graph.
    pub uid: i64,
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub dims: [i64; 4],
    /// Element strides.
    pub strides: [i64; 4],
    /// Binding (virtual or what the variant pack points at).
    pub binding: Binding,
    /// The uid of this tensor's ragged-offset tensor (`RAGGED_OFFSET_DESC`: where each batch's
    /// first token starts, in elements), for left-padded and packed batches.
    pub ragged: Option<i64>,
}

impl Tensor {
    /// An intermediate.
    pub fn is_virtual(&self) -> bool {
        self.binding == Binding::Virtual
    }
    /// A host scalar passed by value.
    pub fn is_by_value(&self) -> bool {
        matches!(
            self.binding,
            Binding::Scale | Binding::ConstF32(_) | Binding::ConstI32(_)
        )
    }
}

/// Pointwise modes used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PwMode {
    /// x + b.
    Add,
    /// x * b.
    Mul,
    /// x / b.
    Div,
    /// x - b.
    Sub,
    /// exp(x).
    Exp,
    /// ln(x).
    Log,
    /// x.
    Identity,
    /// x >= b.
    CmpGe,
    /// x > b.
    CmpGt,
    /// x < b.
    CmpLt,
    /// x && b.
    LogicalAnd,
    /// index of x along `axis`.
    GenIndex,
    /// t ? x : b.
    BinarySelect,
}

/// Reduction operators used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedOp {
    /// Sum.
    Add,
    /// Max.
    Max,
}

/// How the native SDPA op produces its LSE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NativeStats {
    /// `SDPA_FWD_STATSDESC` (cuDNN < 9.21).
    StatsDesc(i64),
    /// A `SOFTMAX` op attached with `SDPA_FWD_SOFTMAX_DESC` (cuDNN >= 9.21): x, y, stats uids.
    Softmax {
        /// Virtual softmax input.
        x: i64,
        /// Virtual softmax output.
        y: i64,
        /// The LSE tensor.
        stats: i64,
    },
}

/// One `DIAGONAL_BAND_MASK` op (cuDNN >= 9.21, inside the native op's subgraph).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BandMaskOp {
    /// Input scores.
    pub x: i64,
    /// Fill value (by-value -inf).
    pub b: i64,
    /// Output scores.
    pub y: i64,
    /// CMP_GE for a right bound, CMP_GT for a left bound.
    pub cmp: PwMode,
    /// Left bound scalar.
    pub left_bound: Option<i64>,
    /// Right-bound shift scalar.
    pub shift_right: Option<i64>,
    /// s_q scalar (bottom-right right bound).
    pub seq_q: Option<i64>,
    /// s_kv scalar (bottom-right right bound).
    pub seq_kv: Option<i64>,
}

/// One operation.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// C = A @ B (batched over the first two dims, broadcast over heads for GQA).
    Matmul {
        /// A.
        a: i64,
        /// B.
        b: i64,
        /// C.
        c: i64,
        /// Per-batch GEMM extents (`GEMM_M/N/K_OVERRIDE_DESC`: the seq-len tensors with a
        /// padding mask), as cudnn-frontend sets them.
        overrides: GemmOverrides,
    },
    /// Elementwise.
    Pointwise {
        /// Mode.
        mode: PwMode,
        /// First input.
        x: i64,
        /// Second input.
        b: Option<i64>,
        /// Condition (BINARY_SELECT).
        t: Option<i64>,
        /// Output.
        y: i64,
        /// Math precision.
        prec: DType,
        /// Axis (GEN_INDEX, and the sequence-offset adds as the frontend sets it).
        axis: Option<i64>,
    },
    /// Reduction to the output's shape.
    Reduction {
        /// Operator.
        op: RedOp,
        /// Input.
        x: i64,
        /// Output.
        y: i64,
    },
    /// A view with other dims/strides.
    Reshape {
        /// Input.
        x: i64,
        /// Output.
        y: i64,
    },
    /// The native SDPA forward op.
    SdpaFwd {
        /// Q.
        q: i64,
        /// K (not transposed).
        k: i64,
        /// V.
        v: i64,
        /// O.
        o: i64,
        /// Scale.
        scale: i64,
        /// LSE.
        stats: NativeStats,
        /// Mask subgraph: its ops, input uid, output uid.
        mask: Option<(Vec<BandMaskOp>, i64, i64)>,
    },
}

/// The per-batch GEMM extents of a matmul (uids of int32 `[b, 1, 1, 1]` tensors).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GemmOverrides {
    /// M (rows of A and C).
    pub m: Option<i64>,
    /// N (columns of B and C).
    pub n: Option<i64>,
    /// K (the reduced dimension).
    pub k: Option<i64>,
}

/// Where a graph with per-sequence lengths keeps its per-call data in the executor's scratch
/// (byte offsets). The executor fills the lengths, row starts and ragged offsets before the
/// cuDNN call (a small kernel, from the problem's `seqlens`), and moves LSE between cuDNN's
/// dense Stats and the caller's `[batch_dim, h_q, rows_q]` layout around it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VarlenScratch {
    /// Where the sequences sit.
    pub packing: SeqPacking,
    /// int32 `[b]`: query tokens of each sequence (`SEQ_LEN_Q`).
    pub seq_q: usize,
    /// int32 `[b]`: key tokens of each sequence (`SEQ_LEN_KV`).
    pub seq_kv: usize,
    /// int32 `[b]`: first physical query row of each sequence (executor kernels only).
    pub start_q: usize,
    /// int32 `[b]`: first physical key row of each sequence (executor kernels only).
    pub start_kv: usize,
    /// `[b + 1]` element offsets of Q (and dQ), K (dK), V (dV), O (dO): ragged graphs.
    pub ragged: Option<[usize; 4]>,
    /// The ragged offsets are int64 (else int32, as TransformerEngine uses them whenever the
    /// offsets fit).
    pub ragged_wide: bool,
    /// fp32 `[b, h_q, s_q]`: cuDNN's Stats, dense over the longest sequence (rows past a
    /// sequence's length unused; 0 there in the backward, so no -inf - -inf = NaN).
    pub stats: usize,
}

/// Which graph a [`GraphIr`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GraphKind {
    /// Composite forward.
    CompositeFwd,
    /// Native SDPA forward op.
    NativeFwd,
    /// Composite backward.
    CompositeBwd,
}

impl GraphKind {
    /// Direction.
    pub fn direction(self) -> Direction {
        match self {
            GraphKind::CompositeFwd | GraphKind::NativeFwd => Direction::Forward,
            GraphKind::CompositeBwd => Direction::Backward,
        }
    }
}

/// A complete operation graph.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphIr {
    /// Which graph.
    pub kind: GraphKind,
    /// All tensors by uid (the native op's subgraph tensors included).
    pub tensors: BTreeMap<i64, Tensor>,
    /// Ops of the main graph.
    pub ops: Vec<Op>,
    /// Bytes of executor-owned scratch placed before cuDNN's own workspace.
    pub scratch_bytes: usize,
    /// Per-sequence-length data in the scratch (graphs with a padding mask).
    pub varlen: Option<VarlenScratch>,
}

/// Fixed uids of bound tensors.
pub mod uid {
    /// Q.
    pub const Q: i64 = 1;
    /// K, or its transposed view Kᵀ in composite graphs.
    pub const K: i64 = 2;
    /// V, or Vᵀ in the backward.
    pub const V: i64 = 3;
    /// O.
    pub const O: i64 = 4;
    /// LSE.
    pub const STATS: i64 = 5;
    /// Scale.
    pub const SCALE: i64 = 6;
    /// dO.
    pub const DO: i64 = 7;
    /// dQ.
    pub const DQ: i64 = 8;
    /// dK.
    pub const DK: i64 = 9;
    /// dV.
    pub const DV: i64 = 10;
    /// -inf fill.
    pub const NEG_INF: i64 = 20;
    /// 1.0 (softmax-sum scale in the backward).
    pub const ONE: i64 = 21;
    /// s_q as int32.
    pub const SEQ_Q: i64 = 22;
    /// s_kv as int32.
    pub const SEQ_KV: i64 = 23;
    /// Right-bound shift as int32.
    pub const SHIFT_RIGHT: i64 = 24;
    /// Left bound (fp32).
    pub const LEFT_BOUND: i64 = 25;
    /// Backward scratch: Σ dO·O per row.
    pub const SOFTMAX_SUM: i64 = 30;
    /// Backward scratch: fp32 dQ accumulator.
    pub const DQ_ACCUM: i64 = 31;
    /// Per-batch query lengths, int32 `[b, 1, 1, 1]` (device).
    pub const SEQ_LEN_Q: i64 = 40;
    /// Per-batch key lengths, int32 `[b, 1, 1, 1]` (device).
    pub const SEQ_LEN_KV: i64 = 41;
    /// Ragged offsets of Q and dQ, int32 or int64 `[b + 1, 1, 1, 1]` (device).
    pub const RAGGED_Q: i64 = 42;
    /// Ragged offsets of K and dK.
    pub const RAGGED_K: i64 = 43;
    /// Ragged offsets of V and dV.
    pub const RAGGED_V: i64 = 44;
    /// Ragged offsets of O and dO.
    pub const RAGGED_O: i64 = 45;
    /// First virtual uid.
    pub const FIRST_VIRTUAL: i64 = 1000;
}

fn dense(dims: [i64; 4]) -> Strides {
    [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1]
}

fn transposed(s: Strides) -> Strides {
    [s[0], s[1], s[3], s[2]]
}

const SCRATCH_ALIGN: usize = 256;

fn align_up(x: usize) -> usize {
    x.div_ceil(SCRATCH_ALIGN) * SCRATCH_ALIGN
}

struct Builder {
    tensors: BTreeMap<i64, Tensor>,
    ops: Vec<Op>,
    next_virtual: i64,
}

impl Builder {
    fn new() -> Self {
        Builder {
            tensors: BTreeMap::new(),
            ops: Vec::new(),
            next_virtual: uid::FIRST_VIRTUAL,
        }
    }

    fn tensor(
        &mut self,
        uid: i64,
        dtype: DType,
        dims: [i64; 4],
        strides: Strides,
        binding: Binding,
    ) -> i64 {
        let prev = self.tensors.insert(
            uid,
            Tensor {
                uid,
                dtype,
                dims,
                strides,
                binding,
                ragged: None,
            },
        );
        debug_assert!(prev.is_none(), "uid {uid} defined twice");
        uid
    }

    fn scalar(&mut self, uid: i64, binding: Binding) -> i64 {
        if self.tensors.contains_key(&uid) {
            return uid;
        }
        let dtype = match binding {
            Binding::ConstI32(_) => DType::Int32,
            _ => DType::Float,
        };
        self.tensor(uid, dtype, [1, 1, 1, 1], [1, 1, 1, 1], binding)
    }

    fn virt(&mut self, dtype: DType, dims: [i64; 4]) -> i64 {
        let uid = self.next_virtual;
        self.next_virtual += 1;
        self.tensor(uid, dtype, dims, dense(dims), Binding::Virtual)
    }

    fn virt_strided(&mut self, dtype: DType, dims: [i64; 4], strides: Strides) -> i64 {
        let uid = self.next_virtual;
        self.next_virtual += 1;
        self.tensor(uid, dtype, dims, strides, Binding::Virtual)
    }

    fn dims(&self, uid: i64) -> [i64; 4] {
        self.tensors[&uid].dims
    }

    fn pw(&mut self, mode: PwMode, x: i64, b: Option<i64>, y: i64) {
        self.ops.push(Op::Pointwise {
            mode,
            x,
            b,
            t: None,
            y,
            prec: DType::Float,
            axis: None,
        });
    }

    /// New virtual fp32 output of the same dims as `x`, from a binary/unary pointwise.
    fn pw_new(&mut self, mode: PwMode, x: i64, b: Option<i64>) -> i64 {
        let y = self.virt(DType::Float, self.dims(x));
        self.pw(mode, x, b, y);
        y
    }

    fn matmul(&mut self, a: i64, b: i64, c: i64, overrides: GemmOverrides) {
        self.ops.push(Op::Matmul { a, b, c, overrides });
    }

    fn set_ragged(&mut self, uid: i64, offsets: Option<i64>) {
        if let Some(t) = self.tensors.get_mut(&uid) {
            t.ragged = offsets;
        }
    }

    /// With per-sequence lengths, gives each `(tensor, ragged index)` its ragged offsets.
    fn set_ragged_all(&mut self, vl: Option<&Varlen>, tensors: &[(i64, usize)]) {
        if let Some(vl) = vl {
            for &(t, i) in tensors {
                self.set_ragged(t, vl.ragged(i));
            }
        }
    }

    /// Stats `[b, h_q, s_q, 1]` fp32: the caller's LSE, or with per-sequence lengths the dense
    /// scratch copy the executor converts to and from the caller's `[batch_dim, h_q, rows_q]`.
    fn stats(&mut self, spec: &SdpaSpec, vl: Option<&Varlen>) -> i64 {
        let binding = match vl {
            Some(vl) => Binding::Scratch(vl.scratch.stats),
            None => Binding::Io(IoRole::Stats),
        };
        self.tensor(
            uid::STATS,
            DType::Float,
            [spec.b, spec.h_q, spec.s_q, 1],
            stats_strides(spec),
            binding,
        )
    }

    /// The per-sequence tensors in the scratch from byte offset `*scratch` on: the seq-len
    /// tensors (in the graph), the row starts (executor only), the ragged offsets (in the
    /// graph, ragged packings) and the dense Stats.
    fn varlen(&mut self, spec: &SdpaSpec, packing: SeqPacking, scratch: &mut usize) -> Varlen {
        let b = spec.b;
        let mut take = |bytes: usize| {
            let off = *scratch;
            *scratch += align_up(bytes);
            off
        };
        let seq_q_off = take(b as usize * 4);
        let seq_kv_off = take(b as usize * 4);
        let start_q = take(b as usize * 4);
        let start_kv = take(b as usize * 4);
        let lens = [b, 1, 1, 1];
        let seq_q = self.tensor(
            uid::SEQ_LEN_Q,
            DType::Int32,
            lens,
            [1, 1, 1, 1],
            Binding::Scratch(seq_q_off),
        );
        let seq_kv = self.tensor(
            uid::SEQ_LEN_KV,
            DType::Int32,
            lens,
            [1, 1, 1, 1],
            Binding::Scratch(seq_kv_off),
        );
        let wide = ragged_offsets_need_i64(spec);
        let (ragged, ragged_off) = if spec.is_ragged() {
            let mut uids = [0i64; 4];
            let mut offs = [0usize; 4];
            for (i, u) in [uid::RAGGED_Q, uid::RAGGED_K, uid::RAGGED_V, uid::RAGGED_O]
                .into_iter()
                .enumerate()
            {
                offs[i] = take((b as usize + 1) * 8);
                uids[i] = self.tensor(
                    u,
                    if wide { DType::Int64 } else { DType::Int32 },
                    [b + 1, 1, 1, 1],
                    [1, 1, 1, 1],
                    Binding::Scratch(offs[i]),
                );
            }
            (Some(uids), Some(offs))
        } else {
            (None, None)
        };
        let stats = take((b * spec.h_q * spec.s_q) as usize * 4);
        Varlen {
            seq_q,
            seq_kv,
            ragged,
            scratch: VarlenScratch {
                packing,
                seq_q: seq_q_off,
                seq_kv: seq_kv_off,
                start_q,
                start_kv,
                ragged: ragged_off,
                ragged_wide: wide,
                stats,
            },
        }
    }

    /// cudnn-frontend's `padding_mask` score modifier: keep (row < seq_len_q[b]) AND
    /// (col < seq_len_kv[b]), -inf elsewhere.
    fn padding_mask(&mut self, scores: i64, vl: &Varlen) -> i64 {
        let neg_inf = self.scalar(uid::NEG_INF, Binding::ConstF32(f32::NEG_INFINITY));
        let index = |g: &mut Self, axis: i64| {
            let y = g.virt(DType::Int32, g.dims(scores));
            g.ops.push(Op::Pointwise {
                mode: PwMode::GenIndex,
                x: scores,
                b: None,
                t: None,
                y,
                prec: DType::Int32,
                axis: Some(axis),
            });
            y
        };
        let row = index(self, 2);
        let col = index(self, 3);
        let row_ok = self.compare(PwMode::CmpLt, row, vl.seq_q);
        let col_ok = self.compare(PwMode::CmpLt, col, vl.seq_kv);
        let keep = self.compare(PwMode::LogicalAnd, row_ok, col_ok);
        self.select(scores, neg_inf, keep)
    }

    fn reduce(&mut self, op: RedOp, x: i64, y: i64) {
        self.ops.push(Op::Reduction { op, x, y });
    }

    fn gen_index(&mut self, x: i64, axis: i64) -> i64 {
        let y = self.virt(DType::Int32, self.dims(x));
        self.ops.push(Op::Pointwise {
            mode: PwMode::GenIndex,
            x,
            b: None,
            t: None,
            y,
            prec: DType::Float,
            axis: Some(axis),
        });
        y
    }

    /// `x (+) scalar` with the frontend's compute type and axis 3 (as `CompositeDiagonalBandMaskNode`).
    fn index_arith(&mut self, mode: PwMode, x: i64, scalar: i64, out: DType) -> i64 {
        let y = self.virt(out, self.dims(x));
        self.ops.push(Op::Pointwise {
            mode,
            x,
            b: Some(scalar),
            t: None,
            y,
            prec: out,
            axis: Some(3),
        });
        y
    }

    fn compare(&mut self, mode: PwMode, x: i64, b: i64) -> i64 {
        let y = self.virt(DType::Boolean, self.dims(x));
        self.ops.push(Op::Pointwise {
            mode,
            x,
            b: Some(b),
            t: None,
            y,
            prec: DType::Boolean,
            axis: None,
        });
        y
    }

    fn select(&mut self, x: i64, fill: i64, cond: i64) -> i64 {
        let y = self.virt(DType::Float, self.dims(x));
        self.ops.push(Op::Pointwise {
            mode: PwMode::BinarySelect,
            x,
            b: Some(fill),
            t: Some(cond),
            y,
            prec: DType::Float,
            axis: None,
        });
        y
    }

    /// The mask as `CompositeDiagonalBandMaskNode` lowers it before cuDNN 9.21 (GEN_INDEX,
    /// compare, BINARY_SELECT with -inf); the form proven on 9.19. Returns the masked scores.
    ///
    /// With per-sequence lengths (`vl`) a bottom-right diagonal sits at each sequence's own
    /// `seq_len_kv[b] - seq_len_q[b]` (the per-batch tensors replace the scalars, as in
    /// `CompositeDiagonalBandMaskNode`).
    fn composite_mask(&mut self, spec: &SdpaSpec, scores: i64, vl: Option<&Varlen>) -> i64 {
        let m = spec.mask;
        let mut cur = scores;
        if let Some(right) = m.right {
            let neg_inf = self.scalar(uid::NEG_INF, Binding::ConstF32(f32::NEG_INFINITY));
            let mut row = self.gen_index(cur, 2);
            let col = self.gen_index(cur, 3);
            if m.diagonal == Diagonal::BottomRight {
                let (skv, sq) = match vl {
                    Some(vl) => (vl.seq_kv, vl.seq_q),
                    None => (
                        self.scalar(uid::SEQ_KV, Binding::ConstI32(spec.s_kv as i32)),
                        self.scalar(uid::SEQ_Q, Binding::ConstI32(spec.s_q as i32)),
                    ),
                };
                row = self.index_arith(PwMode::Add, row, skv, DType::Int32);
                row = self.index_arith(PwMode::Sub, row, sq, DType::Int32);
            }
            if right != 0 {
                let shift = self.scalar(uid::SHIFT_RIGHT, Binding::ConstI32(right as i32));
                row = self.index_arith(PwMode::Add, row, shift, DType::Int32);
            }
            let keep = self.compare(PwMode::CmpGe, row, col);
            cur = self.select(cur, neg_inf, keep);
        }
        if let Some(left) = m.left {
            let neg_inf = self.scalar(uid::NEG_INF, Binding::ConstF32(f32::NEG_INFINITY));
            let row = self.gen_index(cur, 2);
            let col = self.gen_index(cur, 3);
            // cuDNN's left bound counts visible keys including the diagonal: keep col + W > r.
            let colw = match vl {
                // per batch: col + W - seq_len_kv[b] + seq_len_q[b] > row, in int32
                Some(vl) if m.diagonal == Diagonal::BottomRight => {
                    let wt = self.scalar(uid::LEFT_BOUND, Binding::ConstI32((left + 1) as i32));
                    let c = self.index_arith(PwMode::Add, col, wt, DType::Int32);
                    let c = self.index_arith(PwMode::Sub, c, vl.seq_kv, DType::Int32);
                    self.index_arith(PwMode::Add, c, vl.seq_q, DType::Int32)
                }
                _ => {
                    let w = left + 1 - m.offset(spec.s_q, spec.s_kv);
                    let wt = self.scalar(uid::LEFT_BOUND, Binding::ConstF32(w as f32));
                    self.index_arith(PwMode::Add, col, wt, DType::Float)
                }
            };
            let keep = self.compare(PwMode::CmpGt, colw, row);
            cur = self.select(cur, neg_inf, keep);
        }
        cur
    }

    fn finish(self, kind: GraphKind, scratch_bytes: usize, varlen: Option<&Varlen>) -> GraphIr {
        GraphIr {
            kind,
            tensors: self.tensors,
            ops: self.ops,
            scratch_bytes,
            varlen: varlen.map(|v| v.scratch),
        }
    }
}

/// The per-sequence tensors of a graph being built.
struct Varlen {
    seq_q: i64,
    seq_kv: i64,
    /// Ragged-offset uids of Q, K, V, O.
    ragged: Option<[i64; 4]>,
    scratch: VarlenScratch,
}

impl Varlen {
    fn ragged(&self, i: usize) -> Option<i64> {
        self.ragged.map(|r| r[i])
    }
    /// The overrides of a matmul whose M and N/K run over (rows of) queries or keys.
    fn gemm(vl: Option<&Varlen>, m_q: bool, n: bool) -> GemmOverrides {
        let Some(vl) = vl else {
            return GemmOverrides::default();
        };
        let (m, other) = if m_q {
            (vl.seq_q, vl.seq_kv)
        } else {
            (vl.seq_kv, vl.seq_q)
        };
        GemmOverrides {
            m: Some(m),
            n: n.then_some(other),
            k: (!n).then_some(other),
        }
    }
}

const RQ: usize = 0;
const RK: usize = 1;
const RV: usize = 2;
const RO: usize = 3;

fn stats_strides(spec: &SdpaSpec) -> Strides {
    dense([spec.b, spec.h_q, spec.s_q, 1])
}

/// Whether some element offset of a token tensor may not fit int32: a bound over the batch
/// (packed batches fit it too, their tokens are at most `b * s`).
pub fn ragged_offsets_need_i64(spec: &SdpaSpec) -> bool {
    let l = &spec.layouts;
    let extent = |st: Strides, h: i64, s: i64| (spec.b + 1) * (st[0] + st[1] * h + st[2] * s);
    let most = [
        extent(l.q, spec.h_q, spec.s_q),
        extent(l.k, spec.h_kv, spec.s_kv),
        extent(l.v, spec.h_kv, spec.s_kv),
        extent(l.o, spec.h_q, spec.s_q),
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    most > i64::from(i32::MAX)
}

/// The composite forward graph (any cuDNN 9): O and LSE.
pub fn composite_fwd(spec: &SdpaSpec) -> GraphIr {
    let io = DType::from(spec.dtype);
    let (b, hq, hk, sq, skv, dqk, dv) = (
        spec.b, spec.h_q, spec.h_kv, spec.s_q, spec.s_kv, spec.d_qk, spec.d_v,
    );
    let l = &spec.layouts;
    let mut g = Builder::new();
    let mut scratch = 0;
    let vl = spec
        .seqlens
        .map(|packing| g.varlen(spec, packing, &mut scratch));
    let vl = vl.as_ref();
    let q = g.tensor(uid::Q, io, [b, hq, sq, dqk], l.q, Binding::Io(IoRole::Q));
    let kt = g.tensor(
        uid::K,
        io,
        [b, hk, dqk, skv],
        transposed(l.k),
        Binding::Io(IoRole::K),
    );
    let v = g.tensor(uid::V, io, [b, hk, skv, dv], l.v, Binding::Io(IoRole::V));
    let o = g.tensor(uid::O, io, [b, hq, sq, dv], l.o, Binding::Io(IoRole::O));
    g.set_ragged_all(vl, &[(q, RQ), (kt, RK), (v, RV), (o, RO)]);
    let stats = g.stats(spec, vl);
    let scale = g.scalar(uid::SCALE, Binding::Scale);
    let sdims = [b, hq, sq, skv];
    let rdims = [b, hq, sq, 1];

    let s1 = g.virt(DType::Float, sdims);
    g.matmul(q, kt, s1, Varlen::gemm(vl, true, true));
    let mut s2 = g.pw_new(PwMode::Mul, s1, Some(scale));
    if let Some(vl) = vl {
        s2 = g.padding_mask(s2, vl);
    }
    let s3 = g.composite_mask(spec, s2, vl);
    let mx = g.virt(DType::Float, rdims);
    g.reduce(RedOp::Max, s3, mx);
    let sub = g.pw_new(PwMode::Sub, s3, Some(mx));
    let ex = g.pw_new(PwMode::Exp, sub, None);
    let sm = g.virt(DType::Float, rdims);
    g.reduce(RedOp::Add, ex, sm);
    let lg = g.pw_new(PwMode::Log, sm, None);
    g.pw(PwMode::Add, mx, Some(lg), stats);
    let p = g.virt(io, sdims);
    g.pw(PwMode::Div, ex, Some(sm), p);
    g.matmul(p, v, o, Varlen::gemm(vl, true, false));
    g.finish(GraphKind::CompositeFwd, scratch, vl)
}

/// The native SDPA forward op. On cuDNN < 9.21 only the unmasked form exists (LSE through
/// `STATSDESC`); from 9.21 masks go through a `DIAGONAL_BAND_MASK` subgraph and LSE through a
/// `SOFTMAX` op, as cudnn-frontend's `UnifiedSDPANode` builds them.
pub fn native_fwd(spec: &SdpaSpec, version: CudnnVersion) -> GraphIr {
    let io = DType::from(spec.dtype);
    let (b, hq, hk, sq, skv, dqk, dv) = (
        spec.b, spec.h_q, spec.h_kv, spec.s_q, spec.s_kv, spec.d_qk, spec.d_v,
    );
    let l = &spec.layouts;
    let v921 = version.has_sdpa_subgraph();
    let mut g = Builder::new();
    let q = g.tensor(uid::Q, io, [b, hq, sq, dqk], l.q, Binding::Io(IoRole::Q));
    let k = g.tensor(uid::K, io, [b, hk, skv, dqk], l.k, Binding::Io(IoRole::K));
    let v = g.tensor(uid::V, io, [b, hk, skv, dv], l.v, Binding::Io(IoRole::V));
    let o = g.tensor(uid::O, io, [b, hq, sq, dv], l.o, Binding::Io(IoRole::O));
    let st = g.stats(spec, None);
    let scale = g.scalar(uid::SCALE, Binding::Scale);
    let sdims = [b, hq, sq, skv];
    let stats = if v921 {
        let x = g.virt(DType::Float, sdims);
        let y = g.virt(DType::Float, sdims);
        NativeStats::Softmax { x, y, stats: st }
    } else {
        NativeStats::StatsDesc(st)
    };
    let m = spec.mask;
    let mask = if v921 && !m.is_none() {
        let neg_inf = g.scalar(uid::NEG_INF, Binding::ConstF32(f32::NEG_INFINITY));
        let input = g.virt(DType::Float, sdims);
        let mut cur = input;
        let mut band = Vec::new();
        if let Some(right) = m.right {
            let y = g.virt(DType::Float, sdims);
            let (seq_q, seq_kv) = if m.diagonal == Diagonal::BottomRight {
                (
                    Some(g.scalar(uid::SEQ_Q, Binding::ConstI32(sq as i32))),
                    Some(g.scalar(uid::SEQ_KV, Binding::ConstI32(skv as i32))),
                )
            } else {
                (None, None)
            };
            let shift_right =
                (right != 0).then(|| g.scalar(uid::SHIFT_RIGHT, Binding::ConstI32(right as i32)));
            band.push(BandMaskOp {
                x: cur,
                b: neg_inf,
                y,
                cmp: PwMode::CmpGe,
                left_bound: None,
                shift_right,
                seq_q,
                seq_kv,
            });
            cur = y;
        }
        if let Some(left) = m.left {
            let y = g.virt(DType::Float, sdims);
            let w = left + 1 - m.offset(sq, skv);
            let lb = g.scalar(uid::LEFT_BOUND, Binding::ConstF32(w as f32));
            band.push(BandMaskOp {
                x: cur,
                b: neg_inf,
                y,
                cmp: PwMode::CmpGt,
                left_bound: Some(lb),
                shift_right: None,
                seq_q: None,
                seq_kv: None,
            });
            cur = y;
        }
        Some((band, input, cur))
    } else {
        None
    };
    g.ops.push(Op::SdpaFwd {
        q,
        k,
        v,
        o,
        scale,
        stats,
        mask,
    });
    g.finish(GraphKind::NativeFwd, 0, None)
}

/// The caller's tensors of the composite backward (K and V as their transposed views).
struct BwdIo {
    q: i64,
    kt: i64,
    vt: i64,
    o: i64,
    d_o: i64,
    dq: i64,
    dk: i64,
    dvt: i64,
}

fn bwd_io(g: &mut Builder, spec: &SdpaSpec) -> BwdIo {
    let io = DType::from(spec.dtype);
    let (b, hq, hk, sq, skv, dqk, dv) = (
        spec.b, spec.h_q, spec.h_kv, spec.s_q, spec.s_kv, spec.d_qk, spec.d_v,
    );
    let l = &spec.layouts;
    let gl = l
        .grads
        .expect("backward spec validated with gradient layouts");
    let q = g.tensor(uid::Q, io, [b, hq, sq, dqk], l.q, Binding::Io(IoRole::Q));
    let kt = g.tensor(
        uid::K,
        io,
        [b, hk, dqk, skv],
        transposed(l.k),
        Binding::Io(IoRole::K),
    );
    let vt = g.tensor(
        uid::V,
        io,
        [b, hk, dv, skv],
        transposed(l.v),
        Binding::Io(IoRole::V),
    );
    let o = g.tensor(uid::O, io, [b, hq, sq, dv], l.o, Binding::Io(IoRole::O));
    let d_o = g.tensor(
        uid::DO,
        io,
        [b, hq, sq, dv],
        gl.d_o,
        Binding::Io(IoRole::DO),
    );
    let dq = g.tensor(
        uid::DQ,
        io,
        [b, hq, sq, dqk],
        gl.dq,
        Binding::Io(IoRole::DQ),
    );
    let dk = g.tensor(
        uid::DK,
        io,
        [b, hk, skv, dqk],
        gl.dk,
        Binding::Io(IoRole::DK),
    );
    let dvt = g.tensor(
        uid::DV,
        io,
        [b, hk, skv, dv],
        gl.dv,
        Binding::Io(IoRole::DV),
    );
    BwdIo {
        q,
        kt,
        vt,
        o,
        d_o,
        dq,
        dk,
        dvt,
    }
}

/// The composite backward graph (cudnn-frontend's `CompositeSDPABackwardNode`, cuDNN >= 9.6, no
/// dropout or bias). With `spec.deterministic` the last matmul writes dQ directly (the
/// frontend's "dP workspace" form); otherwise dQ is accumulated in fp32 scratch.
pub fn composite_bwd(spec: &SdpaSpec) -> GraphIr {
    let io = DType::from(spec.dtype);
    let (b, hq, hk, sq, skv, dqk, dv) = (
        spec.b, spec.h_q, spec.h_kv, spec.s_q, spec.s_kv, spec.d_qk, spec.d_v,
    );
    let l = &spec.layouts;
    let mut g = Builder::new();
    let mut scratch = 0;
    let BwdIo {
        q,
        kt,
        vt,
        o,
        d_o,
        dq,
        dk,
        dvt,
    } = bwd_io(&mut g, spec);
    let scale = g.scalar(uid::SCALE, Binding::Scale);
    let one = g.scalar(uid::ONE, Binding::ConstF32(1.0));

    let rdims = [b, hq, sq, 1];
    let sdims = [b, hq, sq, skv];
    let ssum_bytes = (b * hq * sq) as usize * 4;
    let ssum = g.tensor(
        uid::SOFTMAX_SUM,
        DType::Float,
        rdims,
        dense(rdims),
        Binding::Scratch(scratch),
    );
    scratch += align_up(ssum_bytes);
    let vl = spec
        .seqlens
        .map(|packing| g.varlen(spec, packing, &mut scratch));
    let vl = vl.as_ref();
    // dQ, dK, dV, dO share the strides (and so the offsets) of Q, K, V, O
    g.set_ragged_all(
        vl,
        &[
            (q, RQ),
            (kt, RK),
            (vt, RV),
            (o, RO),
            (d_o, RO),
            (dq, RQ),
            (dk, RK),
            (dvt, RV),
        ],
    );
    let stats = g.stats(spec, vl);

    // softmax_sum = Σ_d dO * O
    let t1 = g.pw_new(PwMode::Mul, d_o, Some(o));
    let t2 = g.virt(DType::Float, rdims);
    g.reduce(RedOp::Add, t1, t2);
    g.pw(PwMode::Mul, t2, Some(one), ssum);

    // P = exp(mask(scale * Q Kᵀ - LSE))
    let s1 = g.virt(DType::Float, sdims);
    g.matmul(q, kt, s1, Varlen::gemm(vl, true, true));
    let mut s2 = g.pw_new(PwMode::Mul, s1, Some(scale));
    // the frontend pads before subtracting Stats and applies the band after
    if let Some(vl) = vl {
        s2 = g.padding_mask(s2, vl);
    }
    let s3 = g.pw_new(PwMode::Sub, s2, Some(stats));
    let s4 = g.composite_mask(spec, s3, vl);
    let p = g.pw_new(PwMode::Exp, s4, None);

    // dV = Pᵀ dO (GQA: per query head, then summed over the group)
    let t_dims = [b, hq, skv, sq];
    let t_strides = [hq * sq * skv, sq * skv, 1, skv];
    let pt = g.virt_strided(io, t_dims, t_strides);
    g.ops.push(Op::Reshape { x: p, y: pt });
    let kv_rows = Varlen::gemm(vl, false, false);
    if hq == hk {
        g.matmul(pt, d_o, dvt, kv_rows);
    } else {
        let full = g.virt(io, [b, hq, skv, dv]);
        g.matmul(pt, d_o, full, kv_rows);
        g.reduce(RedOp::Add, full, dvt);
    }

    // dS = scale * P * (dO Vᵀ - softmax_sum)
    let dp = g.virt(DType::Float, sdims);
    g.matmul(d_o, vt, dp, Varlen::gemm(vl, true, true));
    let t3 = g.pw_new(PwMode::Sub, dp, Some(ssum));
    let t4 = g.pw_new(PwMode::Mul, t3, Some(p));
    let ds = g.pw_new(PwMode::Mul, t4, Some(scale));

    // dK = dSᵀ Q
    let dst = g.virt_strided(io, t_dims, t_strides);
    g.ops.push(Op::Reshape { x: ds, y: dst });
    if hq == hk {
        g.matmul(dst, q, dk, kv_rows);
    } else {
        let full = g.virt(io, [b, hq, skv, dqk]);
        g.matmul(dst, q, full, kv_rows);
        g.reduce(RedOp::Add, full, dk);
    }

    // dQ = dS K
    let kr = g.virt_strided(io, [b, hk, skv, dqk], l.k);
    // the view of K keeps K's ragged offsets (as the frontend's reshape_k)
    g.set_ragged(kr, vl.and_then(|vl| vl.ragged(RK)));
    g.ops.push(Op::Reshape { x: kt, y: kr });
    let q_rows = Varlen::gemm(vl, true, false);
    if spec.deterministic {
        g.matmul(ds, kr, dq, q_rows);
    } else {
        let qdims = [b, hq, sq, dqk];
        let acc = g.tensor(
            uid::DQ_ACCUM,
            DType::Float,
            qdims,
            dense(qdims),
            Binding::Scratch(scratch),
        );
        scratch += align_up((b * hq * sq * dqk) as usize * 4);
        g.matmul(ds, kr, acc, q_rows);
        g.pw(PwMode::Identity, acc, None, dq);
    }
    g.finish(GraphKind::CompositeBwd, scratch, vl)
}

impl GraphIr {
    /// The uids every op (and the native op's subgraph) references.
    pub fn referenced_uids(&self) -> BTreeSet<i64> {
        let mut s = BTreeSet::new();
        for op in &self.ops {
            match op {
                Op::Matmul {
                    a, b, c, overrides, ..
                } => {
                    s.extend([*a, *b, *c]);
                    s.extend(
                        [overrides.m, overrides.n, overrides.k]
                            .into_iter()
                            .flatten(),
                    );
                }
                Op::Pointwise { x, b, t, y, .. } => {
                    s.extend([*x, *y]);
                    s.extend(b.iter().chain(t.iter()).copied());
                }
                Op::Reduction { x, y, .. } | Op::Reshape { x, y } => s.extend([*x, *y]),
                Op::SdpaFwd {
                    q,
                    k,
                    v,
                    o,
                    scale,
                    stats,
                    mask,
                } => {
                    s.extend([*q, *k, *v, *o, *scale]);
                    match stats {
                        NativeStats::StatsDesc(st) => {
                            s.insert(*st);
                        }
                        NativeStats::Softmax { x, y, stats } => s.extend([*x, *y, *stats]),
                    }
                    if let Some((band, input, output)) = mask {
                        s.extend([*input, *output]);
                        for m in band {
                            s.extend([m.x, m.b, m.y]);
                            s.extend(
                                [m.left_bound, m.shift_right, m.seq_q, m.seq_kv]
                                    .into_iter()
                                    .flatten(),
                            );
                        }
                    }
                }
            }
        }
        // a tensor's ragged offsets are referenced through the tensor
        let ragged: Vec<i64> = s
            .iter()
            .filter_map(|u| self.tensors.get(u).and_then(|t| t.ragged))
            .collect();
        s.extend(ragged);
        s
    }

    /// The non-virtual tensors: exactly the variant pack's entries.
    pub fn variant_pack(&self) -> Vec<&Tensor> {
        self.tensors.values().filter(|t| !t.is_virtual()).collect()
    }

    /// The caller tensors this graph binds.
    pub fn io_roles(&self) -> BTreeSet<IoRole> {
        self.tensors
            .values()
            .filter_map(|t| match t.binding {
                Binding::Io(r) => Some(r),
                _ => None,
            })
            .collect()
    }

    /// Number of ops in the main graph.
    pub fn op_count(&self) -> usize {
        self.ops.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cudnn::spec::{MaskSpec, bshd_strides};

    fn v(x: u32) -> CudnnVersion {
        CudnnVersion(x)
    }

    fn specs() -> Vec<SdpaSpec> {
        let mut out = Vec::new();
        for mask in [
            MaskSpec::NONE,
            MaskSpec::CAUSAL,
            MaskSpec::CAUSAL_BOTTOM_RIGHT,
            MaskSpec {
                left: Some(16),
                right: Some(0),
                diagonal: Diagonal::TopLeft,
            },
            MaskSpec {
                left: Some(16),
                right: Some(4),
                diagonal: Diagonal::BottomRight,
            },
            MaskSpec {
                left: Some(8),
                right: None,
                diagonal: Diagonal::TopLeft,
            },
        ] {
            for (hq, hk) in [(8, 8), (8, 2)] {
                for det in [false, true] {
                    let mut s = SdpaSpec::dense_bhsd(2, hq, hk, 64, 96, 128, IoDtype::Bf16, mask);
                    s.deterministic = det;
                    out.push(s);
                }
            }
        }
        out
    }

    fn assert_well_formed(g: &GraphIr) {
        // every referenced uid is defined, and every defined uid is referenced: an unused
        // by-value scalar in the variant pack makes cudnnBackendExecute fail (measured on 9.19)
        let referenced = g.referenced_uids();
        let defined: BTreeSet<i64> = g.tensors.keys().copied().collect();
        assert_eq!(referenced, defined, "{:?}", g.kind);
        for t in g.tensors.values() {
            // the head dim is contiguous in every bound tensor (Kᵀ/Vᵀ views: in dim 2)
            assert!(
                t.strides[3] == 1 || t.strides[2] == 1 || t.dims[3] == 1,
                "uid {}",
                t.uid
            );
            if t.is_virtual() {
                assert!(t.uid >= uid::FIRST_VIRTUAL);
            }
        }
    }

    #[test]
    fn every_graph_binds_exactly_the_tensors_its_ops_use() {
        for s in specs() {
            for g in [
                composite_fwd(&s),
                native_fwd(&s, v(91900)),
                native_fwd(&s, v(92100)),
                composite_bwd(&s),
            ] {
                assert_well_formed(&g);
            }
        }
    }

    #[test]
    fn unmasked_graphs_carry_no_neg_inf_scalar() {
        let s = SdpaSpec::dense_bhsd(1, 4, 4, 64, 64, 64, IoDtype::F16, MaskSpec::NONE);
        for g in [
            composite_fwd(&s),
            composite_bwd(&s),
            native_fwd(&s, v(92100)),
        ] {
            assert!(!g.tensors.contains_key(&uid::NEG_INF), "{:?}", g.kind);
        }
        let c = SdpaSpec::dense_bhsd(1, 4, 4, 64, 64, 64, IoDtype::F16, MaskSpec::CAUSAL);
        assert!(composite_fwd(&c).tensors.contains_key(&uid::NEG_INF));
    }

    #[test]
    fn composite_forward_matches_the_probed_op_count() {
        // probe.py's causal composite forward: 14 ops (matmul, mul, 4 mask ops, max, sub, exp,
        // sum, log, add, div, matmul)
        let s = SdpaSpec::dense_bhsd(2, 4, 2, 512, 512, 128, IoDtype::Bf16, MaskSpec::CAUSAL);
        assert_eq!(composite_fwd(&s).op_count(), 14);
        let s = SdpaSpec::dense_bhsd(2, 4, 2, 512, 512, 128, IoDtype::Bf16, MaskSpec::NONE);
        assert_eq!(composite_fwd(&s).op_count(), 10);
    }

    #[test]
    fn composite_backward_matches_the_probed_op_count_and_scratch() {
        // probe.py's causal GQA backward: 24 ops; MHA: 22
        let s = SdpaSpec::dense_bhsd(2, 4, 2, 512, 512, 128, IoDtype::Bf16, MaskSpec::CAUSAL);
        let g = composite_bwd(&s);
        assert_eq!(g.op_count(), 24);
        assert_eq!(g.scratch_bytes, 2 * 4 * 512 * 4 + 2 * 4 * 512 * 128 * 4);
        let s = SdpaSpec::dense_bhsd(2, 4, 4, 512, 512, 128, IoDtype::Bf16, MaskSpec::CAUSAL);
        assert_eq!(composite_bwd(&s).op_count(), 22);
        // deterministic: dQ straight from the matmul, no fp32 accumulator, no identity
        let mut d = s;
        d.deterministic = true;
        let g = composite_bwd(&d);
        assert_eq!(g.op_count(), 21);
        assert!(!g.tensors.contains_key(&uid::DQ_ACCUM));
        assert_eq!(g.scratch_bytes, 2 * 4 * 512 * 4);
    }

    #[test]
    fn transposed_views_share_the_callers_storage() {
        let mut s = SdpaSpec::dense_bhsd(2, 8, 4, 64, 80, 64, IoDtype::Bf16, MaskSpec::CAUSAL);
        s.layouts.k = bshd_strides(4, 80, 64);
        s.layouts.v = bshd_strides(4, 80, 64);
        let g = composite_bwd(&s);
        let kt = g.tensors[&uid::K];
        assert_eq!(kt.dims, [2, 4, 64, 80]);
        assert_eq!(kt.strides, [80 * 4 * 64, 64, 1, 4 * 64]);
        assert_eq!(kt.binding, Binding::Io(IoRole::K));
        let vt = g.tensors[&uid::V];
        assert_eq!(vt.dims, [2, 4, 64, 80]);
        let n = native_fwd(&s, v(91900));
        assert_eq!(n.tensors[&uid::K].dims, [2, 4, 80, 64]);
        assert_eq!(n.tensors[&uid::K].strides, s.layouts.k);
    }

    #[test]
    fn native_forward_switches_stats_and_mask_form_at_9_21() {
        let s = SdpaSpec::dense_bhsd(1, 4, 4, 64, 64, 64, IoDtype::F16, MaskSpec::CAUSAL);
        let old = native_fwd(&s, v(91900));
        assert!(matches!(
            old.ops[0],
            Op::SdpaFwd {
                stats: NativeStats::StatsDesc(_),
                mask: None,
                ..
            }
        ));
        let new = native_fwd(&s, v(92100));
        match &new.ops[0] {
            Op::SdpaFwd {
                stats: NativeStats::Softmax { .. },
                mask: Some((band, _, _)),
                ..
            } => {
                assert_eq!(band.len(), 1);
                assert_eq!(band[0].cmp, PwMode::CmpGe);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn window_left_bound_uses_cudnn_inclusive_count() {
        // TE window (w, 0) keeps col >= row - w; cuDNN keeps col + W > row, so W = w + 1.
        let m = MaskSpec {
            left: Some(16),
            right: Some(0),
            diagonal: Diagonal::TopLeft,
        };
        let s = SdpaSpec::dense_bhsd(1, 1, 1, 64, 64, 64, IoDtype::F16, m);
        let g = composite_fwd(&s);
        assert_eq!(g.tensors[&uid::LEFT_BOUND].binding, Binding::ConstF32(17.0));
        // bottom-right with s_q=64, s_kv=96 shifts the bound by s_kv - s_q
        let m = MaskSpec {
            diagonal: Diagonal::BottomRight,
            ..m
        };
        let s = SdpaSpec::dense_bhsd(1, 1, 1, 64, 96, 64, IoDtype::F16, m);
        let g = composite_fwd(&s);
        assert_eq!(
            g.tensors[&uid::LEFT_BOUND].binding,
            Binding::ConstF32(17.0 - 32.0)
        );
        assert_eq!(g.tensors[&uid::SEQ_KV].binding, Binding::ConstI32(96));
    }

    fn varlen_spec(packing: SeqPacking, mask: MaskSpec, hk: i64, det: bool) -> SdpaSpec {
        let mut s = SdpaSpec::dense_bhsd(3, 8, hk, 96, 128, 64, IoDtype::Bf16, mask);
        s.layouts.q = bshd_strides(8, 96, 64);
        s.layouts.k = bshd_strides(hk, 128, 64);
        s.layouts.v = bshd_strides(hk, 128, 64);
        s.layouts.o = bshd_strides(8, 96, 64);
        s.deterministic = det;
        s.seqlens = Some(packing);
        s
    }

    const PACKINGS: [SeqPacking; 3] = [
        SeqPacking::PaddedRight,
        SeqPacking::PaddedLeft,
        SeqPacking::Packed,
    ];

    fn matmuls(g: &GraphIr) -> Vec<(i64, i64, i64, GemmOverrides)> {
        g.ops
            .iter()
            .filter_map(|op| match op {
                Op::Matmul { a, b, c, overrides } => Some((*a, *b, *c, *overrides)),
                _ => None,
            })
            .collect()
    }

    fn modes(g: &GraphIr, mode: PwMode) -> usize {
        g.ops
            .iter()
            .filter(|op| matches!(op, Op::Pointwise { mode: m, .. } if *m == mode))
            .count()
    }

    #[test]
    fn varlen_graphs_bind_exactly_the_tensors_their_ops_use() {
        for packing in PACKINGS {
            for base in specs() {
                let mut s = base;
                s.seqlens = Some(packing);
                for g in [composite_fwd(&s), composite_bwd(&s)] {
                    assert_well_formed(&g);
                    assert!(g.varlen.is_some());
                }
            }
        }
    }

    #[test]
    fn padding_mask_is_the_frontends_and_binds_the_seq_len_tensors() {
        let s = varlen_spec(SeqPacking::PaddedRight, MaskSpec::CAUSAL, 2, false);
        let g = composite_fwd(&s);
        let pack: BTreeSet<i64> = g.variant_pack().iter().map(|t| t.uid).collect();
        assert_eq!(
            pack,
            BTreeSet::from([
                uid::Q,
                uid::K,
                uid::V,
                uid::O,
                uid::STATS,
                uid::SCALE,
                uid::NEG_INF,
                uid::SEQ_LEN_Q,
                uid::SEQ_LEN_KV,
                uid::RAGGED_Q,
                uid::RAGGED_K,
                uid::RAGGED_V,
                uid::RAGGED_O
            ])
        );
        // 10 softmax/matmul ops, 6 for the padding mask (2 GEN_INDEX, 2 CMP_LT, AND, SELECT),
        // 4 for the causal band
        assert_eq!(g.op_count(), 20);
        assert_eq!(modes(&g, PwMode::CmpLt), 2);
        assert_eq!(modes(&g, PwMode::LogicalAnd), 1);
        assert_eq!(modes(&g, PwMode::BinarySelect), 2);
        // right padding is ragged too (cuDNN then reads no padding row); Stats is the
        // executor's dense scratch, not the LSE
        assert_eq!(g.tensors[&uid::Q].ragged, Some(uid::RAGGED_Q));
        let vs = g.varlen.unwrap();
        assert_eq!(g.tensors[&uid::STATS].binding, Binding::Scratch(vs.stats));
        assert!(!g.io_roles().contains(&IoRole::Stats));
        for u in [uid::SEQ_LEN_Q, uid::SEQ_LEN_KV] {
            let t = g.tensors[&u];
            assert_eq!((t.dtype, t.dims), (DType::Int32, [3, 1, 1, 1]));
            assert!(!t.is_virtual() && !t.is_by_value());
        }
        assert_eq!(
            g.tensors[&uid::SEQ_LEN_Q].binding,
            Binding::Scratch(vs.seq_q)
        );
        assert_eq!(
            g.tensors[&uid::SEQ_LEN_KV].binding,
            Binding::Scratch(vs.seq_kv)
        );
    }

    #[test]
    fn ragged_packings_offset_every_token_tensor() {
        for packing in [
            SeqPacking::PaddedRight,
            SeqPacking::PaddedLeft,
            SeqPacking::Packed,
        ] {
            let s = varlen_spec(packing, MaskSpec::CAUSAL_BOTTOM_RIGHT, 2, false);
            let f = composite_fwd(&s);
            for (t, r) in [
                (uid::Q, uid::RAGGED_Q),
                (uid::K, uid::RAGGED_K),
                (uid::V, uid::RAGGED_V),
                (uid::O, uid::RAGGED_O),
            ] {
                assert_eq!(f.tensors[&t].ragged, Some(r), "{packing:?} fwd {t}");
                let rt = f.tensors[&r];
                assert_eq!((rt.dtype, rt.dims), (DType::Int32, [4, 1, 1, 1]));
            }
            let b = composite_bwd(&s);
            for (t, r) in [
                (uid::Q, uid::RAGGED_Q),
                (uid::DQ, uid::RAGGED_Q),
                (uid::K, uid::RAGGED_K),
                (uid::DK, uid::RAGGED_K),
                (uid::V, uid::RAGGED_V),
                (uid::DV, uid::RAGGED_V),
                (uid::O, uid::RAGGED_O),
                (uid::DO, uid::RAGGED_O),
            ] {
                assert_eq!(b.tensors[&t].ragged, Some(r), "{packing:?} bwd {t}");
            }
            // the K view of the dQ matmul keeps K's offsets; no other virtual tensor is ragged
            let virt: Vec<&Tensor> = b
                .tensors
                .values()
                .filter(|t| t.is_virtual() && t.ragged.is_some())
                .collect();
            assert_eq!(virt.len(), 1);
            assert_eq!(virt[0].ragged, Some(uid::RAGGED_K));
            assert_eq!(virt[0].dims, [3, 2, 128, 64]);
            // softmax_sum, dQ accumulator and Stats stay dense
            for u in [uid::SOFTMAX_SUM, uid::DQ_ACCUM, uid::STATS] {
                assert_eq!(b.tensors[&u].ragged, None);
            }
            let vs = b.varlen.unwrap();
            assert!(vs.ragged.is_some() && !vs.ragged_wide);
            // the backward's variant pack, exactly
            let pack: BTreeSet<i64> = b.variant_pack().iter().map(|t| t.uid).collect();
            let want = BTreeSet::from([
                uid::Q,
                uid::K,
                uid::V,
                uid::O,
                uid::DO,
                uid::DQ,
                uid::DK,
                uid::DV,
                uid::STATS,
                uid::SCALE,
                uid::NEG_INF,
                uid::ONE,
                uid::SOFTMAX_SUM,
                uid::DQ_ACCUM,
                uid::SEQ_LEN_Q,
                uid::SEQ_LEN_KV,
                uid::RAGGED_Q,
                uid::RAGGED_K,
                uid::RAGGED_V,
                uid::RAGGED_O,
            ]);
            assert_eq!(pack, want, "{packing:?}");
        }
    }

    #[test]
    fn gemm_overrides_follow_the_frontend() {
        let s = varlen_spec(SeqPacking::PaddedRight, MaskSpec::NONE, 2, false);
        let (q, kv) = (Some(uid::SEQ_LEN_Q), Some(uid::SEQ_LEN_KV));
        let qk = GemmOverrides {
            m: q,
            n: kv,
            k: None,
        };
        let rows_q = GemmOverrides {
            m: q,
            n: None,
            k: kv,
        };
        let rows_kv = GemmOverrides {
            m: kv,
            n: None,
            k: q,
        };
        let f: Vec<GemmOverrides> = matmuls(&composite_fwd(&s)).iter().map(|m| m.3).collect();
        assert_eq!(f, vec![qk, rows_q]);
        // backward: Q Kᵀ, Pᵀ dO, dO Vᵀ, dSᵀ Q, dS K
        let b: Vec<GemmOverrides> = matmuls(&composite_bwd(&s)).iter().map(|m| m.3).collect();
        assert_eq!(b, vec![qk, rows_kv, qk, rows_kv, rows_q]);
        // without per-sequence lengths: none
        let mut plain = s;
        plain.seqlens = None;
        assert!(
            matmuls(&composite_bwd(&plain))
                .iter()
                .all(|m| m.3 == GemmOverrides::default())
        );
    }

    #[test]
    fn bottom_right_bands_use_each_sequences_lengths() {
        let m = MaskSpec {
            left: Some(16),
            right: Some(0),
            diagonal: Diagonal::BottomRight,
        };
        for packing in PACKINGS {
            let s = varlen_spec(packing, m, 2, false);
            for g in [composite_fwd(&s), composite_bwd(&s)] {
                // no fixed-length scalars: the per-batch tensors shift the diagonal
                assert!(!g.tensors.contains_key(&uid::SEQ_Q));
                assert!(!g.tensors.contains_key(&uid::SEQ_KV));
                // left bound in int32 (col + W - s_kv[b] + s_q[b] > row), W = left + 1
                assert_eq!(g.tensors[&uid::LEFT_BOUND].binding, Binding::ConstI32(17));
                let uses = |u: i64| {
                    g.ops
                        .iter()
                        .filter(|op| matches!(op, Op::Pointwise { b: Some(x), axis: Some(3), .. } if *x == u))
                        .count()
                };
                // right band: +s_kv, -s_q; left band: -s_kv, +s_q
                assert_eq!(uses(uid::SEQ_LEN_KV), 2);
                assert_eq!(uses(uid::SEQ_LEN_Q), 2);
            }
        }
        // a top-left window keeps its fp32 bound
        let tl = MaskSpec {
            diagonal: Diagonal::TopLeft,
            ..m
        };
        let g = composite_fwd(&varlen_spec(SeqPacking::Packed, tl, 2, false));
        assert_eq!(g.tensors[&uid::LEFT_BOUND].binding, Binding::ConstF32(17.0));
    }

    #[test]
    fn varlen_scratch_regions_are_disjoint_and_sized() {
        for packing in PACKINGS {
            for det in [false, true] {
                let s = varlen_spec(packing, MaskSpec::CAUSAL, 2, det);
                for g in [composite_fwd(&s), composite_bwd(&s)] {
                    let vs = g.varlen.unwrap();
                    let mut regions = vec![
                        (vs.seq_q, 3 * 4),
                        (vs.seq_kv, 3 * 4),
                        (vs.start_q, 3 * 4),
                        (vs.start_kv, 3 * 4),
                        (vs.stats, 3 * 8 * 96 * 4),
                    ];
                    if let Some(r) = vs.ragged {
                        regions.extend(r.map(|o| (o, 4 * 8)));
                    }
                    for t in g.variant_pack() {
                        if let Binding::Scratch(off) = t.binding
                            && [uid::SOFTMAX_SUM, uid::DQ_ACCUM].contains(&t.uid)
                        {
                            let n: i64 = t.dims.iter().product();
                            regions.push((off, n as usize * 4));
                        }
                    }
                    regions.sort();
                    for w in regions.windows(2) {
                        assert!(w[0].0 + w[0].1 <= w[1].0, "{packing:?} {:?}: {w:?}", g.kind);
                    }
                    let (last, len) = regions.last().copied().unwrap();
                    assert!(last + len <= g.scratch_bytes);
                    assert!(regions.iter().all(|(o, _)| o % SCRATCH_ALIGN == 0));
                }
            }
        }
    }

    #[test]
    fn ragged_offsets_widen_only_past_int32() {
        let s = varlen_spec(SeqPacking::Packed, MaskSpec::NONE, 2, false);
        assert!(!ragged_offsets_need_i64(&s));
        let mut big =
            SdpaSpec::dense_bhsd(64, 64, 8, 32768, 32768, 128, IoDtype::Bf16, MaskSpec::NONE);
        big.seqlens = Some(SeqPacking::Packed);
        assert!(ragged_offsets_need_i64(&big));
        let g = composite_fwd(&big);
        assert_eq!(g.tensors[&uid::RAGGED_Q].dtype, DType::Int64);
        assert!(g.varlen.unwrap().ragged_wide);
    }
}
