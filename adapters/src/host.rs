//! Manifests of the executors a Python host provides: PyTorch's own scaled-dot-product
//! attention kernels, called by the `attn_policy.torch` package through torch's aten ops with
//! an explicit log-sum-exp. Their limits are PyTorch 2.11's (aten `sdp_utils`, the kernels'
//! own checks); the Python side checks each call exactly before it runs one.
//!
//! These are data only: nothing here runs them. The registry lists them as unavailable outside
//! Python ([`crate::registry::HOST_ONLY`]).

use crate::executor::{DeviceKind, Features, HeadDimRange, Manifest};
use crate::problem::{DType, LayoutKind, MaskKind, SeqPacking};

/// FlashAttention-2 inside PyTorch (`aten::_flash_attention_forward`).
pub const TORCH_FLASH: &str = "torch_flash";
/// The memory-efficient (CUTLASS) kernel (`aten::_efficient_attention_forward`).
pub const TORCH_EFFICIENT: &str = "torch_efficient";
/// PyTorch's cuDNN SDPA (`aten::_scaled_dot_product_cudnn_attention`).
pub const TORCH_CUDNN: &str = "torch_cudnn";
/// Attention written with torch tensor ops (matmul, softmax), any device torch runs on.
pub const TORCH_MATH: &str = "torch_math";

const ALL_LAYOUTS: [LayoutKind; 3] = [LayoutKind::Bshd, LayoutKind::Sbhd, LayoutKind::Bhsd];

fn dims(min: usize, max: usize, multiple_of: usize) -> HeadDimRange {
    HeadDimRange {
        min,
        max,
        multiple_of,
    }
}

/// The environment variable that switches padded and packed batches on `torch_flash` and
/// `torch_efficient` off (`0`).
pub const TORCH_VARLEN_ENV: &str = "ATTN_POLICY_TORCH_VARLEN";

/// Whether `torch_flash` and `torch_efficient` serve padded and packed batches in this process:
/// yes unless it sets `ATTN_POLICY_TORCH_VARLEN=0` (read once). Their varlen paths
/// (attn_policy/_varlen.py) pass their GPU tests (tests/gpu/test_gpu_torch_varlen.py:
/// docs/features.md has the figures).
pub fn torch_varlen_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os(TORCH_VARLEN_ENV).is_none_or(|v| v != "0"))
}

/// `torch_flash`: FlashAttention-2 as built into PyTorch.
pub fn torch_flash() -> Manifest {
    torch_flash_with(torch_varlen_enabled())
}

/// [`torch_flash`] with per-sequence lengths served (`varlen_on`) or not.
pub fn torch_flash_with(varlen_on: bool) -> Manifest {
    Manifest {
        name: TORCH_FLASH.into(),
        device: DeviceKind::Cuda,
        min_compute_capability: Some(80),
        max_compute_capability: None,
        dtypes: vec![DType::F16, DType::BF16],
        head_dim_qk: dims(8, 256, 8),
        head_dim_v: dims(8, 256, 8),
        head_dim_v_may_differ: false,
        masks: vec![
            MaskKind::NoMask,
            MaskKind::CausalTopLeft,
            MaskKind::CausalBottomRight,
        ],
        windows: true,
        rectangular: true,
        layouts: ALL_LAYOUTS.to_vec(),
        arbitrary_strides: true,
        stride_multiple_of: 1,
        gqa: true,
        max_seqlen: None,
        max_score_elements: None,
        backward: true,
        deterministic: false,
        features: varlen(varlen_on),
        notes: vec![
            "aten::_flash_attention_forward/backward (FlashAttention-2 in PyTorch), LSE returned by the kernel".into(),
            "padded and packed batches (off with ATTN_POLICY_TORCH_VARLEN=0) through the ops' cu_seqlens (padded: tokens gathered into a packed copy and scattered back)".into(),
            "its diagonal is bottom-right: a top-left causal mask or window runs only when s_q == s_kv".into(),
            "backward accumulates dQ with atomics: not deterministic".into(),
        ],
    }
}

/// What `torch_flash` and `torch_efficient` serve of the features: per-sequence lengths on
/// either side and packed (the ops' varlen arguments, attn_policy/_varlen.py); no soft-cap, no
/// sink. Nothing unless `on` ([`torch_varlen_enabled`]).
fn varlen(on: bool) -> Features {
    if !on {
        return Features::none();
    }
    Features {
        seqlens: vec![
            SeqPacking::PaddedRight,
            SeqPacking::PaddedLeft,
            SeqPacking::Packed,
        ],
        ..Features::none()
    }
}

