//! The description of one attention call: shapes, dtype, memory layout, mask, scale.
//!
//! An [`AttentionProblem`] is what an executor is asked to run. It carries no data: the tensors
//! travel separately (host tensors in [`crate::executor`], device pointers in the device paths).
//!
//! # Conventions
//! - Logical tensor shapes: Q `[b, h_q, s_q, d_qk]`, K `[b, h_kv, s_kv, d_qk]`,
//!   V `[b, h_kv, s_kv, d_v]`, O and dO `[b, h_q, s_q, d_v]`, LSE `[b, h_q, s_q]` (contiguous,
//!   fp32, natural log). The physical layout of Q, K, V, O (and dQ, dK, dV, dO, which use the
//!   strides of Q, K, V, O respectively) is given by [`Strides`]; the head dimension is always
//!   contiguous (stride 1).
//! - GQA: query head `h` reads KV head `h / (h_q / h_kv)`; `h_q` must be a multiple of `h_kv`.
//! - Masks are expressed as a window around a diagonal, see [`MaskSpec`].
//! - A query row with no admissible key gets `O = 0` and `LSE = -inf` (so a ring merge by
//!   `logaddexp` ignores it), and contributes nothing to the gradients.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Element type of Q, K, V, O, dO, dQ, dK, dV. Accumulation is always fp32 or wider.
///
/// The GPU executors take the 16-bit types; the CPU reference also takes `F32` and `F64`
/// (through [`crate::reference::forward_strided`], so CPU tests and gradient checks can run in
/// float64). [`crate::HostTensor`] holds 16-bit patterns only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE single precision (CPU reference only).
    F32,
    /// IEEE double precision (CPU reference only).
    F64,
}

impl DType {
    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 => 4,
            DType::F64 => 8,
        }
    }
    /// Whether values of this type fit a [`crate::HostTensor`] (16-bit patterns).
    pub fn is_16bit(self) -> bool {
        self.size_bytes() == 2
    }
    /// Name as used in rule packs (`fp16`, `bf16`, `fp32`, `fp64`).
    pub fn rule_name(self) -> &'static str {
        match self {
            DType::F16 => "fp16",
            DType::BF16 => "bf16",
            DType::F32 => "fp32",
            DType::F64 => "fp64",
        }
    }
    /// Round an f64 to this dtype and back (what storing a value in this dtype does).
    pub fn round(self, x: f64) -> f64 {
        match self {
            DType::F16 => half::f16::from_f64(x).to_f64(),
            DType::BF16 => half::bf16::from_f64(x).to_f64(),
            DType::F32 => x as f32 as f64,
            DType::F64 => x,
        }
    }
    /// Encode an f64 as this dtype's 16-bit pattern (round to nearest even). `None` for the
    /// wide types, which have no 16-bit pattern.
    pub fn try_to_bits(self, x: f64) -> Option<u16> {
        match self {
            DType::F16 => Some(half::f16::from_f64(x).to_bits()),
            DType::BF16 => Some(half::bf16::from_f64(x).to_bits()),
            DType::F32 | DType::F64 => None,
        }
    }
    /// Encode an f64 as this dtype's 16-bit pattern (round to nearest even).
    ///
    /// Only for 16-bit dtypes: every host-tensor path checks [`DType::is_16bit`] first (a wide
    /// dtype is refused there with a typed error), so a wide dtype here is a programming error
    /// and encodes as `0`.
    pub fn to_bits(self, x: f64) -> u16 {
        debug_assert!(self.is_16bit(), "{self} has no 16-bit pattern");
        self.try_to_bits(x).unwrap_or(0)
    }
    /// Decode this dtype's 16-bit pattern (16-bit dtypes only, see [`DType::to_bits`]; a wide
    /// dtype decodes as NaN).
    pub fn from_bits(self, b: u16) -> f64 {
        match self {
            DType::F16 => half::f16::from_bits(b).to_f64(),
            DType::BF16 => half::bf16::from_bits(b).to_f64(),
            DType::F32 | DType::F64 => f64::NAN,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.rule_name())
    }
}

/// Named layouts; all of them are special cases of [`Strides`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayoutKind {
    /// `[b, s, h, d]` contiguous (the default of most training stacks).
    Bshd,
    /// `[s, b, h, d]` contiguous (Megatron / Transformer Engine `sbhd`).
    Sbhd,
    /// `[b, h, s, d]` contiguous (PyTorch SDPA's logical order).
    Bhsd,
}

