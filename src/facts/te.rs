//! The `te` pack family: every field of TransformerEngine 2.20.2's `AttentionParams` under TE's
//! names, the environment the selector reads, and probe facts; how a TE config object is read
//! (window lists, compute capability, versions, structured objects) and TE's derived facts
//! (`sm`, the normalised `window`, `deterministic` from the environment).

use std::sync::LazyLock;

use serde_json::{Map, Value as Json};

use super::domains::Domain;
use super::error::{InputError, InputErrorKind};
use super::schema::{
    Bound, Check, Constraint, DefaultValue as D, Facts, FieldDef, Schema, SelectionFact, Ty,
    bounded, derived, f, fixed, opt, probe, raw_text,
};
use super::value::Value;
use Domain as Dom;

/// The te family's schema (packs `te` and `native`).
pub static TE: LazyLock<Schema> = LazyLock::new(|| {
    Schema::new(
        "te",
        "TransformerEngine 2.20.2 AttentionParams, its environment and live probes",
        FIELDS,
        read_key,
        derive,
        member_default,
    )
    .with_constraints(CONSTRAINTS)
    .with_selection(SELECTION)
});

/// The te family's fact that chooses the pack: the installed TransformerEngine release.
pub static SELECTION: &[SelectionFact] = &[SelectionFact {
    path: "te_version",
    ty: Ty::Version,
    doc: "Installed TransformerEngine release (`transformer_engine.__version__`, e.g. \"2.19.0\"; \
          `--te-version X`). Chooses the pack under `--pack te@auto`: that release's pack, the \
          nearest older one with a warning, or an error before 2.18.0 (docs/packs/releases.md). \
          No rule reads it; other packs ignore it.",
}];

/// The te family is the default one (packs without `family:`, TE's conformance records): its
/// constructors are here, with the family, so that the reader (`input.rs`) names no family.
impl Facts {
    /// Every fact of the `te` family at its default (probes unknown).
    pub fn defaults() -> Facts {
        Facts::defaults_of(&TE)
    }

    /// Reads a `te`-family config object (the `config` of TE conformance records). Other
    /// families: [`Schema::read`]. See `docs/facts.md` for the fields and their defaults.
    pub fn from_json(config: &Json) -> Result<Facts, InputError> {
        Facts::read(&TE, config)
    }
}

