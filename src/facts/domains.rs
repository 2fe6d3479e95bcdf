//! Closed value domains of categorical facts, under each selector's own spellings
//! (TransformerEngine's for the `te` family, short PyTorch dtype names for `torch`).
//! strum gives each domain its list of values, so analysis can enumerate them.

use strum::{EnumIter, EnumString, IntoStaticStr, VariantNames};

macro_rules! domain {
    ($(#[$m:meta])* $name:ident { $($variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, EnumString, IntoStaticStr, VariantNames)]
        pub enum $name {
            $(#[strum(serialize = $text)] $variant),+
        }
    };
}

domain!(
    /// Python class of the query tensor (`AttentionParams.qkv_type`), by class name.
    QkvType {
        Tensor = "Tensor",
        Float8Tensor = "Float8Tensor",
        Float8TensorStorage = "Float8TensorStorage",
        MXFP8Tensor = "MXFP8Tensor",
        MXFP8TensorStorage = "MXFP8TensorStorage",
        Float8BlockwiseQTensor = "Float8BlockwiseQTensor",
        NVFP4Tensor = "NVFP4Tensor",
    }
);

domain!(
    /// Element types (`qkv_dtype`, `nominal_dtype`).
    Dtype {
        Fp16 = "fp16",
        Bf16 = "bf16",
        Fp32 = "fp32",
        Fp8E4m3 = "fp8_e4m3",
        Fp8E5m2 = "fp8_e5m2",
    }
);

domain!(
    /// The 25 `QKVLayouts` of TE's constants.py plus `bhsd_bhsd_bhsd` (FP8 spec).
    QkvLayout {
        Sb3hd = "sb3hd",
        Sbh3d = "sbh3d",
        SbhdSb2hd = "sbhd_sb2hd",
        SbhdSbh2d = "sbhd_sbh2d",
        SbhdSbhdSbhd = "sbhd_sbhd_sbhd",
        Bs3hd = "bs3hd",
        Bsh3d = "bsh3d",
        BshdBs2hd = "bshd_bs2hd",
        BshdBsh2d = "bshd_bsh2d",
        BshdBshdBshd = "bshd_bshd_bshd",
        T3hd = "t3hd",
        Th3d = "th3d",
        ThdT2hd = "thd_t2hd",
        ThdTh2d = "thd_th2d",
        ThdThdThd = "thd_thd_thd",
        SbhdBshdBshd = "sbhd_bshd_bshd",
        BshdSbhdSbhd = "bshd_sbhd_sbhd",
        ThdBshdBshd = "thd_bshd_bshd",
        ThdSbhdSbhd = "thd_sbhd_sbhd",
        PagedKvBshdBshdBshd = "paged_kv_bshd_bshd_bshd",
        PagedKvBshdSbhdSbhd = "paged_kv_bshd_sbhd_sbhd",
        PagedKvSbhdBshdBshd = "paged_kv_sbhd_bshd_bshd",
        PagedKvSbhdSbhdSbhd = "paged_kv_sbhd_sbhd_sbhd",
        PagedKvThdBshdBshd = "paged_kv_thd_bshd_bshd",
        PagedKvThdSbhdSbhd = "paged_kv_thd_sbhd_sbhd",
        BhsdBhsdBhsd = "bhsd_bhsd_bhsd",
    }
);

domain!(
    /// `attn_mask_type`.
    AttnMaskType {
        NoMask = "no_mask",
        Padding = "padding",
        Causal = "causal",
        PaddingCausal = "padding_causal",
        CausalBottomRight = "causal_bottom_right",
        PaddingCausalBottomRight = "padding_causal_bottom_right",
        Arbitrary = "arbitrary",
    }
);

domain!(
    /// `core_attention_bias_type`.
    BiasType {
        NoBias = "no_bias",
        PreScaleBias = "pre_scale_bias",
        PostScaleBias = "post_scale_bias",
        Alibi = "alibi",
    }
);

domain!(
    /// `cp_comm_type`.
    CpCommType {
        P2p = "p2p",
        AllGather = "all_gather",
        A2a = "a2a",
        A2aP2p = "a2a+p2p",
    }
);

domain!(
    /// `softmax_type`.
    SoftmaxType {
        Vanilla = "vanilla",
        OffByOne = "off-by-one",
        Learnable = "learnable",
    }
);

domain!(
    /// FP8 recipe class (`fp8_meta["recipe"]`).
    RecipeKind {
        DelayedScaling = "DelayedScaling",
        Float8CurrentScaling = "Float8CurrentScaling",
        MXFP8BlockScaling = "MXFP8BlockScaling",
        Float8BlockScaling = "Float8BlockScaling",
        NVFP4BlockScaling = "NVFP4BlockScaling",
        CustomRecipe = "CustomRecipe",
    }
);

domain!(
    /// FP8 format of a recipe.
    Fp8Format {
        Hybrid = "HYBRID",
        E4m3 = "E4M3",
        E5m2 = "E5M2",
    }
);

domain!(
    /// PyTorch tensor dtypes under short names (the `torch` family's `dtype`, `dtype_k`,
    /// `dtype_v`, `attn_mask.dtype`); `other` is any dtype no check of SDPA's lists.
    TorchDtype {
        Fp16 = "fp16",
        Bf16 = "bf16",
        Fp32 = "fp32",
        Fp64 = "fp64",
        Fp8E4m3fn = "fp8_e4m3fn",
        Fp8E5m2 = "fp8_e5m2",
        Bool = "bool",
        Other = "other",
    }
);

/// A categorical domain, as the type checker and the analyser see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Domain {
    QkvType,
    Dtype,
    QkvLayout,
    AttnMaskType,
    BiasType,
    CpCommType,
    SoftmaxType,
    RecipeKind,
    Fp8Format,
    TorchDtype,
}

impl Domain {
    /// Every value of the domain, in declaration order; a value's index is its `Value::Enum` id.
    pub fn values(self) -> &'static [&'static str] {
        match self {
            Domain::QkvType => QkvType::VARIANTS,
            Domain::Dtype => Dtype::VARIANTS,
            Domain::QkvLayout => QkvLayout::VARIANTS,
            Domain::AttnMaskType => AttnMaskType::VARIANTS,
            Domain::BiasType => BiasType::VARIANTS,
            Domain::CpCommType => CpCommType::VARIANTS,
            Domain::SoftmaxType => SoftmaxType::VARIANTS,
            Domain::RecipeKind => RecipeKind::VARIANTS,
            Domain::Fp8Format => Fp8Format::VARIANTS,
            Domain::TorchDtype => TorchDtype::VARIANTS,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Domain::QkvType => "qkv_type",
            Domain::Dtype => "dtype",
            Domain::QkvLayout => "qkv_layout",
            Domain::AttnMaskType => "attn_mask_type",
            Domain::BiasType => "bias_type",
            Domain::CpCommType => "cp_comm_type",
            Domain::SoftmaxType => "softmax_type",
            Domain::RecipeKind => "fp8 recipe",
            Domain::Fp8Format => "fp8_format",
            Domain::TorchDtype => "torch dtype",
        }
    }

    pub fn index_of(self, text: &str) -> Option<u16> {
        self.values()
            .iter()
            .position(|v| *v == text)
            .map(|i| i as u16)
    }
}
