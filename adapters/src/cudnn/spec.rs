//! What a cuDNN SDPA graph depends on: shapes, strides, dtype, mask, determinism.
//!
//! Everything here is plain data (no cuDNN calls), so the graph builder, the plan-cache key and
//! the support checks are unit-tested on machines without a GPU.

use std::fmt;

pub use crate::problem::SeqPacking;

/// Input/output element type of an attention call (the intermediates are always FLOAT).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IoDtype {
    /// bfloat16.
    Bf16,
    /// IEEE half.
    F16,
}

impl fmt::Display for IoDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IoDtype::Bf16 => "bf16",
            IoDtype::F16 => "fp16",
        })
    }
}

/// Where the diagonal of a rectangular (s_q != s_kv) score matrix sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Diagonal {
    /// Query i sees key j <= i (+ right bound).
    TopLeft,
    /// Query i sees key j <= i + s_kv - s_q (+ right bound).
    BottomRight,
}

/// The attention mask as a band around the diagonal, in FlashAttention/TransformerEngine terms.
///
/// With `r = row + (s_kv - s_q if bottom-right else 0)`, key `col` is kept iff
/// `r - left <= col` (when `left` is set) and `col <= r + right` (when `right` is set).
/// `left = None, right = None` is no mask; `right = Some(0)` is causal; `left = Some(w)` adds a
/// sliding window of `w` keys before the diagonal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MaskSpec {
    /// Keys visible before the diagonal (None: unbounded).
    pub left: Option<i64>,
    /// Keys visible after the diagonal (None: unbounded; Some(0): causal).
    pub right: Option<i64>,
    /// Diagonal alignment.
    pub diagonal: Diagonal,
}

impl MaskSpec {
    /// No mask.
    pub const NONE: MaskSpec = MaskSpec {
        left: None,
        right: None,
        diagonal: Diagonal::TopLeft,
    };
    /// Causal, top-left aligned.
    pub const CAUSAL: MaskSpec = MaskSpec {
        left: None,
        right: Some(0),
        diagonal: Diagonal::TopLeft,
    };
    /// Causal, bottom-right aligned.
    pub const CAUSAL_BOTTOM_RIGHT: MaskSpec = MaskSpec {
        left: None,
        right: Some(0),
        diagonal: Diagonal::BottomRight,
    };

    /// True when no element is masked.
    pub fn is_none(&self) -> bool {
        self.left.is_none() && self.right.is_none()
    }

    /// The diagonal offset added to the row index (s_kv - s_q for bottom-right).
    pub fn offset(&self, s_q: i64, s_kv: i64) -> i64 {
        match self.diagonal {
            Diagonal::TopLeft => 0,
            Diagonal::BottomRight => s_kv - s_q,
        }
    }

    /// Whether key `col` is visible to query `row` (the reference semantics).
    pub fn keeps(&self, row: i64, col: i64, s_q: i64, s_kv: i64) -> bool {
        let r = row + self.offset(s_q, s_kv);
        self.left.is_none_or(|l| col >= r - l) && self.right.is_none_or(|rb| col <= r + rb)
    }

    /// The same mask in canonical form: with s_q == s_kv both alignments coincide, and without
    /// bounds the alignment is irrelevant. Used for the plan-cache key and the graph.
    pub fn canonical(&self, s_q: i64, s_kv: i64) -> MaskSpec {
        if self.is_none() || s_q == s_kv {
            MaskSpec {
                diagonal: Diagonal::TopLeft,
                ..*self
            }
        } else {
            *self
        }
    }
}

impl fmt::Display for MaskSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let diag = match self.diagonal {
            Diagonal::TopLeft => "top_left",
            Diagonal::BottomRight => "bottom_right",
        };
        match (self.left, self.right) {
            (None, None) => f.write_str("no_mask"),
            (None, Some(0)) => write!(f, "causal({diag})"),
            (l, r) => {
                let s = |x: Option<i64>| x.map_or("-1".to_string(), |v| v.to_string());
                write!(f, "window({},{};{diag})", s(l), s(r))
            }
        }
    }
}

/// Element strides of a 4-d tensor in cuDNN's logical order (b, h, s, d).
pub type Strides = [i64; 4];

/// Dense (b, h, s, d) strides.
pub fn bhsd_strides(h: i64, s: i64, d: i64) -> Strides {
    [h * s * d, s * d, d, 1]
}

