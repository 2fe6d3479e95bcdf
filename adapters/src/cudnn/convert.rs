//! From an [`AttentionProblem`] to an [`SdpaSpec`], the capability manifest and the exact gate.
//! Pure (no cuDNN calls): the same answers on a CPU-only machine.

use crate::executor::{DeviceKind, Features, HeadDimRange, Manifest, Unsupported};
use crate::problem::{
    AttentionProblem, DType, DiagonalAlignment, LayoutKind, MaskKind, SeqPacking,
};

use super::graph::GraphKind;
use super::spec::{Diagonal, Direction, GradLayouts, IoDtype, Layouts, MaskSpec, SdpaSpec};
use super::version::CudnnVersion;

/// Registry name of the executor.
pub const NAME: &str = "cudnn";

/// Largest head dim the executor admits: cuDNN's documented SM90 limit for forward and backward
/// (9.19 runs a d = 512 forward only through a slow SM80 kernel and has no d = 512 backward).
pub const MAX_HEAD_DIM: usize = 256;

/// The executor's static capability manifest.
pub fn manifest() -> Manifest {
    manifest_with(varlen_enabled())
}

/// The manifest with per-sequence lengths served (`varlen`) or not.
pub fn manifest_with(varlen: bool) -> Manifest {
    Manifest {
        name: NAME.to_string(),
        device: DeviceKind::Cuda,
        min_compute_capability: Some(80),
        max_compute_capability: None,
        dtypes: vec![DType::BF16, DType::F16],
        head_dim_qk: HeadDimRange { min: 8, max: MAX_HEAD_DIM, multiple_of: 8 },
        head_dim_v: HeadDimRange { min: 8, max: MAX_HEAD_DIM, multiple_of: 8 },
        // MLA (q/k 192, v 128): the graphs give V, O and their gradients their own head dim.
        head_dim_v_may_differ: true,
        masks: vec![MaskKind::NoMask, MaskKind::CausalTopLeft, MaskKind::CausalBottomRight],
        windows: true,
        rectangular: true,
        layouts: vec![LayoutKind::Bshd, LayoutKind::Sbhd, LayoutKind::Bhsd],
        arbitrary_strides: true,
        stride_multiple_of: 8,
        gqa: true,
        max_seqlen: None,
        max_score_elements: None,
        backward: true,
        deterministic: true,
        // Padded (either side) and packed THD batches through cuDNN's padding mask and ragged
        // offsets, only where opted in (see `varlen_enabled`); soft-capping and sinks are not
        // built into the graphs (refused).
        features: Features {
            seqlens: if varlen {
                vec![
                    SeqPacking::PaddedRight,
                    SeqPacking::PaddedLeft,
                    SeqPacking::Packed,
                ]
            } else {
                Vec::new()
            },
            ..Features::none()
        },
        notes: vec![
            "cuDNN fused flash attention through the raw backend graph API (composite graph; native SDPA op where the runtime allows)".into(),
            "graphs are built from the tensors' actual strides: bshd, sbhd and bhsd run without copies".into(),
            "deterministic backward uses the frontend's dP-workspace graph and refuses engines noted NONDETERMINISTIC".into(),
            "a plan that is not a fused-attention engine (finalizeMode SDPA_FWD/SDPA_BWD/UNIFIED_SDPA_FWD) is refused".into(),
            "rows with no admissible key are refused (cuDNN would return NaN where the convention is O = 0, LSE = -inf)".into(),
            "per-sequence lengths (off with ATTN_POLICY_CUDNN_VARLEN=0; GPU tests over many seeds in docs/cudnn.md): padding mask with per-batch seq-len tensors and ragged offsets on every token tensor (right padding too: cuDNN then reads no padding row); padding rows are zeroed (O, dQ, dK, dV) and LSE set to -inf by the executor after the call; sequences of 0 tokens are refused".into(),
        ],
    }
}

/// The mask in the graph builder's terms.
pub fn mask_of(p: &AttentionProblem) -> MaskSpec {
    let e = p.effective_mask();
    let diagonal = match p.mask.alignment {
        DiagonalAlignment::TopLeft => Diagonal::TopLeft,
        DiagonalAlignment::BottomRight => Diagonal::BottomRight,
    };
    let m = MaskSpec {
        left: e.left,
        right: e.right,
        diagonal,
    };
    // with per-sequence lengths the diagonal sits per sequence: only "no mask" is canonical
    if p.seqlens.is_some() && !m.is_none() {
        m
    } else {
        m.canonical(p.seqlen_q as i64, p.seqlen_kv as i64)
    }
}