/// Every fact. Order is the slot order (and the order of `docs/facts.md`).
pub static FIELDS: &[FieldDef] = &[
    // --- AttentionParams (TE 2.20.2, utils.py:200-355) ---
    f(
        "qkv_type",
        Ty::Enum(Dom::QkvType),
        D::Enum("Tensor"),
        "Python class of the query tensor.",
    ),
    f(
        "qkv_dtype",
        Ty::Enum(Dom::Dtype),
        D::Enum("bf16"),
        "dtype of q (for quantized tensors the nominal dtype).",
    ),
    f(
        "nominal_dtype",
        Ty::Enum(Dom::Dtype),
        D::Null,
        "Model precision of O/dQKV when qkv_dtype is FP8.",
    ),
    f(
        "qkv_layout",
        Ty::Enum(Dom::QkvLayout),
        D::Enum("sbhd_sbhd_sbhd"),
        "Memory layout of q, k, v.",
    ),
    bounded(
        f(
            "batch_size",
            Ty::Int,
            D::Int(1),
            "Batch size (THD: number of sequences).",
        ),
        Bound::Positive,
    ),
    bounded(
        f("num_heads", Ty::Int, D::Int(16), "Query heads."),
        Bound::Positive,
    ),
    bounded(
        f("num_gqa_groups", Ty::Int, D::Int(16), "Key/value heads."),
        Bound::Positive,
    ),
    bounded(
        f(
            "max_seqlen_q",
            Ty::Int,
            D::Int(128),
            "Max query length (bshd/sbhd under CP: multiplied by cp_size).",
        ),
        Bound::Positive,
    ),
    bounded(
        f(
            "max_seqlen_kv",
            Ty::Int,
            D::Int(128),
            "Max key/value length (same CP scaling).",
        ),
        Bound::Positive,
    ),
    bounded(
        f(
            "num_tokens_q",
            Ty::Int,
            D::Int(0),
            "Total query tokens when q is THD, else 0.",
        ),
        Bound::NonNegative,
    ),
    bounded(
        f(
            "num_tokens_kv",
            Ty::Int,
            D::Int(0),
            "Total key/value tokens when kv is THD, else 0.",
        ),
        Bound::NonNegative,
    ),
    bounded(
        f("head_dim_qk", Ty::Int, D::Int(64), "Q/K head size."),
        Bound::Positive,
    ),
    bounded(
        f("head_dim_v", Ty::Int, D::Int(64), "V head size."),
        Bound::Positive,
    ),
    f(
        "attn_mask_type",
        Ty::Enum(Dom::AttnMaskType),
        D::Enum("no_mask"),
        "Mask kind.",
    ),
    f(
        "window_size",
        Ty::Object,
        D::Null,
        "Sliding window [left, right] as given (-1 = unbounded); null = none given.",
    ),
    bounded(
        opt(f(
            "window_size.left",
            Ty::Int,
            D::Null,
            "Left bound of the window as given (null when window_size is null).",
        )),
        Bound::AtLeast(-1),
    ),
    bounded(
        opt(f(
            "window_size.right",
            Ty::Int,
            D::Null,
            "Right bound of the window as given (null when window_size is null).",
        )),
        Bound::AtLeast(-1),
    ),
    f(
        "bottom_right_diagonal",
        Ty::Bool,
        D::Bool(true),
        "Anchor of the SWA/ALiBi diagonal.",
    ),
    bounded(
        f(
            "softcap",
            Ty::Float,
            D::Float(0.0),
            "tanh logit soft-capping; 0 = off.",
        ),
        Bound::NonNegative,
    ),
    f(
        "alibi_slopes_shape",
        Ty::Object,
        D::Null,
        "Shape of user ALiBi slopes ([H] or [B, H]); null = default slopes.",
    ),
    opt(f(
        "alibi_slopes_shape.len",
        Ty::Int,
        D::Null,
        "Rank of alibi_slopes_shape.",
    )),
    f(
        "core_attention_bias_type",
        Ty::Enum(Dom::BiasType),
        D::Enum("no_bias"),
        "Bias kind.",
    ),
    f(
        "core_attention_bias_shape",
        Ty::Object,
        D::Null,
        "Shape [b, h, s_q, s_kv] of the bias tensor; null = none.",
    ),
    bounded(
        opt(f(
            "core_attention_bias_shape.b",
            Ty::Int,
            D::Null,
            "Bias batch dimension.",
        )),
        Bound::Positive,
    ),
    bounded(
        opt(f(
            "core_attention_bias_shape.h",
            Ty::Int,
            D::Null,
            "Bias head dimension.",
        )),
        Bound::Positive,
    ),
    bounded(
        opt(f(
            "core_attention_bias_shape.s_q",
            Ty::Int,
            D::Null,
            "Bias query-length dimension.",
        )),
        Bound::Positive,
    ),
    bounded(
        opt(f(
            "core_attention_bias_shape.s_kv",
            Ty::Int,
            D::Null,
            "Bias key-length dimension.",
        )),
        Bound::Positive,
    ),
    f(
        "core_attention_bias_requires_grad",
        Ty::Bool,
        D::Bool(true),
        "Whether dBias is needed. Default True (AttentionParams' default, which the conformance corpus leaves in place without a bias; FU.44 reads it).",
    ),
    f(
        "pad_between_seqs",
        Ty::Bool,
        D::Bool(false),
        "THD has gaps between sequences.",
    ),
    bounded(
        f(
            "attention_dropout",
            Ty::Float,
            D::Float(0.0),
            "Dropout probability.",
        ),
        Bound::Probability,
    ),
    f(
        "context_parallel",
        Ty::Bool,
        D::Bool(false),
        "Context parallelism active (cp_size > 1).",
    ),
    f(
        "cp_comm_type",
        Ty::Enum(Dom::CpCommType),
        D::Enum("p2p"),
        "Context-parallel algorithm.",
    ),
    bounded(
        f(
            "cp_size",
            Ty::Int,
            D::Int(1),
            "Total context-parallel group size.",
        ),
        Bound::Positive,
    ),
    bounded(
        f(
            "cp_size_a2a",
            Ty::Int,
            D::Int(1),
            "a2a sub-group size for a2a+p2p.",
        ),
        Bound::Positive,
    ),
    f(
        "deterministic",
        Ty::Bool,
        D::Bool(false),
        "Determinism required. Absent: true iff env NVTE_ALLOW_NONDETERMINISTIC_ALGO is 0 (DPA's derivation).",
    ),
    f(
        "is_training",
        Ty::Bool,
        D::Bool(true),
        "Training mode (backward will run).",
    ),
    f("fp8", Ty::Bool, D::Bool(false), "Inside an FP8 autocast."),
    f(
        "fp8_recipe",
        Ty::Object,
        D::Null,
        "fp8_meta[\"recipe\"]; null = none.",
    ),
    opt(f(
        "fp8_recipe.recipe",
        Ty::Enum(Dom::RecipeKind),
        D::Null,
        "Recipe class.",
    )),
    opt(f(
        "fp8_recipe.fp8_dpa",
        Ty::Bool,
        D::Null,
        "recipe.fp8_dpa: FP8 dot-product attention.",
    )),
    opt(f(
        "fp8_recipe.fp8_mha",
        Ty::Bool,
        D::Null,
        "recipe.fp8_mha: FP8 multi-head attention (implies fp8_dpa in DPA).",
    )),
    opt(f(
        "fp8_recipe.fp8_format",
        Ty::Enum(Dom::Fp8Format),
        D::Null,
        "recipe.fp8_format.",
    )),
    opt(f(
        "fp8_recipe.reduce_amax",
        Ty::Bool,
        D::Null,
        "DelayedScaling.reduce_amax (TE default true).",
    )),
    opt(f(
        "fp8_recipe.local_recipe",
        Ty::Enum(Dom::RecipeKind),
        D::Null,
        "Class of fp8_meta[\"local_recipes\"][0] if present; the FP8 filters read it in place of recipe.",
    )),
    f(
        "inference",
        Ty::Object,
        D::Null,
        "KV cache (inference_params); null = no KV cache.",
    ),
    opt(f(
        "inference.is_paged",
        Ty::Bool,
        D::Null,
        "Paged KV cache.",
    )),
    bounded(
        opt(f(
            "inference.page_size",
            Ty::Int,
            D::Null,
            "Page size (tokens); 0 = not given (a cache that is not paged).",
        )),
        Bound::NonNegative,
    ),
    bounded(
        opt(f(
            "inference.total_num_pages",
            Ty::Int,
            D::Null,
            "Total pages; 0 = not paged.",
        )),
        Bound::NonNegative,
    ),
    bounded(
        opt(f(
            "inference.max_pages_per_seq",
            Ty::Int,
            D::Null,
            "cache_manager.max_pages_per_seq; 0 = not paged.",
        )),
        Bound::NonNegative,
    ),
    f(
        "softmax_type",
        Ty::Enum(Dom::SoftmaxType),
        D::Enum("vanilla"),
        "Softmax variant.",
    ),
    f(
        "return_max_logit",
        Ty::Bool,
        D::Bool(false),
        "Also return the max logit.",
    ),
    f(
        "cuda_graph",
        Ty::Bool,
        D::Bool(false),
        "A CUDA graph is being captured.",
    ),
    bounded(
        f("num_splits", Ty::Int, D::Int(1), "Split-KV count."),
        Bound::Positive,
    ),
    bounded(
        f(
            "softmax_scale",
            Ty::Float,
            D::Null,
            "Scale applied before softmax; null = 1/sqrt(head_dim_qk) (what TE's DotProductAttention uses when none is given).",
        ),
        Bound::Positive,
    ),
    f(
        "fp8_output",
        Ty::Bool,
        D::Bool(false),
        "FP8 output requested.",
    ),
    f(
        "checkpoint_core_attention",
        Ty::Bool,
        D::Bool(false),
        "Recompute core attention in backward.",
    ),
    f(
        "has_score_mod",
        Ty::Bool,
        D::Bool(false),
        "A score_mod callback was given.",
    ),
    f(
        "has_score_mod_bprop",
        Ty::Bool,
        D::Bool(false),
        "A score_mod backward callback was given.",
    ),
    f(
        "is_in_onnx_export_mode",
        Ty::Bool,
        D::Bool(false),
        "ONNX export in progress (unfused FP8 emulation allowed).",
    ),
    // --- Device and libraries ---
    fixed(f(
        "device_compute_capability",
        Ty::Object,
        D::Computed,
        "[major, minor] of the current device. Default [9, 0].",
    )),
    fixed(f(
        "device_compute_capability.major",
        Ty::Int,
        D::Int(9),
        "Compute capability major.",
    )),
    fixed(f(
        "device_compute_capability.minor",
        Ty::Int,
        D::Int(0),
        "Compute capability minor.",
    )),
    fixed(derived(
        "sm",
        Ty::Int,
        "major * 10 + minor (90 = Hopper, 100 = B200, 103 = B300, 120 = RTX Blackwell).",
    )),
    f(
        "cudnn_version",
        Ty::Version,
        D::Version("9.19.0"),
        "cuDNN runtime version ([9, 19, 0] or \"9.19.0\").",
    ),
    f(
        "flash_attn_versions",
        Ty::Object,
        D::Computed,
        "Installed flash-attn packages {v2, v3, v4} (null = not installed).",
    ),
    f(
        "flash_attn_versions.v2",
        Ty::Version,
        D::Null,
        "flash-attn (2.x) version.",
    ),
    f(
        "flash_attn_versions.v3",
        Ty::Version,
        D::Null,
        "flash-attn-3 version.",
    ),
    f(
        "flash_attn_versions.v4",
        Ty::Version,
        D::Null,
        "flash-attn-4 version.",
    ),
    f(
        "flash_attn_versions.fa3_supports_softcap",
        Ty::Bool,
        D::Bool(false),
        "FA3 build exposes softcap in all three entry points.",
    ),
    // FROST's probes report the package metadata's raw string (PR #3527): text that does not
    // parse is a third state, not an error, and defers to the plan-name check (FR.plan).
    raw_text(f(
        "cudnn_frontend_version",
        Ty::Version,
        D::Null,
        "nvidia-cudnn-frontend version; null = not installed; text that does not parse is kept as unparseable (test `parsed(cudnn_frontend_version)`).",
    )),
    raw_text(f(
        "cutlass_dsl_version",
        Ty::Version,
        D::Null,
        "nvidia-cutlass-dsl version; null = not installed; text that does not parse is kept as unparseable (test `parsed(cutlass_dsl_version)`).",
    )),
    // --- Environment switches (integers, as TE reads them; null = not set) ---
    f(
        "env",
        Ty::Object,
        D::Computed,
        "Environment variables the selector reads.",
    ),
    opt(f(
        "env.NVTE_FLASH_ATTN",
        Ty::Int,
        D::Null,
        "0 turns off every FlashAttention version (default 1).",
    )),
    opt(f(
        "env.NVTE_FLASH_ATTN_V2",
        Ty::Int,
        D::Null,
        "0 turns off FlashAttention 2.",
    )),
    opt(f(
        "env.NVTE_FLASH_ATTN_V3",
        Ty::Int,
        D::Null,
        "0 turns off FlashAttention 3.",
    )),
    opt(f(
        "env.NVTE_FLASH_ATTN_V4",
        Ty::Int,
        D::Null,
        "0 turns off FlashAttention 4.",
    )),
    opt(f(
        "env.NVTE_FUSED_ATTN",
        Ty::Int,
        D::Null,
        "0 turns off FusedAttention.",
    )),
    opt(f(
        "env.NVTE_UNFUSED_ATTN",
        Ty::Int,
        D::Null,
        "0 turns off UnfusedDotProductAttention.",
    )),
    opt(f(
        "env.NVTE_FROST_ATTN",
        Ty::Int,
        D::Null,
        "0 turns off FrostAttention.",
    )),
    opt(f(
        "env.NVTE_ALLOW_NONDETERMINISTIC_ALGO",
        Ty::Int,
        D::Null,
        "0 makes `deterministic` true when it is not given.",
    )),
    opt(f(
        "env.NVTE_UnfusedDPA_Emulate_FP8",
        Ty::Int,
        D::Null,
        "1 lets unfused attention emulate FP8.",
    )),
    opt(f(
        "env.NVTE_DPA_FP8CS_O_in_F16",
        Ty::Int,
        D::Null,
        "Output dtype of FP8 current scaling (default 1).",
    )),
    opt(f(
        "env.NVTE_FP8_DPA_BWD",
        Ty::Int,
        D::Null,
        "FP8 backward for DPA (logged only).",
    )),
    opt(f(
        "env.CUDNN_FRONTEND_ENABLE_FROST_ENGINES",
        Ty::Int,
        D::Null,
        "0 disables cuDNN FROST engines.",
    )),
    opt(f(
        "env.NVTE_FROST_TEST_REQUIRED",
        Ty::Int,
        D::Null,
        "Test-only: a missing FROST fails tests; no effect on selection.",
    )),
    // --- Derived ---
    derived(
        "window.left",
        Ty::Int,
        "window_size.left, or the default for the mask when window_size is null (-1).",
    ),
    derived(
        "window.right",
        Ty::Int,
        "window_size.right, or the default for the mask when null: 0 for causal masks, -1 otherwise.",
    ),
    // --- Probes (answered by live adapters; unknown otherwise) ---
    probe(
        "probe.cuda_device",
        "A usable CUDA GPU and driver are present (and the build has the `cuda` feature).",
    ),
    probe(
        "probe.fused_attn_graph",
        "cuDNN can build the FusedAttention graph (forward, and backward when training) on this GPU.",
    ),
    probe(
        "probe.frost_plan",
        "cuDNN frontend returns a FROST plan (checked by name) for this graph on this GPU.",
    ),
];