impl LayoutKind {
    /// Rule-pack name (`bshd`, `sbhd`, `bhsd`).
    pub fn rule_name(self) -> &'static str {
        match self {
            LayoutKind::Bshd => "bshd",
            LayoutKind::Sbhd => "sbhd",
            LayoutKind::Bhsd => "bhsd",
        }
    }
}

/// Element strides of a 4-D tensor in logical order `(batch, head, seq)`; the head-dim stride is 1.
///
/// Strides are in elements, not bytes, and must be non-negative. Executors may require more
/// (for instance multiples of 8 elements for 16-byte aligned rows) and refuse with
/// [`crate::ExecError::Unsupported`] or [`crate::ExecError::InvalidInput`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Strides {
    /// Stride between batch entries.
    pub batch: usize,
    /// Stride between heads.
    pub head: usize,
    /// Stride between consecutive sequence positions (the "row" stride).
    pub seq: usize,
}

impl Strides {
    /// Contiguous strides of a named layout for a tensor of `[b, h, s, d]`.
    pub fn of(kind: LayoutKind, b: usize, h: usize, s: usize, d: usize) -> Strides {
        match kind {
            LayoutKind::Bshd => Strides {
                batch: s * h * d,
                head: d,
                seq: h * d,
            },
            LayoutKind::Sbhd => Strides {
                batch: h * d,
                head: d,
                seq: b * h * d,
            },
            LayoutKind::Bhsd => Strides {
                batch: h * s * d,
                head: s * d,
                seq: d,
            },
        }
    }

    /// Offset (in elements) of element `(b, h, s, d)`.
    pub fn offset(&self, b: usize, h: usize, s: usize, d: usize) -> usize {
        b * self.batch + h * self.head + s * self.seq + d
    }

    /// Number of elements a buffer must hold for a tensor `[b, h, s, d]` with these strides
    /// (largest offset + 1), or 0 for an empty tensor.
    pub fn span(&self, b: usize, h: usize, s: usize, d: usize) -> usize {
        if b == 0 || h == 0 || s == 0 || d == 0 {
            return 0;
        }
        self.offset(b - 1, h - 1, s - 1, d - 1) + 1
    }

    /// The named layout these strides are, if any, for a tensor `[b, h, s, d]`.
    /// The batch stride of a tensor of one batch entry (`b == 1`, a packed batch) is never
    /// used, so it is ignored there.
    pub fn kind(&self, b: usize, h: usize, s: usize, d: usize) -> Option<LayoutKind> {
        [LayoutKind::Bshd, LayoutKind::Sbhd, LayoutKind::Bhsd]
            .into_iter()
            .find(|k| {
                let mut named = Strides::of(*k, b, h, s, d);
                if b == 1 {
                    named.batch = self.batch;
                }
                named == *self
            })
    }
}

/// Physical layouts of the four tensors of a call. Gradients use the strides of their forward
/// counterpart (dQ like Q, dK like K, dV like V, dO like O).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorLayouts {
    /// Q (and dQ).
    pub q: Strides,
    /// K (and dK).
    pub k: Strides,
    /// V (and dV).
    pub v: Strides,
    /// O (and dO).
    pub o: Strides,
}

/// Which mask the call applies before the softmax.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaskKind {
    /// No causal constraint (a window may still apply).
    NoMask,
    /// Causal, diagonal anchored at the top-left corner: query `i` sees keys `j <= i`.
    CausalTopLeft,
    /// Causal, diagonal anchored at the bottom-right corner: query `i` sees keys
    /// `j <= i + s_kv - s_q` (FlashAttention >= 2.1 and cuDNN convention).
    CausalBottomRight,
}

impl MaskKind {
    /// Rule-pack name (`no_mask`, `causal`, `causal_bottom_right`).
    pub fn rule_name(self) -> &'static str {
        match self {
            MaskKind::NoMask => "no_mask",
            MaskKind::CausalTopLeft => "causal",
            MaskKind::CausalBottomRight => "causal_bottom_right",
        }
    }
}

/// Where the window's diagonal sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiagonalAlignment {
    /// Diagonal through `(0, 0)`: offset 0.
    TopLeft,
    /// Diagonal through `(s_q - 1, s_kv - 1)`: offset `s_kv - s_q`.
    BottomRight,
}