/// cuDNN's strides of a tensor with `h` heads over `s` rows (the longest sequence). A packed
/// tensor has batch stride 0; cuDNN finds each sequence through its ragged offsets and gets a
/// nominal batch stride (one sequence's extent) that never overlaps.
fn strides4(p: &AttentionProblem, s: crate::problem::Strides, h: usize, rows: usize) -> [i64; 4] {
    let batch = if p.is_packed() {
        (s.head * h).max(s.seq * rows)
    } else {
        s.batch
    };
    [batch as i64, s.head as i64, s.seq as i64, 1]
}

/// The graph spec of a problem (structure only; see [`check`] for what cuDNN accepts). Only for
/// problems [`check`] admits (fp16/bf16).
pub fn spec_of(p: &AttentionProblem, dir: Direction) -> SdpaSpec {
    let l = &p.layout;
    let (hq, hk, sq, skv) = (p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_kv);
    let (q, k, v, o) = (
        strides4(p, l.q, hq, sq),
        strides4(p, l.k, hk, skv),
        strides4(p, l.v, hk, skv),
        strides4(p, l.o, hq, sq),
    );
    let layouts = Layouts {
        q,
        k,
        v,
        o,
        grads: (dir == Direction::Backward).then_some(GradLayouts {
            d_o: o,
            dq: q,
            dk: k,
            dv: v,
        }),
    };
    SdpaSpec {
        b: p.batch as i64,
        h_q: p.heads_q as i64,
        h_kv: p.heads_kv as i64,
        s_q: p.seqlen_q as i64,
        s_kv: p.seqlen_kv as i64,
        d_qk: p.head_dim_qk as i64,
        d_v: p.head_dim_v as i64,
        // Wide dtypes never reach a graph: `check` (the manifest) refuses them first.
        dtype: match p.dtype {
            DType::F16 => IoDtype::F16,
            DType::BF16 | DType::F32 | DType::F64 => IoDtype::Bf16,
        },
        mask: mask_of(p),
        layouts,
        deterministic: dir == Direction::Backward && p.deterministic,
        seqlens: p.seqlens.as_ref().map(|s| s.packing),
    }
    .canonical(dir)
}

/// The environment variable that opts in to padded and packed batches on cuDNN.
pub const VARLEN_ENV: &str = "ATTN_POLICY_CUDNN_VARLEN";

/// Whether cuDNN serves padded and packed batches in this process: yes unless the process sets
/// `ATTN_POLICY_CUDNN_VARLEN=0` (read at first use), which sends them down the chain to
/// `chunked`. Their GPU tests (adapters/tests/cudnn_gpu.rs, `varlen_*`) pass the numerics
/// criterion over many seeds (docs/cudnn.md, "Per-sequence lengths").
pub fn varlen_enabled() -> bool {
    // Read once per process: the gate runs on every plan, and the answer must not change
    // between a decision and its run.
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os(VARLEN_ENV).is_none_or(|v| v != "0"))
}

/// The exact gate, without a device: the manifest, empty mask rows, and (when known) the
/// runtime version. Plan building can still refuse (see the executor).
pub fn check(p: &AttentionProblem, version: Option<CudnnVersion>) -> Result<(), Unsupported> {
    check_with(p, version, varlen_enabled())
}

/// [`check`] with per-sequence lengths served (`varlen`) or not.
pub fn check_with(
    p: &AttentionProblem,
    version: Option<CudnnVersion>,
    varlen: bool,
) -> Result<(), Unsupported> {
    if p.seqlens.is_some() && !varlen {
        return Err(Unsupported::new(format!(
            "padded and packed batches on cuDNN are switched off in this process ({VARLEN_ENV}=0)"
        )));
    }
    manifest_with(varlen).admits(p)?;
    if let Some(s) = &p.seqlens {
        for b in 0..p.batch {
            let (lq, lkv) = (s.q[b], s.kv[b]);
            if lq == 0 || lkv == 0 {
                return Err(Unsupported::new(format!(
                    "sequence {b} has {lq} query and {lkv} key tokens; cuDNN is not asked for empty sequences"
                )));
            }
            // the band's empty rows, if any, are the first or the last (row ranges are monotone)
            let e = p.seq_mask(b);
            for row in [0, lq - 1] {
                let (lo, hi) = e.row_range(row);
                if lo >= hi {
                    return Err(Unsupported::new(format!(
                        "mask {} leaves query row {row} of sequence {b} with no key (q {lq}, kv {lkv} tokens); cuDNN would return NaN there",
                        mask_of(p),
                    )));
                }
            }
        }
    } else {
        let e = p.effective_mask();
        for row in [0, p.seqlen_q - 1] {
            let (lo, hi) = e.row_range(row);
            if lo >= hi {
                return Err(Unsupported::new(format!(
                    "mask {} leaves query row {row} with no key (s_q = {}, s_kv = {}); cuDNN would return NaN there",
                    mask_of(p),
                    p.seqlen_q,
                    p.seqlen_kv
                )));
            }
        }
    }
    if let Some(v) = version
        && let Some(reason) =
            v.unsupported_reason(&spec_of(p, Direction::Forward), Direction::Forward)
    {
        return Err(Unsupported::new(reason));
    }
    Ok(())
}