/// The pip package each library-version fact describes (`why-not` names the package to
/// install, not the fact).
pub const PACKAGES: &[(&str, &str)] = &[
    ("flash_attn_versions.v2", "flash-attn"),
    ("flash_attn_versions.v3", "flash-attn-3"),
    ("flash_attn_versions.v4", "flash-attn-4"),
    ("cudnn_frontend_version", "nvidia-cudnn-frontend"),
    ("cutlass_dsl_version", "nvidia-cutlass-dsl"),
];

/// Compute capabilities of NVIDIA GPUs (CUDA 12 and 13: Maxwell sm50 to Blackwell sm121), as
/// `(major, minor)`; the `compute_capability_exists` constraint's doc lists them (a test keeps
/// the two equal). A config naming another one describes no GPU.
pub const COMPUTE_CAPABILITIES: &[(i64, i64)] = &[
    (5, 0),
    (5, 2),
    (5, 3),
    (6, 0),
    (6, 1),
    (6, 2),
    (7, 0),
    (7, 2),
    (7, 5),
    (8, 0),
    (8, 6),
    (8, 7),
    (8, 9),
    (9, 0),
    (10, 0),
    (10, 1),
    (10, 3),
    (11, 0),
    (12, 0),
    (12, 1),
];

/// Constraints across te facts: what TransformerEngine refuses before its selector runs.
pub static CONSTRAINTS: &[Constraint] = &[
    Constraint {
        name: "kv_heads_divide_heads",
        doc: "`num_gqa_groups <= num_heads` and `num_heads % num_gqa_groups == 0`: \
              DotProductAttention asserts it in its constructor, so the selector never sees \
              other head counts.",
        facts: &["num_gqa_groups", "num_heads"],
        check: Check::Refuse(kv_heads_divide_heads),
        expr: "num_gqa_groups <= num_heads and num_heads % num_gqa_groups == 0",
        // Tying the two head counts multiplies the te pack's diagrams several times over.
        searched: false,
    },
    Constraint {
        name: "compute_capability_exists",
        doc: "`device_compute_capability` is one a GPU has: 5.0, 5.2, 5.3, 6.0, 6.1, 6.2, 7.0, \
              7.2, 7.5, 8.0, 8.6, 8.7, 8.9, 9.0, 10.0, 10.1, 10.3, 11.0, 12.0, 12.1 \
              (`--sm 90` is 9.0).",
        facts: &["device_compute_capability"],
        check: Check::Refuse(compute_capability_exists),
        expr: "sm in [50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 103, 110, 120, 121]",
        searched: true,
    },
    Constraint {
        name: "window_fits_mask",
        doc: "A window TE's `check_set_window_size` accepts for the mask (DotProductAttention \
              calls it before the selector): with a causal mask not `(-1, r)` for `r >= 1`; \
              otherwise neither `(-1, r)` for `r >= 1` nor `(l, -1)` for `l >= 0`. \
              (Windows TE rewrites with a warning, such as `(-1, -1)` under a causal mask, \
              reach the selector as given.)",
        facts: &["window_size", "attn_mask_type"],
        check: Check::Refuse(window_fits_mask),
        expr: "window_size == null or not ((window_size.left == -1 and window_size.right >= 1) \
               or (attn_mask_type in [\"no_mask\", \"padding\", \"arbitrary\"] \
               and window_size.left >= 0 and window_size.right == -1))",
        searched: true,
    },
    Constraint {
        name: "paged_cache_has_pages",
        doc: "A paged KV cache (`inference.is_paged`) has `page_size`, `total_num_pages` and \
              `max_pages_per_seq` >= 1 (0 means \"not given\" only without paging).",
        facts: &["inference"],
        check: Check::Refuse(paged_cache_has_pages),
        expr: "inference == null or not inference.is_paged or (inference.page_size >= 1 \
               and inference.total_num_pages >= 1 and inference.max_pages_per_seq >= 1)",
        searched: true,
    },
];