/// Mask = causal kind + sliding window + diagonal alignment.
///
/// Query row `i` may attend key `j` iff, with `off = 0` (top-left) or `off = s_kv - s_q`
/// (bottom-right) and `c = i + off`:
/// `(left < 0 || j >= c - left) && (right < 0 || j <= c + right)`, and `0 <= j < s_kv`.
/// Causal masks force `right = 0` when `right` is unbounded or larger; their alignment is the
/// one their name says, and [`MaskSpec::validate`] rejects a contradicting `alignment`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MaskSpec {
    /// Causal kind.
    pub kind: MaskKind,
    /// Keys to the left of the diagonal a query may see; `-1` = unbounded.
    pub window_left: i64,
    /// Keys to the right of the diagonal a query may see; `-1` = unbounded.
    pub window_right: i64,
    /// Diagonal alignment (must match the causal kind for causal masks).
    pub alignment: DiagonalAlignment,
}

impl MaskSpec {
    /// No mask at all.
    pub const NONE: MaskSpec = MaskSpec {
        kind: MaskKind::NoMask,
        window_left: -1,
        window_right: -1,
        alignment: DiagonalAlignment::TopLeft,
    };
    /// Causal, top-left diagonal.
    pub const CAUSAL_TOP_LEFT: MaskSpec = MaskSpec {
        kind: MaskKind::CausalTopLeft,
        window_left: -1,
        window_right: 0,
        alignment: DiagonalAlignment::TopLeft,
    };
    /// Causal, bottom-right diagonal.
    pub const CAUSAL_BOTTOM_RIGHT: MaskSpec = MaskSpec {
        kind: MaskKind::CausalBottomRight,
        window_left: -1,
        window_right: 0,
        alignment: DiagonalAlignment::BottomRight,
    };

    /// Sliding window `(left, right)` (`-1` = unbounded) around the given diagonal, no causal kind.
    pub fn window(left: i64, right: i64, alignment: DiagonalAlignment) -> MaskSpec {
        MaskSpec {
            kind: MaskKind::NoMask,
            window_left: left,
            window_right: right,
            alignment,
        }
    }

    /// Does this mask restrict anything through its window (beyond the causal diagonal)?
    pub fn has_window(&self) -> bool {
        self.window_left >= 0 || (self.kind == MaskKind::NoMask && self.window_right >= 0)
    }

    /// Check internal consistency.
    pub fn validate(&self) -> Result<(), String> {
        if self.window_left < -1 || self.window_right < -1 {
            return Err(format!(
                "window ({}, {}): sizes must be >= 0 or -1 (unbounded)",
                self.window_left, self.window_right
            ));
        }
        match (self.kind, self.alignment) {
            (MaskKind::CausalTopLeft, DiagonalAlignment::BottomRight) => {
                Err("causal top-left mask with a bottom-right diagonal alignment".into())
            }
            (MaskKind::CausalBottomRight, DiagonalAlignment::TopLeft) => {
                Err("causal bottom-right mask with a top-left diagonal alignment".into())
            }
            _ => Ok(()),
        }
    }

    /// The effective window after applying the causal kind: `(offset, left, right)` with
    /// `None` for unbounded. `offset` is added to the query index to find the diagonal.
    pub fn effective(&self, seqlen_q: usize, seqlen_kv: usize) -> EffectiveMask {
        let offset = match self.alignment {
            DiagonalAlignment::TopLeft => 0,
            DiagonalAlignment::BottomRight => seqlen_kv as i64 - seqlen_q as i64,
        };
        let left = (self.window_left >= 0).then_some(self.window_left);
        let mut right = (self.window_right >= 0).then_some(self.window_right);
        if self.kind != MaskKind::NoMask {
            right = Some(right.map_or(0, |r| r.min(0)));
        }
        EffectiveMask {
            offset,
            left,
            right,
            seqlen_kv: seqlen_kv as i64,
        }
    }
}

/// A mask reduced to a diagonal offset and a window; see [`MaskSpec::effective`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EffectiveMask {
    /// Added to the query index to find its diagonal key.
    pub offset: i64,
    /// Keys left of the diagonal (None = unbounded).
    pub left: Option<i64>,
    /// Keys right of the diagonal (None = unbounded).
    pub right: Option<i64>,
    /// Number of keys.
    pub seqlen_kv: i64,
}