/// `torch_efficient`: the memory-efficient attention kernel in PyTorch.
pub fn torch_efficient() -> Manifest {
    torch_efficient_with(torch_varlen_enabled())
}

/// [`torch_efficient`] with per-sequence lengths served (`varlen_on`) or not.
pub fn torch_efficient_with(varlen_on: bool) -> Manifest {
    Manifest {
        name: TORCH_EFFICIENT.into(),
        device: DeviceKind::Cuda,
        min_compute_capability: Some(50),
        max_compute_capability: None,
        dtypes: vec![DType::F16, DType::BF16, DType::F32],
        head_dim_qk: dims(8, 512, 8),
        head_dim_v: dims(8, 512, 8),
        head_dim_v_may_differ: true,
        masks: vec![
            MaskKind::NoMask,
            MaskKind::CausalTopLeft,
            MaskKind::CausalBottomRight,
        ],
        windows: false,
        rectangular: true,
        layouts: ALL_LAYOUTS.to_vec(),
        arbitrary_strides: true,
        stride_multiple_of: 1,
        gqa: false,
        max_seqlen: None,
        max_score_elements: None,
        backward: true,
        deterministic: false,
        features: varlen(varlen_on),
        notes: vec![
            "aten::_efficient_attention_forward/backward (CUTLASS), custom_mask_type 0/1/2 for no mask / top-left / bottom-right causal".into(),
            "with per-sequence lengths its bottom-right causal (type 2) is not per sequence: refused unless every running sequence is square (then run as top-left)".into(),
            "padded and packed batches (off with ATTN_POLICY_TORCH_VARLEN=0) through the ops' cu_seqlens (padded: tokens gathered into a packed copy and scattered back)".into(),
            "no GQA (equal head counts) and no sliding window in this executor".into(),
        ],
    }
}

/// `torch_cudnn`: PyTorch's own cuDNN SDPA path.
pub fn torch_cudnn() -> Manifest {
    Manifest {
        name: TORCH_CUDNN.into(),
        device: DeviceKind::Cuda,
        min_compute_capability: Some(80),
        max_compute_capability: None,
        dtypes: vec![DType::F16, DType::BF16],
        head_dim_qk: dims(8, 128, 8),
        head_dim_v: dims(8, 128, 8),
        head_dim_v_may_differ: false,
        masks: vec![MaskKind::NoMask, MaskKind::CausalTopLeft],
        windows: false,
        rectangular: true,
        layouts: ALL_LAYOUTS.to_vec(),
        arbitrary_strides: true,
        stride_multiple_of: 8,
        gqa: false,
        max_seqlen: None,
        max_score_elements: None,
        backward: true,
        deterministic: false,
        features: crate::executor::Features::none(),
        notes: vec![
            "aten::_scaled_dot_product_cudnn_attention/backward; top-left causal only, no window, no GQA".into(),
        ],
    }
}

/// `torch_math`: attention from torch tensor ops, float32 accumulation at least.
pub fn torch_math() -> Manifest {
    Manifest {
        name: TORCH_MATH.into(),
        device: DeviceKind::Cuda,
        min_compute_capability: None,
        max_compute_capability: None,
        dtypes: vec![DType::F16, DType::BF16, DType::F32, DType::F64],
        head_dim_qk: dims(1, 65536, 1),
        head_dim_v: dims(1, 65536, 1),
        head_dim_v_may_differ: true,
        masks: vec![
            MaskKind::NoMask,
            MaskKind::CausalTopLeft,
            MaskKind::CausalBottomRight,
        ],
        windows: true,
        rectangular: true,
        layouts: ALL_LAYOUTS.to_vec(),
        arbitrary_strides: true,
        stride_multiple_of: 1,
        gqa: true,
        max_seqlen: None,
        max_score_elements: None,
        backward: true,
        deterministic: true,
        // Softcap, both sinks (d_sink returned) and every packing: the math runs per
        // sequence in its own coordinates (bindings/python/python/attn_policy/_runners.py).
        features: crate::executor::Features::all(),
        notes: vec![
            "matmul + masked softmax in float32 for fp16/bf16, float64 for fp32/fp64 inputs (an fp32 softmax of fp32 inputs misses 2x the naive error); O(s_q * s_kv) memory"
                .into(),
            "soft-capping, off-by-one and learnable sinks (d_sink by autograd), padded (right, left) and packed THD sequences, each sequence in its own coordinates".into(),
        ],
    }
}