fn kv_heads_divide_heads(facts: &Facts) -> Option<String> {
    let (h, g) = (facts.int("num_heads")?, facts.int("num_gqa_groups")?);
    if g > h {
        Some(format!(
            "{g} KV heads exceed {h} query heads (num_heads): TE's DotProductAttention asserts \
             num_heads % num_gqa_groups == 0"
        ))
    } else if g > 0 && h % g != 0 {
        Some(format!(
            "{g} KV heads do not divide {h} query heads (num_heads): TE's DotProductAttention \
             asserts num_heads % num_gqa_groups == 0"
        ))
    } else {
        None
    }
}

fn compute_capability_exists(facts: &Facts) -> Option<String> {
    let major = facts.int("device_compute_capability.major")?;
    let minor = facts.int("device_compute_capability.minor")?;
    if COMPUTE_CAPABILITIES.contains(&(major, minor)) {
        return None;
    }
    let known: Vec<String> = COMPUTE_CAPABILITIES
        .iter()
        .map(|(a, b)| format!("{a}.{b}"))
        .collect();
    Some(format!(
        "{major}.{minor} (sm{}) is not the compute capability of any GPU; known: {}",
        major * 10 + minor,
        known.join(", ")
    ))
}

fn window_fits_mask(facts: &Facts) -> Option<String> {
    let (l, r) = (
        facts.int("window_size.left")?,
        facts.int("window_size.right")?,
    );
    let mask = facts.text("attn_mask_type").unwrap_or("no_mask");
    let causal = mask.contains("causal");
    let bad = (l == -1 && r >= 1) || (!causal && l >= 0 && r == -1);
    bad.then(|| {
        format!(
            "window [{l}, {r}] does not fit attn_mask_type `{mask}`: TE's check_set_window_size \
             asserts {}",
            if causal {
                "(-1, 0) or (>=0, 0) for a causal mask"
            } else {
                "(-1, -1) or (>=0, >=0) for a mask without causality"
            }
        )
    })
}