/// Strides of a bshd-stored tensor ([b, s, h, d] in memory) seen as (b, h, s, d).
pub fn bshd_strides(h: i64, s: i64, d: i64) -> Strides {
    [s * h * d, d, h * d, 1]
}

/// Strides of an sbhd-stored tensor ([s, b, h, d] in memory) seen as (b, h, s, d).
pub fn sbhd_strides(b: i64, h: i64, d: i64) -> Strides {
    [h * d, d, b * h * d, 1]
}

/// The strides of every tensor a graph binds, in (b, h, s, d) order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Layouts {
    /// Q.
    pub q: Strides,
    /// K.
    pub k: Strides,
    /// V.
    pub v: Strides,
    /// O (the forward output; a backward input).
    pub o: Strides,
    /// dO, dQ, dK, dV (backward only).
    pub grads: Option<GradLayouts>,
}

/// Backward tensor strides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GradLayouts {
    /// dO.
    pub d_o: Strides,
    /// dQ.
    pub dq: Strides,
    /// dK.
    pub dk: Strides,
    /// dV.
    pub dv: Strides,
}

/// Direction of a graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// O and LSE from Q, K, V.
    Forward,
    /// dQ, dK, dV from Q, K, V, O, dO, LSE.
    Backward,
}

/// Everything an SDPA graph (and so its plan) depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SdpaSpec {
    /// Batch.
    pub b: i64,
    /// Query heads.
    pub h_q: i64,
    /// Key/value heads (divides h_q).
    pub h_kv: i64,
    /// Query length.
    pub s_q: i64,
    /// Key/value length.
    pub s_kv: i64,
    /// Head dim of Q and K.
    pub d_qk: i64,
    /// Head dim of V and O.
    pub d_v: i64,
    /// I/O dtype.
    pub dtype: IoDtype,
    /// Mask band.
    pub mask: MaskSpec,
    /// Strides of the bound tensors.
    pub layouts: Layouts,
    /// Backward only: ask for a deterministic algorithm.
    pub deterministic: bool,
    /// Per-sequence lengths (`None`: every sequence is `s_q` x `s_kv`): the graph then carries
    /// cuDNN's padding mask (per-batch `seq_len_q`/`seq_len_kv` tensors and GEMM overrides)
    /// and ragged offsets on every token tensor (every packing: see [`SdpaSpec::is_ragged`]). `s_q`/`s_kv` are then the longest sequence allowed; the lengths are data
    /// (uploaded per call), not part of the graph.
    pub seqlens: Option<SeqPacking>,
}

/// Why a spec cannot become a cuDNN graph at all (before asking cuDNN).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// A dimension is zero or negative.
    #[error("dimension {name} = {value} must be positive")]
    NonPositive {
        /// Which dimension.
        name: &'static str,
        /// Its value.
        value: i64,
    },
    /// GQA needs h_q to be a multiple of h_kv.
    #[error("h_q = {h_q} is not a multiple of h_kv = {h_kv}")]
    Heads {
        /// Query heads.
        h_q: i64,
        /// KV heads.
        h_kv: i64,
    },
    /// cuDNN needs the innermost (head-dim) stride to be 1.
    #[error("tensor {tensor}: the head-dim stride is {stride}, cuDNN needs 1")]
    InnerStride {
        /// Which tensor.
        tensor: &'static str,
        /// Its innermost stride.
        stride: i64,
    },
    /// fp16/bf16 SDPA needs head dims that are multiples of 8.
    #[error("head dim {d} is not a multiple of 8")]
    HeadDimAlign {
        /// The head dim.
        d: i64,
    },
    /// A window bound is negative.
    #[error("window bound {value} is negative (use None for unbounded)")]
    NegativeBound {
        /// The bound.
        value: i64,
    },
    /// Backward needs the gradient layouts.
    #[error("a backward spec needs gradient layouts")]
    MissingGradLayouts,
}

impl SdpaSpec {
    /// A spec with dense bhsd layouts for every tensor.
    #[allow(clippy::too_many_arguments)]
    pub fn dense_bhsd(
        b: i64,
        h_q: i64,
        h_kv: i64,
        s_q: i64,
        s_kv: i64,
        d: i64,
        dtype: IoDtype,
        mask: MaskSpec,
    ) -> SdpaSpec {
        let q = bhsd_strides(h_q, s_q, d);
        let k = bhsd_strides(h_kv, s_kv, d);
        SdpaSpec {
            b,
            h_q,
            h_kv,
            s_q,
            s_kv,
            d_qk: d,
            d_v: d,
            dtype,
            mask,
            layouts: Layouts {
                q,
                k,
                v: k,
                o: q,
                grads: Some(GradLayouts {
                    d_o: q,
                    dq: q,
                    dk: k,
                    dv: k,
                }),
            },
            deterministic: false,
            seqlens: None,
        }
    }