impl EffectiveMask {
    /// Half-open key range `[lo, hi)` query row `i` may attend (empty when `lo >= hi`).
    pub fn row_range(&self, i: usize) -> (i64, i64) {
        let c = i as i64 + self.offset;
        let lo = self.left.map_or(0, |l| (c - l).max(0));
        let hi = self
            .right
            .map_or(self.seqlen_kv, |r| (c + r + 1).min(self.seqlen_kv));
        (lo.min(self.seqlen_kv), hi.max(0))
    }

    /// May query `i` attend key `j`?
    pub fn allows(&self, i: usize, j: usize) -> bool {
        let (lo, hi) = self.row_range(i);
        (j as i64) >= lo && (j as i64) < hi
    }

    /// Union of the key ranges of query rows `[i0, i1)` (empty when `lo >= hi`). The ranges are
    /// monotone in `i`, so the union is `[lo(i0), hi(i1 - 1))` clipped to non-empty rows.
    pub fn rows_range(&self, i0: usize, i1: usize) -> (i64, i64) {
        if i0 >= i1 {
            return (0, 0);
        }
        let (lo, _) = self.row_range(i0);
        let (_, hi) = self.row_range(i1 - 1);
        (lo, hi)
    }
}

/// How the softmax normalises a row: TransformerEngine's `softmax_type`.
///
/// With a sink logit `s_h` per query head, `P_ij = exp(S_ij) / (exp(s_h) + sum_k exp(S_ik))`:
/// the sink takes part of each row's probability mass and contributes nothing to `O`. The LSE
/// an executor returns includes the sink term (so `P = exp(S - LSE)` holds in the backward),
/// and a fully masked row still gets `O = 0`, `LSE = -inf` (its sink alone would give `LSE =
/// s_h`; a row that sees no key is defined empty, whatever its sink).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SoftmaxKind {
    /// The plain softmax (no sink).
    #[default]
    Vanilla,
    /// A fixed sink logit of 0 for every head (`exp(S) / (1 + sum exp(S))`, TE `off-by-one`).
    OffByOne,
    /// A learnable sink logit per query head, an fp32 `[h_q]` input whose gradient the
    /// backward returns (TE `learnable`, gpt-oss's `sinks`).
    Learnable,
}

impl SoftmaxKind {
    /// TransformerEngine's name (`vanilla`, `off-by-one`, `learnable`).
    pub fn te_name(self) -> &'static str {
        match self {
            SoftmaxKind::Vanilla => "vanilla",
            SoftmaxKind::OffByOne => "off-by-one",
            SoftmaxKind::Learnable => "learnable",
        }
    }
}

/// Where a batch's sequences sit in the tensors when they have different lengths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SeqPacking {
    /// Padded `[b, s, ...]` tensors, each sequence's tokens first and padding after them
    /// (fine-tuning batches).
    PaddedRight,
    /// Padded tensors, padding first and each sequence's tokens last (batched generation).
    PaddedLeft,
    /// Packed THD: the sequences one after another along one token dimension (no padding,
    /// batch stride 0): sequence `b` starts at token `sum(lens[..b])` (`cu_seqlens[b]`).
    Packed,
}

impl SeqPacking {
    /// Words for messages (`padded right`, `padded left`, `packed THD`).
    pub fn describe(self) -> &'static str {
        match self {
            SeqPacking::PaddedRight => "padded right",
            SeqPacking::PaddedLeft => "padded left",
            SeqPacking::Packed => "packed THD",
        }
    }
}

/// Per-sequence lengths of a batch (padding masks, or packed THD with `cu_seqlens`).
///
/// Each sequence is attended on its own: the mask (causal kind, window, diagonal) applies in
/// the sequence's own coordinates, with its own `s_q` and `s_kv` (a bottom-right diagonal
/// sits at `kv[b] - q[b]`). Padding rows (query positions outside every sequence) get `O = 0`,
/// `LSE = -inf` and `dQ = 0`; padding keys get `dK = dV = 0`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SeqLens {
    /// Where the sequences sit.
    pub packing: SeqPacking,
    /// Query tokens of each sequence (length `batch`, each at most `seqlen_q`).
    pub q: Vec<usize>,
    /// Key/value tokens of each sequence (length `batch`, each at most `seqlen_kv`).
    pub kv: Vec<usize>,
}