fn paged_cache_has_pages(facts: &Facts) -> Option<String> {
    if facts.get("inference.is_paged") != Some(Value::Bool(true)) {
        return None;
    }
    ["page_size", "total_num_pages", "max_pages_per_seq"]
        .into_iter()
        .find(|m| facts.int(&format!("inference.{m}")).is_some_and(|v| v < 1))
        .map(|m| format!("a paged KV cache needs inference.{m} >= 1"))
}

/// Slot of a te-family fact path (for code that only ever reads te facts: the analysis space's
/// TE derivations).
pub fn slot(path: &str) -> Option<usize> {
    TE.slot(path)
}

/// TE's structured keys; everything else is a scalar fact.
fn read_key(facts: &mut Facts, key: &str, value: &Json) -> Result<bool, InputError> {
    match key {
        "window_size" => facts.set_int_list(key, value, &["left", "right"], Some(2))?,
        "core_attention_bias_shape" => {
            facts.set_int_list(key, value, &["b", "h", "s_q", "s_kv"], Some(4))?
        }
        "alibi_slopes_shape" => {
            if let Some(bad) = value
                .as_array()
                .and_then(|a| a.iter().position(|x| x.as_i64().is_some_and(|n| n < 1)))
            {
                return Err(InputError::new(
                    &format!("alibi_slopes_shape[{bad}]"),
                    "a tensor dimension must be > 0",
                )
                .kind(InputErrorKind::Domain));
            }
            let n = value.as_array().map(|a| a.len());
            facts.set_int_list(key, value, &[], None)?;
            if let Some(n) = n {
                facts.put("alibi_slopes_shape.len", Value::Int(n as i64));
            }
        }
        "device_compute_capability" => facts.set_compute_capability(key, value)?,
        "cudnn_version" => facts.set_version(key, value, true)?,
        "fp8_recipe" | "inference" => facts.set_object(key, value, true)?,
        "flash_attn_versions" => facts.set_object(key, value, false)?,
        "env" => facts.set_env(key, value)?,
        _ => return Ok(false),
    }
    Ok(true)
}