    /// Whether the token tensors carry ragged offsets: with any per-sequence lengths. Right
    /// padding needs them too: with the padding mask alone, cuDNN still loads the padding rows
    /// and a non-finite value there (uninitialised memory) turns into NaN in real rows
    /// (`0 * NaN` in P V); with ragged offsets it reads each sequence's rows only (measured on
    /// the H100, cudnn_gpu.rs `varlen_ignores_what_padding_rows_hold`).
    pub fn is_ragged(&self) -> bool {
        self.seqlens.is_some()
    }

    /// Checks the structural requirements every cuDNN SDPA graph has.
    pub fn validate(&self, dir: Direction) -> Result<(), SpecError> {
        for (name, value) in [
            ("b", self.b),
            ("h_q", self.h_q),
            ("h_kv", self.h_kv),
            ("s_q", self.s_q),
            ("s_kv", self.s_kv),
            ("d_qk", self.d_qk),
            ("d_v", self.d_v),
        ] {
            if value <= 0 {
                return Err(SpecError::NonPositive { name, value });
            }
        }
        if self.h_q % self.h_kv != 0 {
            return Err(SpecError::Heads {
                h_q: self.h_q,
                h_kv: self.h_kv,
            });
        }
        for d in [self.d_qk, self.d_v] {
            if d % 8 != 0 {
                return Err(SpecError::HeadDimAlign { d });
            }
        }
        for value in [self.mask.left, self.mask.right].into_iter().flatten() {
            if value < 0 {
                return Err(SpecError::NegativeBound { value });
            }
        }
        let l = &self.layouts;
        let mut all = vec![("q", l.q), ("k", l.k), ("v", l.v), ("o", l.o)];
        if dir == Direction::Backward {
            let g = l.grads.ok_or(SpecError::MissingGradLayouts)?;
            all.extend([("dO", g.d_o), ("dQ", g.dq), ("dK", g.dk), ("dV", g.dv)]);
        }
        for (tensor, s) in all {
            if s[3] != 1 {
                return Err(SpecError::InnerStride {
                    tensor,
                    stride: s[3],
                });
            }
        }
        Ok(())
    }

    /// The spec with its mask in canonical form (see [`MaskSpec::canonical`]); forward specs
    /// drop the gradient layouts and the deterministic flag, which a forward graph ignores.
    pub fn canonical(&self, dir: Direction) -> SdpaSpec {
        let mut s = *self;
        // With per-sequence lengths each sequence has its own s_q and s_kv: a bottom-right
        // diagonal stays bottom-right even when the longest lengths are equal.
        if self.seqlens.is_none() || self.mask.is_none() {
            s.mask = self.mask.canonical(self.s_q, self.s_kv);
        }
        if dir == Direction::Forward {
            s.layouts.grads = None;
            s.deterministic = false;
        }
        s
    }

    /// Whether this is grouped-query attention (h_q > h_kv).
    pub fn is_gqa(&self) -> bool {
        self.h_q != self.h_kv
    }

    /// FLOPs of the forward pass (two GEMMs), counting only unmasked score elements.
    pub fn fwd_flops(&self) -> f64 {
        let kept = self.kept_fraction();
        2.0 * (self.b * self.h_q * self.s_q * self.s_kv) as f64
            * (self.d_qk + self.d_v) as f64
            * kept
    }