/// Forward graphs to try, in order: the native SDPA op where the runtime version allows it for
/// this mask (cudnn-frontend's UNIFIED choice), then the composite graph.
pub fn forward_candidates(
    spec: &SdpaSpec,
    version: CudnnVersion,
    native_allowed: bool,
) -> Vec<GraphKind> {
    // per-sequence lengths: the composite graph (padding mask, ragged offsets) only
    let native = native_allowed
        && spec.seqlens.is_none()
        && version.has_native_sdpa()
        && (spec.mask.is_none() || version.has_sdpa_subgraph());
    if native {
        vec![GraphKind::NativeFwd, GraphKind::CompositeFwd]
    } else {
        vec![GraphKind::CompositeFwd]
    }
}

/// A three-valued probe answer (`probe.fused_attn_graph` in rule packs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeAnswer {
    /// cuDNN built a fused-attention plan for the graph on this device.
    Yes {
        /// The engine (tag, finalize mode, kernel).
        engine: String,
    },
    /// cuDNN (or the executor's gate) refuses the graph here.
    No {
        /// Why.
        reason: String,
    },
    /// No live cuDNN to ask (no GPU, no library, or built without the `cudnn` feature).
    Unknown {
        /// Why.
        reason: String,
    },
}

impl ProbeAnswer {
    /// As a fact value: `Some(true)`, `Some(false)`, or `None` (unknown).
    pub fn as_fact(&self) -> Option<bool> {
        match self {
            ProbeAnswer::Yes { .. } => Some(true),
            ProbeAnswer::No { .. } => Some(false),
            ProbeAnswer::Unknown { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{MaskSpec as PMask, SeqLens, SoftmaxKind};

    fn p(sq: usize, skv: usize, d: usize) -> AttentionProblem {
        AttentionProblem::new(2, 8, 4, sq, skv, d, d, DType::BF16)
    }

    #[test]
    fn spec_uses_the_actual_strides_of_each_layout() {
        for kind in [LayoutKind::Bshd, LayoutKind::Sbhd, LayoutKind::Bhsd] {
            let pr = p(64, 64, 128).with_layout(kind);
            let s = spec_of(&pr, Direction::Backward);
            let l = pr.layout.q;
            assert_eq!(
                s.layouts.q,
                [l.batch as i64, l.head as i64, l.seq as i64, 1]
            );
            let g = s.layouts.grads.unwrap();
            assert_eq!(g.dq, s.layouts.q);
            assert_eq!(g.d_o, s.layouts.o);
            assert_eq!(s.validate(Direction::Backward), Ok(()));
        }
        let f = spec_of(&p(64, 64, 128), Direction::Forward);
        assert!(f.layouts.grads.is_none());
        assert!(
            !f.deterministic,
            "forward graphs ignore the deterministic flag"
        );
    }

    #[test]
    fn masks_map_onto_the_band() {
        let c = p(64, 128, 64).with_mask(PMask::CAUSAL_TOP_LEFT);
        assert_eq!(mask_of(&c), MaskSpec::CAUSAL);
        let br = p(64, 128, 64).with_mask(PMask::CAUSAL_BOTTOM_RIGHT);
        assert_eq!(mask_of(&br), MaskSpec::CAUSAL_BOTTOM_RIGHT);
        // square: bottom-right is top-left
        let sq = p(64, 64, 64).with_mask(PMask::CAUSAL_BOTTOM_RIGHT);
        assert_eq!(mask_of(&sq), MaskSpec::CAUSAL);
        let w = p(64, 64, 64).with_mask(PMask::window(16, 0, DiagonalAlignment::TopLeft));
        assert_eq!(
            mask_of(&w),
            MaskSpec {
                left: Some(16),
                right: Some(0),
                diagonal: Diagonal::TopLeft
            }
        );
        // the band semantics agree with the problem's effective mask everywhere
        for m in [
            PMask::CAUSAL_BOTTOM_RIGHT,
            PMask::window(5, 3, DiagonalAlignment::BottomRight),
            PMask::window(7, -1, DiagonalAlignment::TopLeft),
        ] {
            let pr = p(24, 40, 64).with_mask(m);
            let band = mask_of(&pr);
            let e = pr.effective_mask();
            for i in 0..24 {
                for j in 0..40 {
                    assert_eq!(
                        band.keeps(i as i64, j as i64, 24, 40),
                        e.allows(i, j),
                        "{m:?} {i} {j}"
                    );
                }
            }
        }
    }

    #[test]
    fn gate_refuses_what_cudnn_cannot_run_exactly() {
        assert!(check(&p(64, 64, 128), Some(CudnnVersion(91900))).is_ok());
        let e = check(&p(64, 64, 512), None).unwrap_err();
        assert!(e.reason.contains("head_dim_qk 512"), "{}", e.reason);
        // bottom-right causal with s_q > s_kv leaves the first rows empty
        let br = p(128, 64, 64).with_mask(PMask::CAUSAL_BOTTOM_RIGHT);
        assert!(check(&br, None).unwrap_err().reason.contains("no key"));
        // a top-left window past the end of a short KV leaves the last rows empty
        let w = p(128, 16, 64).with_mask(PMask::window(4, 0, DiagonalAlignment::TopLeft));
        assert!(check(&w, None).unwrap_err().reason.contains("row 127"));
        // cuDNN older than 9.6
        assert!(check(&p(64, 64, 64), Some(CudnnVersion(90500))).is_err());
        let mut odd = p(64, 64, 64);
        odd.layout.q.seq = 68;
        odd.layout.q.head = 68 * 64 * 2;
        odd.layout.q.batch = 68 * 64 * 2 * 8;
        assert!(
            check(&odd, None)
                .unwrap_err()
                .reason
                .contains("multiples of 8")
        );
    }

    #[test]
    fn native_op_only_where_the_version_allows_the_mask() {
        let none = spec_of(&p(64, 64, 64), Direction::Forward);
        let causal = spec_of(
            &p(64, 64, 64).with_mask(PMask::CAUSAL_TOP_LEFT),
            Direction::Forward,
        );
        let v919 = CudnnVersion(91900);
        let v921 = CudnnVersion(92100);
        assert_eq!(
            forward_candidates(&none, v919, true),
            vec![GraphKind::NativeFwd, GraphKind::CompositeFwd]
        );
        assert_eq!(
            forward_candidates(&causal, v919, true),
            vec![GraphKind::CompositeFwd]
        );
        assert_eq!(
            forward_candidates(&causal, v921, true),
            vec![GraphKind::NativeFwd, GraphKind::CompositeFwd]
        );
        assert_eq!(
            forward_candidates(&none, CudnnVersion(91200), true),
            vec![GraphKind::CompositeFwd]
        );
        assert_eq!(
            forward_candidates(&none, v921, false),
            vec![GraphKind::CompositeFwd]
        );
    }

    #[test]
    fn probe_answers_are_three_valued() {
        assert_eq!(
            ProbeAnswer::Yes {
                engine: "eng2".into()
            }
            .as_fact(),
            Some(true)
        );
        assert_eq!(
            ProbeAnswer::No { reason: "x".into() }.as_fact(),
            Some(false)
        );
        assert_eq!(ProbeAnswer::Unknown { reason: "x".into() }.as_fact(), None);
    }

    fn seq(packing: SeqPacking, q: Vec<usize>, kv: Vec<usize>) -> AttentionProblem {
        AttentionProblem::new(3, 8, 2, 96, 96, 64, 64, DType::BF16)
            .with_mask(PMask::CAUSAL_BOTTOM_RIGHT)
            .with_seqlens(SeqLens::padded(packing, q, kv), LayoutKind::Bshd)
    }

    #[test]
    fn every_packing_is_admitted_and_the_lengths_are_not_in_the_spec() {
        let v = Some(CudnnVersion(91900));
        for packing in [
            SeqPacking::PaddedRight,
            SeqPacking::PaddedLeft,
            SeqPacking::Packed,
        ] {
            let a = seq(packing, vec![1, 96, 40], vec![1, 96, 70]);
            let b = seq(packing, vec![96, 5, 2], vec![96, 5, 90]);
            assert_eq!(check_with(&a, v, true), Ok(()), "{packing:?}");
            assert_eq!(check_with(&b, v, true), Ok(()), "{packing:?}");
            for dir in [Direction::Forward, Direction::Backward] {
                let (sa, sb) = (spec_of(&a, dir), spec_of(&b, dir));
                // the plan key: the same graph whatever the lengths
                assert_eq!(sa, sb, "{packing:?}");
                assert_eq!(sa.seqlens, Some(packing));
                assert_eq!(sa.validate(dir), Ok(()));
                // square longest lengths, but each sequence has its own diagonal
                assert_eq!(sa.mask, MaskSpec::CAUSAL_BOTTOM_RIGHT);
            }
            assert_eq!(
                forward_candidates(&spec_of(&a, Direction::Forward), CudnnVersion(92100), true),
                vec![GraphKind::CompositeFwd]
            );
        }
        // packed: batch stride 0 in the problem, a nominal non-overlapping one for cuDNN
        let p = seq(SeqPacking::Packed, vec![1, 96, 40], vec![1, 96, 70]);
        assert_eq!(p.layout.q.batch, 0);
        let s = spec_of(&p, Direction::Forward);
        assert_eq!(s.layouts.q, [96 * 8 * 64, 64, 8 * 64, 1]);
        assert_eq!(s.layouts.k, [96 * 2 * 64, 64, 2 * 64, 1]);
        // the packings are separate plans
        let right = spec_of(
            &seq(SeqPacking::PaddedRight, vec![1, 96, 40], vec![1, 96, 70]),
            Direction::Forward,
        );
        let left = spec_of(
            &seq(SeqPacking::PaddedLeft, vec![1, 96, 40], vec![1, 96, 70]),
            Direction::Forward,
        );
        assert_ne!(right, left);
        assert_ne!(left, s);
        // no padding-mask workaround refusal on old runtimes: the graph has the padding mask
        let odd = seq(SeqPacking::PaddedRight, vec![1, 90, 40], vec![1, 90, 70]);
        let mut odd = odd;
        odd.seqlen_kv = 90;
        odd.seqlen_q = 90;
        odd.set_layout(LayoutKind::Bshd);
        assert_eq!(check_with(&odd, Some(CudnnVersion(91400)), true), Ok(()));
    }

    #[test]
    fn varlen_is_refused_only_where_switched_off() {
        let p = seq(SeqPacking::PaddedRight, vec![10, 96, 3], vec![12, 96, 3]);
        assert_eq!(check_with(&p, None, true), Ok(()));
        let r = check_with(&p, None, false).unwrap_err().reason;
        assert!(r.contains(VARLEN_ENV) && r.contains("switched off"), "{r}");
        assert!(manifest_with(false).features.seqlens.is_empty());
        assert_eq!(manifest_with(true).features.seqlens.len(), 3);
        // A call without lengths is unaffected.
        let plain = AttentionProblem::new(2, 8, 2, 96, 96, 64, 64, DType::BF16);
        assert_eq!(check_with(&plain, None, false), Ok(()));
    }

    #[test]
    fn varlen_gate_refuses_what_stays_out_typed() {
        let ok = seq(SeqPacking::PaddedRight, vec![10, 96, 3], vec![12, 96, 3]);
        assert!(check_with(&ok, None, true).is_ok());
        let mut capped = ok.clone();
        capped.softcap = Some(30.0);
        assert!(
            check_with(&capped, None, true)
                .unwrap_err()
                .reason
                .contains("soft-capping")
        );
        for kind in [SoftmaxKind::OffByOne, SoftmaxKind::Learnable] {
            let mut sink = ok.clone();
            sink.softmax = kind;
            assert!(check_with(&sink, None, true).is_err(), "{kind:?}");
        }
        // an empty sequence
        let e = seq(SeqPacking::Packed, vec![10, 0, 3], vec![12, 5, 3]);
        assert!(
            check_with(&e, None, true)
                .unwrap_err()
                .reason
                .contains("sequence 1")
        );
        let e = seq(SeqPacking::PaddedLeft, vec![10, 4, 3], vec![12, 0, 3]);
        assert!(
            check_with(&e, None, true)
                .unwrap_err()
                .reason
                .contains("sequence 1")
        );
        // bottom-right with more queries than keys in one sequence leaves its first rows empty,
        // although the longest lengths are square
        let e = seq(SeqPacking::PaddedRight, vec![10, 96, 8], vec![12, 96, 3]);
        let r = check_with(&e, None, true).unwrap_err().reason;
        assert!(r.contains("row 0 of sequence 2"), "{r}");
        // a top-left causal sequence with more queries than keys keeps every row
        let mut tl = e.clone();
        tl.mask = PMask::CAUSAL_TOP_LEFT;
        assert!(check_with(&tl, None, true).is_ok());
        // a top-left window past a short sequence's keys empties its last rows
        let mut w = tl.clone();
        w.mask = PMask::window(2, 0, DiagonalAlignment::TopLeft);
        assert!(
            check_with(&w, None, true)
                .unwrap_err()
                .reason
                .contains("row 7 of sequence 2")
        );
    }
}