impl SeqLens {
    /// Padded batches: `q[b]` query and `kv[b]` key tokens of sequence `b`.
    pub fn padded(side: SeqPacking, q: Vec<usize>, kv: Vec<usize>) -> SeqLens {
        SeqLens {
            packing: side,
            q,
            kv,
        }
    }

    /// Packed THD from cumulative offsets (`cu_seqlens`, `batch + 1` entries from 0).
    pub fn from_cu_seqlens(cu_q: &[usize], cu_kv: &[usize]) -> Result<SeqLens, String> {
        let lens = |name: &str, cu: &[usize]| -> Result<Vec<usize>, String> {
            if cu.first() != Some(&0) {
                return Err(format!("{name} must start at 0"));
            }
            cu.windows(2)
                .map(|w| {
                    w[1].checked_sub(w[0])
                        .ok_or_else(|| format!("{name} must not decrease ({} then {})", w[0], w[1]))
                })
                .collect()
        };
        Ok(SeqLens {
            packing: SeqPacking::Packed,
            q: lens("cu_seqlens_q", cu_q)?,
            kv: lens("cu_seqlens_kv", cu_kv)?,
        })
    }

    /// Token counts of the packed dimension (sums of the lengths).
    pub fn tokens(&self) -> (usize, usize) {
        (self.q.iter().sum(), self.kv.iter().sum())
    }
}

/// Rows of one sequence in its tensors: the first physical sequence position and the count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqRows {
    /// Batch index in the tensors (0 for every sequence of a packed batch).
    pub batch: usize,
    /// First row (sequence position, or token for packed tensors).
    pub start: usize,
    /// Rows of this sequence.
    pub len: usize,
}

/// One attention call, without its data.
///
/// Build one with [`AttentionProblem::new`] (contiguous `bshd`, no mask, scale
/// `1/sqrt(head_dim_qk)`) and adjust the public fields; call [`AttentionProblem::validate`]
/// before trusting it (every executor does).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionProblem {
    /// Batch size `b`.
    pub batch: usize,
    /// Query heads `h_q`.
    pub heads_q: usize,
    /// Key/value heads `h_kv` (`h_q % h_kv == 0`; 1 = MQA, `h_q` = MHA).
    pub heads_kv: usize,
    /// Query sequence length `s_q`.
    pub seqlen_q: usize,
    /// Key/value sequence length `s_kv`.
    pub seqlen_kv: usize,
    /// Head dim of Q and K.
    pub head_dim_qk: usize,
    /// Head dim of V and O.
    pub head_dim_v: usize,
    /// Element type of all tensors except LSE (fp32).
    pub dtype: DType,
    /// Physical layouts.
    pub layout: TensorLayouts,
    /// Mask.
    pub mask: MaskSpec,
    /// Multiplier applied to `Q K^T` before the softmax.
    pub softmax_scale: f64,
    /// Ask for bitwise-reproducible results (executors that cannot promise it refuse).
    pub deterministic: bool,
    /// Logit soft-capping: scores become `softcap * tanh(scale * q.k / softcap)` before the
    /// mask and softmax (Gemma 2's `attn_logit_softcapping`). `None`: no capping.
    #[serde(default)]
    pub softcap: Option<f64>,
    /// The softmax's sink (TE `softmax_type`).
    #[serde(default)]
    pub softmax: SoftmaxKind,
    /// Per-sequence lengths (`None`: every sequence has `seqlen_q` queries and `seqlen_kv`
    /// keys). With [`SeqPacking::Packed`] the tensors' sequence dimension holds the tokens of
    /// every sequence ([`SeqLens::tokens`]) and their batch stride is 0.
    #[serde(default)]
    pub seqlens: Option<SeqLens>,
}