    /// Fraction of the s_q x s_kv score matrix the mask keeps (exact count).
    pub fn kept_fraction(&self) -> f64 {
        if self.mask.is_none() {
            return 1.0;
        }
        let mut kept: i64 = 0;
        for row in 0..self.s_q {
            let r = row + self.mask.offset(self.s_q, self.s_kv);
            let lo = self.mask.left.map_or(0, |l| (r - l).max(0));
            let hi = self
                .mask
                .right
                .map_or(self.s_kv - 1, |rb| (r + rb).min(self.s_kv - 1));
            if hi >= lo {
                kept += hi - lo + 1;
            }
        }
        kept as f64 / (self.s_q * self.s_kv) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_semantics_match_flash_attention_conventions() {
        // causal top-left: row 0 sees col 0 only
        assert!(MaskSpec::CAUSAL.keeps(0, 0, 4, 8));
        assert!(!MaskSpec::CAUSAL.keeps(0, 1, 4, 8));
        // bottom-right with s_q=4, s_kv=8: row 0 sees cols 0..=4
        assert!(MaskSpec::CAUSAL_BOTTOM_RIGHT.keeps(0, 4, 4, 8));
        assert!(!MaskSpec::CAUSAL_BOTTOM_RIGHT.keeps(0, 5, 4, 8));
        // window (2, 0): row 5 sees cols 3..=5
        let w = MaskSpec {
            left: Some(2),
            right: Some(0),
            diagonal: Diagonal::TopLeft,
        };
        let seen: Vec<i64> = (0..8).filter(|&c| w.keeps(5, c, 8, 8)).collect();
        assert_eq!(seen, vec![3, 4, 5]);
        // left-only window sees the future
        let l = MaskSpec {
            left: Some(1),
            right: None,
            diagonal: Diagonal::TopLeft,
        };
        let seen: Vec<i64> = (0..8).filter(|&c| l.keeps(2, c, 8, 8)).collect();
        assert_eq!(seen, vec![1, 2, 3, 4, 5, 6, 7]);
    }

    #[test]
    fn canonical_mask_merges_equivalent_alignments() {
        assert_eq!(
            MaskSpec::CAUSAL_BOTTOM_RIGHT.canonical(16, 16),
            MaskSpec::CAUSAL
        );
        assert_eq!(
            MaskSpec::CAUSAL_BOTTOM_RIGHT.canonical(8, 16),
            MaskSpec::CAUSAL_BOTTOM_RIGHT
        );
        let none_br = MaskSpec {
            diagonal: Diagonal::BottomRight,
            ..MaskSpec::NONE
        };
        assert_eq!(none_br.canonical(8, 16), MaskSpec::NONE);
    }

    #[test]
    fn layouts_are_views_of_the_same_storage() {
        // bshd: element (b, h, s, d) at b*S*H*D + s*H*D + h*D + d
        let (b, h, s, d) = (2i64, 3i64, 5i64, 8i64);
        let st = bshd_strides(h, s, d);
        assert_eq!(
            st[0] + st[1] * 2 + st[2] * 4 + 7,
            s * h * d + 4 * h * d + 2 * d + 7
        );
        // sbhd: element (b, h, s, d) at s*B*H*D + b*H*D + h*D + d
        let st = sbhd_strides(b, h, d);
        assert_eq!(
            st[0] + st[1] * 2 + st[2] * 4 + 7,
            4 * b * h * d + h * d + 2 * d + 7
        );
    }

    #[test]
    fn validate_rejects_bad_specs_with_typed_errors() {
        let ok = SdpaSpec::dense_bhsd(1, 8, 4, 64, 64, 64, IoDtype::Bf16, MaskSpec::CAUSAL);
        assert_eq!(ok.validate(Direction::Backward), Ok(()));
        let mut s = ok;
        s.h_kv = 3;
        assert_eq!(
            s.validate(Direction::Forward),
            Err(SpecError::Heads { h_q: 8, h_kv: 3 })
        );
        let mut s = ok;
        s.layouts.k = [1, 2, 3, 4];
        assert!(matches!(
            s.validate(Direction::Forward),
            Err(SpecError::InnerStride { tensor: "k", .. })
        ));
        let mut s = ok;
        s.d_qk = 60;
        assert_eq!(
            s.validate(Direction::Forward),
            Err(SpecError::HeadDimAlign { d: 60 })
        );
        let mut s = ok;
        s.layouts.grads = None;
        assert_eq!(s.validate(Direction::Forward), Ok(()));
        assert_eq!(
            s.validate(Direction::Backward),
            Err(SpecError::MissingGradLayouts)
        );
    }

    #[test]
    fn kept_fraction_counts_the_band() {
        let s = SdpaSpec::dense_bhsd(1, 1, 1, 4, 4, 64, IoDtype::F16, MaskSpec::CAUSAL);
        assert!((s.kept_fraction() - 10.0 / 16.0).abs() < 1e-12);
        let s = SdpaSpec::dense_bhsd(1, 1, 1, 4, 4, 64, IoDtype::F16, MaskSpec::NONE);
        assert_eq!(s.kept_fraction(), 1.0);
    }
}