/// Members of a present `fp8_recipe` / `inference` object start from TE's defaults.
fn member_default(object: &str, member: &str) -> Value {
    match (object, member) {
        ("fp8_recipe", "fp8_dpa" | "fp8_mha") => Value::Bool(false),
        ("fp8_recipe", "reduce_amax") => Value::Bool(true),
        ("inference", "is_paged") => Value::Bool(false),
        ("inference", _) => Value::Int(0),
        _ => Value::Null,
    }
}

/// TE's derived facts. `deterministic`, when not given, follows DPA's derivation from
/// NVTE_ALLOW_NONDETERMINISTIC_ALGO.
fn derive(facts: &mut Facts, given: &Map<String, Json>) {
    let major = facts.int("device_compute_capability.major").unwrap_or(0);
    let minor = facts.int("device_compute_capability.minor").unwrap_or(0);
    facts.put("device_compute_capability", Value::Bool(true));
    facts.put("flash_attn_versions", Value::Bool(true));
    facts.put("env", Value::Bool(true));
    facts.put("sm", Value::Int(major * 10 + minor));
    if !given.contains_key("deterministic") {
        let det = facts.int("env.NVTE_ALLOW_NONDETERMINISTIC_ALGO") == Some(0);
        facts.put("deterministic", Value::Bool(det));
    }
    // TE normalises only an absent window (check_set_window_size when window_size is None).
    let causal = facts
        .text("attn_mask_type")
        .is_some_and(|m| m.contains("causal"));
    let (left, right) = match (
        facts.int("window_size.left"),
        facts.int("window_size.right"),
    ) {
        (Some(l), Some(r)) => (l, r),
        _ => (-1, if causal { 0 } else { -1 }),
    };
    facts.put("window.left", Value::Int(left));
    facts.put("window.right", Value::Int(right));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lang::Version;
    use serde_json::json;

    /// `te_version` chooses the pack (`te@auto`): read and checked, but it has no slot, so a
    /// config holding it reads as the same facts as one without it.
    #[test]
    fn te_version_chooses_the_pack_and_sets_no_fact() {
        let plain = Facts::from_json(&json!({"head_dim_qk": 64})).unwrap();
        for v in [json!("2.19.0"), json!(2.19), json!(null), json!("garbage")] {
            let with = Facts::from_json(&json!({"head_dim_qk": 64, "te_version": v})).unwrap();
            assert_eq!(with, plain, "{v}");
        }
        let e = Facts::from_json(&json!({"te_version": [2, 19, 0]})).unwrap_err();
        assert_eq!(e.path, "te_version");
        assert!(TE.slot("te_version").is_none());
        assert_eq!(
            TE.selection_value(&json!({"te_version": "2.19.5"}), "te_version")
                .unwrap()
                .as_deref(),
            Some("2.19.5")
        );
    }

    /// A version fact whose probe reports the raw string has three states: absent (null),
    /// parsed, and present but unparseable (raw text kept). Other version facts have two.
    #[test]
    fn raw_text_versions_have_three_states() {
        let slot = super::slot("cudnn_frontend_version").unwrap();
        let read = |v: Json| Facts::from_json(&json!({ "cudnn_frontend_version": v }));
        let absent = Facts::from_json(&json!({})).unwrap();
        assert_eq!(absent.values()[slot], Value::Null);
        assert_eq!(read(Json::Null).unwrap().values()[slot], Value::Null);
        let parsed = read(json!("1.29.0rc1")).unwrap();
        assert_eq!(
            parsed.values()[slot],
            Value::Version(Version::parse("1.29.0rc1").unwrap())
        );
        assert_eq!(parsed.raw_version(slot), None);
        for raw in ["not-a-version", "1.29.x-custom", ""] {
            let f = read(json!(raw)).unwrap_or_else(|e| panic!("{raw:?}: {e}"));
            assert_eq!(f.values()[slot], Value::BadVersion, "{raw:?}");
            assert_eq!(f.raw_version(slot), Some(raw));
        }
        let dsl = super::slot("cutlass_dsl_version").unwrap();
        let f = Facts::from_json(&json!({"cutlass_dsl_version": "4.7-git"})).unwrap();
        assert_eq!(
            (f.values()[dsl], f.raw_version(dsl)),
            (Value::BadVersion, Some("4.7-git"))
        );
        // The three states are three fact sets: the cache tells them apart.
        let bad = read(json!("x")).unwrap();
        let other_bad = read(json!("y")).unwrap();
        assert_ne!(bad, absent);
        assert_ne!(bad, other_bad);
        // Setting the fact again drops the raw text of the old value.
        let mut f = bad.clone();
        f.set_scalar("cudnn_frontend_version", &json!("1.30.0"))
            .unwrap();
        assert_eq!(f.raw_version(slot), None);
        assert_eq!(f.values()[slot], Value::Version(Version::new(1, 30, 0)));
        let mut f = bad;
        f.set_scalar("cudnn_frontend_version", &Json::Null).unwrap();
        assert_eq!((f.values()[slot], f.raw_version(slot)), (Value::Null, None));
        // Wrong JSON types stay refused.
        for v in [
            json!(129),
            json!([1, 29, 0]),
            json!({"v": "1.29.0"}),
            json!(true),
        ] {
            let e = read(v.clone()).expect_err(&v.to_string());
            assert_eq!(
                (e.kind, e.path.as_str()),
                (InputErrorKind::Type, "cudnn_frontend_version"),
                "{v}"
            );
        }
        // Facts whose selector parses (or reads as numbers) keep refusing words.
        for (config, path) in [
            (json!({"cudnn_version": "9.x"}), "cudnn_version"),
            (
                json!({"flash_attn_versions": {"v4": "4.0.0-custom"}}),
                "flash_attn_versions.v4",
            ),
        ] {
            let e = Facts::from_json(&config).expect_err(&config.to_string());
            assert_eq!((e.kind, e.path.as_str()), (InputErrorKind::Domain, path));
        }
    }

    #[test]
    fn the_compute_capability_doc_lists_the_table() {
        let doc = CONSTRAINTS
            .iter()
            .find(|c| c.name == "compute_capability_exists")
            .unwrap()
            .doc;
        let listed: Vec<String> = COMPUTE_CAPABILITIES
            .iter()
            .map(|(a, b)| format!("{a}.{b}"))
            .collect();
        assert!(doc.contains(&listed.join(", ")), "{doc}");
    }
}