impl AttentionProblem {
    /// A problem with contiguous `bshd` tensors, no mask, scale `1/sqrt(head_dim_qk)`,
    /// deterministic.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        batch: usize,
        heads_q: usize,
        heads_kv: usize,
        seqlen_q: usize,
        seqlen_kv: usize,
        head_dim_qk: usize,
        head_dim_v: usize,
        dtype: DType,
    ) -> AttentionProblem {
        let mut p = AttentionProblem {
            batch,
            heads_q,
            heads_kv,
            seqlen_q,
            seqlen_kv,
            head_dim_qk,
            head_dim_v,
            dtype,
            layout: TensorLayouts {
                q: Strides {
                    batch: 0,
                    head: 0,
                    seq: 0,
                },
                k: Strides {
                    batch: 0,
                    head: 0,
                    seq: 0,
                },
                v: Strides {
                    batch: 0,
                    head: 0,
                    seq: 0,
                },
                o: Strides {
                    batch: 0,
                    head: 0,
                    seq: 0,
                },
            },
            mask: MaskSpec::NONE,
            softmax_scale: 1.0 / (head_dim_qk.max(1) as f64).sqrt(),
            deterministic: true,
            softcap: None,
            softmax: SoftmaxKind::Vanilla,
            seqlens: None,
        };
        p.set_layout(LayoutKind::Bshd);
        p
    }

    /// Set all four tensors to a contiguous named layout.
    pub fn set_layout(&mut self, kind: LayoutKind) {
        // A packed batch is one sequence of all tokens to the strides (batch stride 0).
        let (hq, hkv) = (self.heads_q, self.heads_kv);
        let (b, sq, skv) = (self.batch_dim(), self.rows_q(), self.rows_kv());
        let packed = self.is_packed();
        let of = |h, s, d| {
            let mut st = Strides::of(kind, b, h, s, d);
            if packed {
                st.batch = 0;
            }
            st
        };
        self.layout = TensorLayouts {
            q: of(hq, sq, self.head_dim_qk),
            k: of(hkv, skv, self.head_dim_qk),
            v: of(hkv, skv, self.head_dim_v),
            o: of(hq, sq, self.head_dim_v),
        };
    }

    /// Builder-style: set the mask.
    pub fn with_mask(mut self, mask: MaskSpec) -> Self {
        self.mask = mask;
        self
    }

    /// Builder-style: set a named layout.
    pub fn with_layout(mut self, kind: LayoutKind) -> Self {
        self.set_layout(kind);
        self
    }

    /// Query heads per KV head.
    pub fn group_size(&self) -> usize {
        self.heads_q / self.heads_kv.max(1)
    }

    /// Whether the batch is packed THD ([`SeqPacking::Packed`]).
    pub fn is_packed(&self) -> bool {
        matches!(&self.seqlens, Some(s) if s.packing == SeqPacking::Packed)
    }
    /// The batch dimension of the tensors: 1 for a packed batch, else `batch`.
    pub fn batch_dim(&self) -> usize {
        if self.is_packed() { 1 } else { self.batch }
    }
    /// Builder-style: set per-sequence lengths, and for a packed batch the packed layout of
    /// `kind` (its strides with batch stride 0).
    pub fn with_seqlens(mut self, seqlens: SeqLens, kind: LayoutKind) -> Self {
        self.seqlens = Some(seqlens);
        self.set_layout(kind);
        self
    }
    /// The longest query and key sequences: with per-sequence lengths the longest of each side,
    /// else `seqlen_q` and `seqlen_kv`.
    pub fn longest_seqs(&self) -> (usize, usize) {
        match &self.seqlens {
            Some(s) => (
                s.q.iter().copied().max().unwrap_or(0),
                s.kv.iter().copied().max().unwrap_or(0),
            ),
            None => (self.seqlen_q, self.seqlen_kv),
        }
    }
    /// Rows of the query tensors' sequence dimension: the packed token count, else `seqlen_q`.
    pub fn rows_q(&self) -> usize {
        match &self.seqlens {
            Some(s) if s.packing == SeqPacking::Packed => s.tokens().0,
            _ => self.seqlen_q,
        }
    }
    /// Rows of the key/value tensors' sequence dimension (see [`AttentionProblem::rows_q`]).
    pub fn rows_kv(&self) -> usize {
        match &self.seqlens {
            Some(s) if s.packing == SeqPacking::Packed => s.tokens().1,
            _ => self.seqlen_kv,
        }
    }

    /// Where sequence `b`'s queries and keys sit: `(q rows, kv rows)`.
    pub fn seq_rows(&self, b: usize) -> (SeqRows, SeqRows) {
        let Some(s) = &self.seqlens else {
            return (
                SeqRows {
                    batch: b,
                    start: 0,
                    len: self.seqlen_q,
                },
                SeqRows {
                    batch: b,
                    start: 0,
                    len: self.seqlen_kv,
                },
            );
        };
        let (lq, lkv) = (s.q[b], s.kv[b]);
        let (batch, sq, skv) = match s.packing {
            SeqPacking::PaddedRight => (b, 0, 0),
            SeqPacking::PaddedLeft => (b, self.seqlen_q - lq, self.seqlen_kv - lkv),
            SeqPacking::Packed => (0, s.q[..b].iter().sum(), s.kv[..b].iter().sum()),
        };
        (
            SeqRows {
                batch,
                start: sq,
                len: lq,
            },
            SeqRows {
                batch,
                start: skv,
                len: lkv,
            },
        )
    }

    /// The mask of sequence `b`, in its own coordinates (its query and key counts).
    pub fn seq_mask(&self, b: usize) -> EffectiveMask {
        let (q, kv) = self.seq_rows(b);
        self.mask.effective(q.len, kv.len)
    }

    /// Index into LSE (`[batch_dim, h_q, rows_q]`, contiguous) of query row `row` (a
    /// physical row of the tensors) of head `h` in tensor batch `batch`.
    pub fn lse_index(&self, batch: usize, h: usize, row: usize) -> usize {
        (batch * self.heads_q + h) * self.rows_q() + row
    }

    /// Elements a Q (dQ) buffer must hold.
    pub fn q_span(&self) -> usize {
        self.layout.q.span(
            self.batch_dim(),
            self.heads_q,
            self.rows_q(),
            self.head_dim_qk,
        )
    }
    /// Elements a K (dK) buffer must hold.
    pub fn k_span(&self) -> usize {
        self.layout.k.span(
            self.batch_dim(),
            self.heads_kv,
            self.rows_kv(),
            self.head_dim_qk,
        )
    }
    /// Elements a V (dV) buffer must hold.
    pub fn v_span(&self) -> usize {
        self.layout.v.span(
            self.batch_dim(),
            self.heads_kv,
            self.rows_kv(),
            self.head_dim_v,
        )
    }
    /// Elements an O (dO) buffer must hold.
    pub fn o_span(&self) -> usize {
        self.layout.o.span(
            self.batch_dim(),
            self.heads_q,
            self.rows_q(),
            self.head_dim_v,
        )
    }
    /// Elements of LSE (`[batch_dim, h_q, rows_q]`, contiguous fp32; `[b, h_q, s_q]` unless
    /// packed).
    pub fn lse_len(&self) -> usize {
        self.batch_dim() * self.heads_q * self.rows_q()
    }
    /// Elements of the sink logits (and their gradient): `h_q` for a learnable sink, else 0.
    pub fn sink_len(&self) -> usize {
        if self.softmax == SoftmaxKind::Learnable {
            self.heads_q
        } else {
            0
        }
    }

    /// Effective mask for this problem's sequence lengths (of every sequence when `seqlens`
    /// is `None`; see [`AttentionProblem::seq_mask`] otherwise).
    pub fn effective_mask(&self) -> EffectiveMask {
        self.mask.effective(self.seqlen_q, self.seqlen_kv)
    }

    /// Number of (query, key) pairs the mask admits, summed over the sequences of one head.
    pub fn admitted_pairs(&self) -> u64 {
        (0..self.batch)
            .map(|b| {
                let m = self.seq_mask(b);
                (0..self.seq_rows(b).0.len)
                    .map(|i| {
                        let (lo, hi) = m.row_range(i);
                        (hi - lo).max(0) as u64
                    })
                    .sum::<u64>()
            })
            .sum()
    }

    /// FLOPs of the forward pass counting only admitted pairs (2 GEMMs).
    pub fn forward_flops(&self) -> f64 {
        2.0 * self.heads_q as f64
            * self.admitted_pairs() as f64
            * (self.head_dim_qk + self.head_dim_v) as f64
    }

    /// FLOPs of the backward pass counting admitted pairs (5 GEMMs: S recompute, dP, dV, dQ, dK).
    pub fn backward_flops(&self) -> f64 {
        2.0 * self.heads_q as f64
            * self.admitted_pairs() as f64
            * (3 * self.head_dim_qk + 2 * self.head_dim_v) as f64
    }

    /// Structural validity independent of any executor: positive sizes, GQA divisibility,
    /// consistent mask, finite positive scale, head dim contiguous and strides that do not make
    /// rows overlap. Returns a human-readable reason on failure.
    pub fn validate(&self) -> Result<(), String> {
        let dims = [
            ("batch", self.batch),
            ("heads_q", self.heads_q),
            ("heads_kv", self.heads_kv),
            ("seqlen_q", self.seqlen_q),
            ("seqlen_kv", self.seqlen_kv),
            ("head_dim_qk", self.head_dim_qk),
            ("head_dim_v", self.head_dim_v),
        ];
        for (name, v) in dims {
            if v == 0 {
                return Err(format!("{name} must be positive"));
            }
        }
        if !self.heads_q.is_multiple_of(self.heads_kv) {
            return Err(format!(
                "heads_q ({}) is not a multiple of heads_kv ({})",
                self.heads_q, self.heads_kv
            ));
        }
        self.mask.validate()?;
        if !(self.softmax_scale.is_finite() && self.softmax_scale > 0.0) {
            return Err(format!(
                "softmax_scale {} must be finite and positive",
                self.softmax_scale
            ));
        }
        if let Some(c) = self.softcap
            && !(c.is_finite() && c > 0.0)
        {
            return Err(format!("softcap {c} must be finite and positive"));
        }
        if let Some(s) = &self.seqlens {
            for (side, lens, max) in [("q", &s.q, self.seqlen_q), ("kv", &s.kv, self.seqlen_kv)] {
                if lens.len() != self.batch {
                    return Err(format!(
                        "seqlens.{side} has {} entries for a batch of {}",
                        lens.len(),
                        self.batch
                    ));
                }
                if let Some(l) = lens.iter().find(|l| **l > max) {
                    return Err(format!(
                        "seqlens.{side} has a sequence of {l} tokens, longer than the maximum {max}"
                    ));
                }
            }
        }
        let t = [
            (
                "q",
                self.layout.q,
                self.heads_q,
                self.rows_q(),
                self.head_dim_qk,
            ),
            (
                "k",
                self.layout.k,
                self.heads_kv,
                self.rows_kv(),
                self.head_dim_qk,
            ),
            (
                "v",
                self.layout.v,
                self.heads_kv,
                self.rows_kv(),
                self.head_dim_v,
            ),
            (
                "o",
                self.layout.o,
                self.heads_q,
                self.rows_q(),
                self.head_dim_v,
            ),
        ];
        for (name, s, h, sl, d) in t {
            // Rows must not overlap: every (b, h, s) row of d elements is distinct. Sorting the
            // three strides and checking each covers the extent of the smaller ones is sufficient.
            let mut dims = [(s.batch, self.batch_dim()), (s.head, h), (s.seq, sl)];
            dims.sort();
            let mut extent = d;
            for (stride, n) in dims {
                if n > 1 && stride < extent {
                    return Err(format!(
                        "{name} strides (batch {}, head {}, seq {}) overlap for head dim {d}",
                        s.batch, s.head, s.seq
                    ));
                }
                extent = extent.max(stride * (n - 1) + extent);
            }
        }
        Ok(())
    }
}