/// `(name, description, manifest)` of every host-provided executor.
pub fn torch_executors() -> Vec<(&'static str, &'static str, Manifest)> {
    vec![
        (
            TORCH_FLASH,
            "PyTorch's FlashAttention-2 kernel (Python host only)",
            torch_flash(),
        ),
        (
            TORCH_EFFICIENT,
            "PyTorch's memory-efficient attention kernel (Python host only)",
            torch_efficient(),
        ),
        (
            TORCH_CUDNN,
            "PyTorch's cuDNN attention (Python host only)",
            torch_cudnn(),
        ),
        (
            TORCH_MATH,
            "attention from torch tensor ops (Python host only)",
            torch_math(),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{AttentionProblem, SeqLens, SoftmaxKind};

    /// Each feature alone (and all at once) on an fp16 problem with `hkv` KV heads (of 4).
    fn feature_problems(hkv: usize) -> Vec<(&'static str, AttentionProblem)> {
        let base = AttentionProblem::new(2, 4, hkv, 16, 24, 64, 64, DType::F16);
        let with = |f: &dyn Fn(&mut AttentionProblem)| {
            let mut p = base.clone();
            f(&mut p);
            p
        };
        let padded = |side| SeqLens::padded(side, vec![16, 5], vec![24, 0]);
        vec![
            ("softcap", with(&|p| p.softcap = Some(30.0))),
            ("off-by-one", with(&|p| p.softmax = SoftmaxKind::OffByOne)),
            ("learnable", with(&|p| p.softmax = SoftmaxKind::Learnable)),
            (
                "padded right",
                base.clone()
                    .with_seqlens(padded(SeqPacking::PaddedRight), LayoutKind::Bshd),
            ),
            (
                "padded left",
                base.clone()
                    .with_seqlens(padded(SeqPacking::PaddedLeft), LayoutKind::Sbhd),
            ),
            (
                "packed",
                AttentionProblem::new(3, 4, hkv, 16, 20, 64, 64, DType::F16).with_seqlens(
                    SeqLens {
                        packing: SeqPacking::Packed,
                        q: vec![16, 0, 7],
                        kv: vec![20, 3, 0],
                    },
                    LayoutKind::Bshd,
                ),
            ),
            (
                "all",
                with(&|p| {
                    p.softcap = Some(50.0);
                    p.softmax = SoftmaxKind::Learnable;
                })
                .with_seqlens(padded(SeqPacking::PaddedLeft), LayoutKind::Bshd),
            ),
        ]
    }

    #[test]
    fn host_torch_math_admits_every_feature_the_kernels_lengths_only() {
        let mha = feature_problems(4);
        for (i, (what, p)) in feature_problems(2).into_iter().enumerate() {
            assert!(torch_math().admits(&p).is_ok(), "torch_math refuses {what}");
            // The kernels are not deterministic: asked of a problem that allows that.
            let mut k = p.clone();
            k.deterministic = false;
            assert!(
                torch_cudnn().admits(&k).is_err(),
                "torch_cudnn admits {what}"
            );
            // torch_flash serves per-sequence lengths (GQA included), nothing else of them.
            let lengths_only =
                p.seqlens.is_some() && p.softcap.is_none() && p.softmax == SoftmaxKind::Vanilla;
            let flash = torch_flash_with(true).admits(&k);
            assert!(torch_flash_with(false).admits(&k).is_err() || p.seqlens.is_none());
            assert_eq!(
                flash.is_ok(),
                lengths_only,
                "torch_flash on {what}: {flash:?}"
            );
            // torch_efficient has no GQA: the same problem with equal head counts.
            let mut k = mha[i].1.clone();
            k.deterministic = false;
            let eff = torch_efficient_with(true).admits(&k);
            assert_eq!(
                eff.is_ok(),
                lengths_only,
                "torch_efficient on {what}: {eff:?}"
            );
        }
        assert_eq!(torch_math().features, crate::executor::Features::all());
        assert_eq!(torch_flash_with(true).features, varlen(true));
        assert_eq!(torch_efficient_with(true).features, varlen(true));
        assert!(!varlen(true).softcap && varlen(true).sinks.is_empty());
        // Off by default (no ATTN_POLICY_TORCH_VARLEN in the test environment).
        assert_eq!(torch_flash_with(false).features, Features::none());
        assert_eq!(torch_efficient().features, varlen(torch_varlen_enabled()));
    }
}