/// One line for reports: sizes, dtype, mask, and every feature the problem uses
/// (`b2 hq8 hkv2 s_q 64 s_kv 64 d_qk 64 d_v 64 bf16 causal window (127, 0), padded right
/// (q 64,48; kv 64,48), sink learnable, deterministic`).
impl fmt::Display for AttentionProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "b{} hq{} hkv{} s_q {} s_kv {} d_qk {} d_v {} {} {}",
            self.batch,
            self.heads_q,
            self.heads_kv,
            self.seqlen_q,
            self.seqlen_kv,
            self.head_dim_qk,
            self.head_dim_v,
            self.dtype,
            self.mask.kind.rule_name()
        )?;
        if self.mask.has_window() {
            write!(
                f,
                " window ({}, {})",
                self.mask.window_left, self.mask.window_right
            )?;
        }
        if self.mask.kind == MaskKind::NoMask
            && self.mask.alignment == DiagonalAlignment::BottomRight
        {
            f.write_str(" bottom-right")?;
        }
        if let Some(s) = &self.seqlens {
            let list = |v: &[usize]| {
                v.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            };
            write!(
                f,
                ", {} (q {}; kv {})",
                s.packing.describe(),
                list(&s.q),
                list(&s.kv)
            )?;
        }
        if let Some(c) = self.softcap {
            write!(f, ", softcap {c}")?;
        }
        if self.softmax != SoftmaxKind::Vanilla {
            write!(f, ", sink {}", self.softmax.te_name())?;
        }
        if self.deterministic {
            f.write_str(", deterministic")?;
        }
        Ok(())
    }
}
