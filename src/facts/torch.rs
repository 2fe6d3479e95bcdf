//! The `torch` pack family: the inputs of PyTorch 2.11's SDPA backend choice on CUDA
//! (`torch._fused_sdp_choice`): the fields of `sdp::sdp_params` (query, key, value, attn_mask,
//! dropout, is_causal, enable_gqa) as the checks of `sdp_utils.cpp` / `sdp_utils_cpp.h` read
//! them, the process state those checks consult (the `torch.backends.cuda.*_sdp_enabled`
//! flags, deterministic algorithms, grad mode, two environment variables) and the device and
//! build (compute capability, cuDNN runtime version).
//!
//! How a config names the device: as conformance records do, `torch: {version, cudnn, sm}`
//! (`cudnn` as PyTorch's integer `91900` or `"9.19.0"`, `sm` as `"90"`), or with the facts
//! themselves (`sm`, `cudnn_version`, `torch_version`); naming one fact both ways is an error.
//! Two shorthands of the conformance corpus are read too: `layout` (`bhsd`, `bshd_view`,
//! `noncontig_lastdim`: the last-dimension strides of q, k and v) and `attn_mask` given as a
//! kind (`bool`, `bool_bcast`, `float`: its dtype and shape follow from the query).

use std::sync::LazyLock;

use serde_json::{Map, Value as Json};

use super::domains::Domain;
use super::error::{InputError, did_you_mean};
use super::schema::{
    Bound, Check, Constraint, DefaultValue as D, Facts, FieldDef, Schema, Ty, bounded, f, fixed,
    opt,
};
use super::value::Value;
use crate::lang::Version;
use Domain as Dom;

/// The torch family's schema (pack `torch`).
pub static TORCH: LazyLock<Schema> = LazyLock::new(|| {
    Schema::new(
        "torch",
        "PyTorch 2.11 scaled_dot_product_attention on CUDA: sdp_params, the SDPA flags, the device",
        FIELDS,
        read_key,
        derive,
        |_, _| Value::Null,
    )
    .with_check(check)
    .with_constraints(CONSTRAINTS)
});

/// Every fact. Order is the slot order (and the order of the facts table).
pub static FIELDS: &[FieldDef] = &[
    // --- query, key, value: sizes as [batch, heads, seqlen, head_dim] ---
    f(
        "dtype",
        Ty::Enum(Dom::TorchDtype),
        D::Enum("bf16"),
        "dtype of the query (`other`: a dtype none of SDPA's lists names).",
    ),
    f(
        "dtype_k",
        Ty::Enum(Dom::TorchDtype),
        D::Computed,
        "dtype of the key. Absent: `dtype`.",
    ),
    f(
        "dtype_v",
        Ty::Enum(Dom::TorchDtype),
        D::Computed,
        "dtype of the value. Absent: `dtype`.",
    ),
    bounded(
        f("batch", Ty::Int, D::Int(1), "query.size(0)."),
        Bound::NonNegative,
    ),
    bounded(
        f(
            "batch_k",
            Ty::Int,
            D::Computed,
            "key.size(0). Absent: `batch`.",
        ),
        Bound::NonNegative,
    ),
    bounded(
        f(
            "batch_v",
            Ty::Int,
            D::Computed,
            "value.size(0). Absent: `batch`.",
        ),
        Bound::NonNegative,
    ),
    bounded(
        f(
            "heads_q",
            Ty::Int,
            D::Int(16),
            "query.size(-3): query heads.",
        ),
        Bound::Positive,
    ),
    bounded(
        f(
            "heads_kv",
            Ty::Int,
            D::Int(16),
            "key.size(-3): key heads (GQA: fewer than heads_q).",
        ),
        Bound::Positive,
    ),
    bounded(
        f(
            "heads_v",
            Ty::Int,
            D::Computed,
            "value.size(-3). Absent: `heads_kv`.",
        ),
        Bound::Positive,
    ),
    bounded(
        f("seqlen_q", Ty::Int, D::Int(128), "query.size(-2)."),
        Bound::NonNegative,
    ),
    bounded(
        f("seqlen_kv", Ty::Int, D::Int(128), "key.size(-2)."),
        Bound::NonNegative,
    ),
    bounded(
        f("head_dim_qk", Ty::Int, D::Int(64), "query.size(-1)."),
        Bound::NonNegative,
    ),
    bounded(
        f(
            "head_dim_k",
            Ty::Int,
            D::Computed,
            "key.size(-1). Absent: `head_dim_qk`.",
        ),
        Bound::NonNegative,
    ),
    bounded(
        f("head_dim_v", Ty::Int, D::Int(64), "value.size(-1)."),
        Bound::NonNegative,
    ),
    bounded(
        f("dim_q", Ty::Int, D::Int(4), "query.dim()."),
        Bound::NonNegative,
    ),
    bounded(
        f("dim_k", Ty::Int, D::Int(4), "key.dim()."),
        Bound::NonNegative,
    ),
    bounded(
        f("dim_v", Ty::Int, D::Int(4), "value.dim()."),
        Bound::NonNegative,
    ),
    f(
        "stride_last_q",
        Ty::Int,
        D::Computed,
        "query.stride(-1). Absent: from `layout` (2 for noncontig_lastdim, else 1).",
    ),
    f(
        "stride_last_k",
        Ty::Int,
        D::Computed,
        "key.stride(-1). Absent: `stride_last_q`.",
    ),
    f(
        "stride_last_v",
        Ty::Int,
        D::Computed,
        "value.stride(-1). Absent: `stride_last_q`.",
    ),
    f(
        "requires_grad",
        Ty::Bool,
        D::Bool(false),
        "query, key or value requires grad.",
    ),
    f(
        "grad_enabled",
        Ty::Bool,
        D::Bool(true),
        "torch.is_grad_enabled(): with requires_grad, the call needs a backward (input_requires_grad).",
    ),
    f(
        "nested",
        Ty::Bool,
        D::Bool(false),
        "query, key and value are nested tensors of strided layout (jagged nested tensors take PyTorch's Python path and are not modelled).",
    ),
    bounded(
        f(
            "nested_min_seqlen",
            Ty::Int,
            D::Int(1),
            "Nested inputs: the shortest sequence of query, key and value.",
        ),
        Bound::NonNegative,
    ),
    f(
        "nested_ragged_heads",
        Ty::Bool,
        D::Bool(false),
        "Nested inputs: a tensor whose num_heads differ between its sequences.",
    ),
    f(
        "nested_seqlen_k_ragged",
        Ty::Bool,
        D::Bool(false),
        "Nested inputs: the key's sequences differ in length.",
    ),
    f(
        "nested_seqlen_v_ragged",
        Ty::Bool,
        D::Bool(false),
        "Nested inputs: the value's sequences differ in length.",
    ),
    // --- attn_mask ---
    f(
        "attn_mask",
        Ty::Object,
        D::Null,
        "The attn_mask tensor; null = none. A kind (bool: [b, hq, sq, skv] bool; bool_bcast: [1, 1, sq, skv] bool; float: [b, 1, sq, skv] in the query dtype) or {dtype, shape, stride_last, requires_grad} (absent members: bool, [b, hq, sq, skv], 1, false).",
    ),
    opt(f(
        "attn_mask.dtype",
        Ty::Enum(Dom::TorchDtype),
        D::Null,
        "Mask dtype.",
    )),
    opt(f(
        "attn_mask.dim",
        Ty::Int,
        D::Null,
        "attn_mask.dim() (at least 2).",
    )),
    opt(f(
        "attn_mask.b",
        Ty::Int,
        D::Null,
        "attn_mask.size(0) of a 4-d mask.",
    )),
    opt(f(
        "attn_mask.h",
        Ty::Int,
        D::Null,
        "attn_mask.size(1) of a 4-d mask.",
    )),
    opt(f("attn_mask.s_q", Ty::Int, D::Null, "attn_mask.size(-2).")),
    opt(f("attn_mask.s_kv", Ty::Int, D::Null, "attn_mask.size(-1).")),
    opt(f(
        "attn_mask.stride_last",
        Ty::Int,
        D::Null,
        "attn_mask.stride(-1).",
    )),
    opt(f(
        "attn_mask.requires_grad",
        Ty::Bool,
        D::Null,
        "The mask requires grad.",
    )),
    // --- the other arguments ---
    bounded(
        f(
            "dropout_p",
            Ty::Float,
            D::Float(0.0),
            "Dropout probability.",
        ),
        Bound::Probability,
    ),
    f("is_causal", Ty::Bool, D::Bool(false), "is_causal argument."),
    f(
        "enable_gqa",
        Ty::Bool,
        D::Bool(false),
        "enable_gqa argument (grouped-query attention).",
    ),
    f(
        "scale",
        Ty::Float,
        D::Null,
        "Softmax scale; null = 1/sqrt(head_dim). No check reads it.",
    ),
    // --- process state ---
    f(
        "flash_sdp_enabled",
        Ty::Bool,
        D::Bool(true),
        "torch.backends.cuda.flash_sdp_enabled().",
    ),
    f(
        "mem_efficient_sdp_enabled",
        Ty::Bool,
        D::Bool(true),
        "torch.backends.cuda.mem_efficient_sdp_enabled().",
    ),
    f(
        "math_sdp_enabled",
        Ty::Bool,
        D::Bool(true),
        "torch.backends.cuda.math_sdp_enabled().",
    ),
    f(
        "cudnn_sdp_enabled",
        Ty::Bool,
        D::Bool(true),
        "torch.backends.cuda.cudnn_sdp_enabled().",
    ),
    f(
        "fa3_sdp_enabled",
        Ty::Bool,
        D::Bool(false),
        "FlashAttention 3 activated for the flash backend (Context::userEnabledFA3SDP): flash then takes fp8_e4m3fn on sm90+.",
    ),
    f(
        "deterministic",
        Ty::Bool,
        D::Bool(false),
        "torch.are_deterministic_algorithms_enabled().",
    ),
    f(
        "deterministic_warn_only",
        Ty::Bool,
        D::Bool(false),
        "torch.is_deterministic_algorithms_warn_only_enabled().",
    ),
    f(
        "env",
        Ty::Object,
        D::Computed,
        "Environment variables SDPA reads (c10::utils::check_env: only \"1\" is true, other values are ignored).",
    ),
    f(
        "env.TORCH_CUDNN_SDPA_DEPRIORITIZED",
        Ty::Bool,
        D::Bool(false),
        "Set to 1: cuDNN keeps its place after math in the priority order.",
    ),
    f(
        "env.TORCH_CUDNN_SDPA_NESTED_TENSOR_ENABLED",
        Ty::Bool,
        D::Bool(false),
        "Set to 1: cuDNN accepts nested inputs (experimental).",
    ),
    // --- device and build ---
    fixed(f(
        "sm",
        Ty::Int,
        D::Int(90),
        "Compute capability of the current device, major * 10 + minor (80 A100, 90 H100/H200, 100 B200, 103 B300, 120 RTX Blackwell).",
    )),
    opt(f(
        "cudnn_version",
        Ty::Version,
        D::Version("9.19.0"),
        "cuDNN runtime version (versionRuntimeCuDNN: 91900 or \"9.19.0\"); null = a build without cuDNN.",
    )),
    f(
        "torch_version",
        Ty::Version,
        D::Version("2.11.0"),
        "PyTorch version. The pack models 2.11; no rule reads it.",
    ),
];

/// Constraints across torch facts. PyTorch's SDPA judges head counts itself (its checks answer
/// with a backend or an error), so those stay inputs for the rules; only a device no GPU is
/// refused when read.
pub static CONSTRAINTS: &[Constraint] = &[
    Constraint {
        name: "compute_capability_exists",
        doc: "`sm` is the compute capability of a GPU (the te family's list: 50, 52, 53, 60, \
              61, 62, 70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 103, 110, 120, 121).",
        facts: &["sm"],
        check: Check::Refuse(compute_capability_exists),
        expr: "sm in [50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 103, 110, 120, 121]",
        searched: false,
    },
    Constraint {
        name: "kv_heads_divide_heads",
        doc: "`heads_q % heads_kv == 0` for grouped-query attention: SDPA's \
              `check_grouped_query_attention` (and the math path's own check) decides such \
              inputs, so the pack's rules decline them with PyTorch's reason.",
        facts: &["heads_kv", "heads_q"],
        check: Check::DecidedBySelector,
        expr: "heads_q % heads_kv == 0",
        searched: false,
    },
];

fn compute_capability_exists(facts: &Facts) -> Option<String> {
    let sm = facts.int("sm")?;
    if super::te::COMPUTE_CAPABILITIES
        .iter()
        .any(|(a, b)| a * 10 + b == sm)
    {
        return None;
    }
    let known: Vec<String> = super::te::COMPUTE_CAPABILITIES
        .iter()
        .map(|(a, b)| (a * 10 + b).to_string())
        .collect();
    Some(format!(
        "sm{sm} is not the compute capability of any GPU; known: {}",
        known.join(", ")
    ))
}

/// The `layout` shorthand's values and the last-dimension stride each gives q, k and v.
const LAYOUTS: &[(&str, i64)] = &[("bhsd", 1), ("bshd_view", 1), ("noncontig_lastdim", 2)];

/// The `attn_mask` kinds of the conformance corpus (README.torch.md).
const MASK_KINDS: &[&str] = &["bool", "bool_bcast", "float"];

/// Members of the `attn_mask` object form (besides `shape`).
const MASK_MEMBERS: &[&str] = &[
    "dtype",
    "dim",
    "b",
    "h",
    "s_q",
    "s_kv",
    "stride_last",
    "requires_grad",
];

fn suggest(mut e: InputError, word: &str, candidates: &[&str]) -> InputError {
    e.suggestion = did_you_mean(word, candidates.iter().copied());
    e
}

/// Whole-config checks: the device named once, shorthands with known values (sizes are the
/// facts' bounds, checked once the config is read).
fn check(given: &Map<String, Json>) -> Result<(), InputError> {
    if let Some(torch) = given.get("torch").and_then(Json::as_object) {
        for (member, fact) in [
            ("sm", "sm"),
            ("cudnn", "cudnn_version"),
            ("version", "torch_version"),
        ] {
            if torch.contains_key(member) && given.contains_key(fact) {
                return Err(InputError::new(
                    fact,
                    format!("given twice: as `{fact}` and as `torch.{member}`; keep one"),
                ));
            }
        }
    }
    if let Some(v) = given.get("layout") {
        let text = v.as_str().unwrap_or_default();
        if !LAYOUTS.iter().any(|(l, _)| *l == text) {
            let names: Vec<&str> = LAYOUTS.iter().map(|(l, _)| *l).collect();
            return Err(suggest(
                InputError::new(
                    "layout",
                    format!("expected one of {}, found {v}", names.join(", ")),
                ),
                text,
                &names,
            ));
        }
    }
    if let Some(Json::String(kind)) = given.get("attn_mask")
        && !MASK_KINDS.contains(&kind.as_str())
    {
        return Err(suggest(
            InputError::new(
                "attn_mask",
                format!(
                    "unknown mask kind `{kind}`; expected null, one of {} or an object {{dtype, shape, stride_last, requires_grad}}",
                    MASK_KINDS.join(", ")
                ),
            ),
            kind,
            MASK_KINDS,
        ));
    }
    Ok(())
}

/// The family's structured keys; everything else is a scalar fact.
fn read_key(facts: &mut Facts, key: &str, value: &Json) -> Result<bool, InputError> {
    match key {
        "torch" => read_torch(facts, value)?,
        "sm" => {
            let sm = sm_from("sm", value)?;
            facts.put("sm", Value::Int(sm));
        }
        "cudnn_version" => set_cudnn(facts, "cudnn_version", value)?,
        "torch_version" => set_torch_version(facts, "torch_version", value)?,
        // Checked in `check`, expanded in `derive` (explicit strides win).
        "layout" => {}
        "attn_mask" => read_mask(facts, value)?,
        "env" => read_env(facts, value)?,
        _ => return Ok(false),
    }
    Ok(true)
}

/// The `torch` object of conformance records: `{version, cudnn, sm}`.
fn read_torch(facts: &mut Facts, value: &Json) -> Result<(), InputError> {
    let obj = value.as_object().ok_or_else(|| {
        InputError::new(
            "torch",
            format!("expected an object {{version, cudnn, sm}}, found {value}"),
        )
    })?;
    for (k, v) in obj {
        match k.as_str() {
            "sm" => {
                let sm = sm_from("torch.sm", v)?;
                facts.put("sm", Value::Int(sm));
            }
            "cudnn" => set_cudnn(facts, "cudnn_version", v)?,
            "version" => set_torch_version(facts, "torch_version", v)?,
            other => {
                return Err(suggest(
                    InputError::new(&format!("torch.{other}"), "unknown field"),
                    other,
                    &["version", "cudnn", "sm"],
                ));
            }
        }
    }
    Ok(())
}

/// A compute capability as `90`, `"90"`, `"9.0"`, `"sm90"`, `"sm_90"` or `[9, 0]`.
fn sm_from(path: &str, v: &Json) -> Result<i64, InputError> {
    let bad = || {
        InputError::new(
            path,
            format!(
                "expected a compute capability such as 90, \"90\", \"9.0\" or [9, 0], found {v}"
            ),
        )
    };
    let (major, minor) = match v {
        Json::Number(_) => {
            let n = v.as_i64().ok_or_else(bad)?;
            (n / 10, n % 10)
        }
        Json::String(s) => {
            let t = s.trim();
            let t = t
                .strip_prefix("sm_")
                .or_else(|| t.strip_prefix("sm"))
                .unwrap_or(t);
            match t.split_once('.') {
                Some((a, b)) => (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?),
                None => {
                    let n: i64 = t.parse().map_err(|_| bad())?;
                    (n / 10, n % 10)
                }
            }
        }
        Json::Array(a) if a.len() == 2 => match (a[0].as_i64(), a[1].as_i64()) {
            (Some(x), Some(y)) => (x, y),
            _ => return Err(bad()),
        },
        _ => return Err(bad()),
    };
    if !(1..100).contains(&major) || !(0..10).contains(&minor) {
        return Err(InputError::new(
            path,
            format!("{major}.{minor} is not a compute capability"),
        ));
    }
    Ok(major * 10 + minor)
}

/// cuDNN's version integer as PyTorch reports it: `major*10000 + minor*100 + patch` from 9.0
/// on, `major*1000 + minor*100 + patch` before (8903 = 8.9.3).
pub fn cudnn_from_int(n: u64) -> Version {
    let n = n as u32;
    if n >= 10_000 {
        Version::new(n / 10_000, (n / 100) % 100, n % 100)
    } else {
        Version::new(n / 1000, (n / 100) % 10, n % 100)
    }
}

fn set_cudnn(facts: &mut Facts, path: &str, v: &Json) -> Result<(), InputError> {
    match v {
        Json::Number(_) => {
            let n = v.as_u64().filter(|n| *n < u32::MAX as u64).ok_or_else(|| {
                InputError::new(
                    path,
                    format!("expected a cuDNN version such as 91900, found {v}"),
                )
            })?;
            facts.put(path, Value::Version(cudnn_from_int(n)));
            Ok(())
        }
        _ => facts.set_version(path, v, true),
    }
}

fn set_torch_version(facts: &mut Facts, path: &str, v: &Json) -> Result<(), InputError> {
    if v.is_null() {
        return Err(InputError::new(
            path,
            "must not be null (expected a version)",
        ));
    }
    facts.set_version(path, v, true)
}

/// Environment variables as strings (or booleans / 0 / 1): c10::utils::check_env reads only
/// "1" as set and "0" as unset and ignores every other value, so only "1" is true.
fn read_env(facts: &mut Facts, value: &Json) -> Result<(), InputError> {
    let names = [
        "TORCH_CUDNN_SDPA_DEPRIORITIZED",
        "TORCH_CUDNN_SDPA_NESTED_TENSOR_ENABLED",
    ];
    let obj = value
        .as_object()
        .ok_or_else(|| InputError::new("env", format!("expected an object, found {value}")))?;
    for (k, v) in obj {
        if !names.contains(&k.as_str()) {
            return Err(suggest(
                InputError::new(&format!("env.{k}"), "unknown field"),
                k,
                &names,
            ));
        }
        let set = match v {
            Json::Bool(b) => *b,
            Json::Number(n) => n.as_i64() == Some(1),
            Json::String(s) => s == "1",
            Json::Null => false,
            _ => {
                return Err(InputError::new(
                    &format!("env.{k}"),
                    format!("expected a string such as \"1\", found {v}"),
                ));
            }
        };
        facts.put(&format!("env.{k}"), Value::Bool(set));
    }
    Ok(())
}

/// `attn_mask`: null, a corpus kind (expanded in `derive`), or an object of members and/or
/// `shape`; members left out are filled in by `derive`.
fn read_mask(facts: &mut Facts, value: &Json) -> Result<(), InputError> {
    let clear = |facts: &mut Facts| {
        for m in MASK_MEMBERS {
            facts.put(&format!("attn_mask.{m}"), Value::Null);
        }
    };
    match value {
        Json::Null => {
            facts.put("attn_mask", Value::Null);
            clear(facts);
            Ok(())
        }
        // Kinds are checked in `check` and expanded in `derive`.
        Json::String(_) => {
            facts.put("attn_mask", Value::Bool(true));
            clear(facts);
            Ok(())
        }
        Json::Object(obj) => {
            facts.put("attn_mask", Value::Bool(true));
            clear(facts);
            if let Some(shape) = obj.get("shape") {
                if let Some(k) = ["dim", "b", "h", "s_q", "s_kv"]
                    .iter()
                    .find(|k| obj.contains_key(**k))
                {
                    return Err(InputError::new(
                        &format!("attn_mask.{k}"),
                        "given twice: as a member and in `shape`; keep one",
                    ));
                }
                let sizes = shape
                    .as_array()
                    .and_then(|a| a.iter().map(Json::as_i64).collect::<Option<Vec<_>>>())
                    .filter(|s| s.iter().all(|n| *n >= 0))
                    .ok_or_else(|| {
                        InputError::new(
                            "attn_mask.shape",
                            format!("expected a list of sizes, found {shape}"),
                        )
                    })?;
                if sizes.len() < 2 {
                    return Err(InputError::new(
                        "attn_mask.shape",
                        format!(
                            "a mask has at least 2 dimensions (PyTorch reads size(-2)), found {}",
                            sizes.len()
                        ),
                    ));
                }
                let n = sizes.len();
                facts.put("attn_mask.dim", Value::Int(n as i64));
                facts.put("attn_mask.s_q", Value::Int(sizes[n - 2]));
                facts.put("attn_mask.s_kv", Value::Int(sizes[n - 1]));
                if n == 4 {
                    facts.put("attn_mask.b", Value::Int(sizes[0]));
                    facts.put("attn_mask.h", Value::Int(sizes[1]));
                }
            }
            for (k, v) in obj {
                if k == "shape" {
                    continue;
                }
                if !MASK_MEMBERS.contains(&k.as_str()) {
                    let mut known = MASK_MEMBERS.to_vec();
                    known.push("shape");
                    return Err(suggest(
                        InputError::new(&format!("attn_mask.{k}"), "unknown field"),
                        k,
                        &known,
                    ));
                }
                facts.set_member(&format!("attn_mask.{k}"), v)?;
            }
            if let Some(Value::Int(d)) = facts.get("attn_mask.dim")
                && d < 2
            {
                return Err(InputError::new(
                    "attn_mask.dim",
                    format!("a mask has at least 2 dimensions (PyTorch reads size(-2)), found {d}"),
                ));
            }
            Ok(())
        }
        _ => Err(InputError::new(
            "attn_mask",
            format!(
                "expected null, a kind ({}) or an object, found {value}",
                MASK_KINDS.join(", ")
            ),
        )),
    }
}

/// Defaults that follow other facts, the `layout` and mask-kind shorthands.
fn derive(facts: &mut Facts, given: &Map<String, Json>) {
    let absent = |k: &str| !given.contains_key(k);
    for (fact, from) in [
        ("dtype_k", "dtype"),
        ("dtype_v", "dtype"),
        ("batch_k", "batch"),
        ("batch_v", "batch"),
        ("heads_v", "heads_kv"),
        ("head_dim_k", "head_dim_qk"),
    ] {
        if absent(fact) {
            let v = facts.get(from).unwrap_or(Value::Null);
            facts.put(fact, v);
        }
    }
    let layout = given.get("layout").and_then(Json::as_str);
    let stride = LAYOUTS
        .iter()
        .find(|(l, _)| Some(*l) == layout)
        .map_or(1, |(_, s)| *s);
    if absent("stride_last_q") {
        facts.put("stride_last_q", Value::Int(stride));
    }
    // Like the dtypes, key and value follow the query unless given (one change moves all).
    let q_stride = facts.get("stride_last_q").unwrap_or(Value::Null);
    for fact in ["stride_last_k", "stride_last_v"] {
        if absent(fact) {
            facts.put(fact, q_stride);
        }
    }
    facts.put("env", Value::Bool(true));
    if facts.get("attn_mask") == Some(Value::Null) {
        return;
    }
    let get = |facts: &Facts, k: &str| facts.get(k).unwrap_or(Value::Null);
    let (batch, heads) = (get(facts, "batch"), get(facts, "heads_q"));
    let (sq, skv) = (get(facts, "seqlen_q"), get(facts, "seqlen_kv"));
    let bool_dtype = Value::Enum(Dom::TorchDtype.index_of("bool").expect("bool dtype"));
    let kind = given.get("attn_mask").and_then(Json::as_str);
    // (dtype, b, h) of each kind; members fill in where the object form left them out.
    let (dtype, b, h) = match kind {
        Some("bool_bcast") => (bool_dtype, Value::Int(1), Value::Int(1)),
        Some("float") => (get(facts, "dtype"), batch, Value::Int(1)),
        _ => (bool_dtype, batch, heads),
    };
    let fill = |facts: &mut Facts, k: &str, v: Value| {
        let path = format!("attn_mask.{k}");
        if facts.get(&path) == Some(Value::Null) {
            facts.put(&path, v);
        }
    };
    fill(facts, "dtype", dtype);
    fill(facts, "dim", Value::Int(4));
    if facts.get("attn_mask.dim") == Some(Value::Int(4)) {
        fill(facts, "b", b);
        fill(facts, "h", h);
    }
    fill(facts, "s_q", sq);
    fill(facts, "s_kv", skv);
    fill(facts, "stride_last", Value::Int(1));
    fill(facts, "requires_grad", Value::Bool(false));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(v: Json) -> Facts {
        TORCH.read(&v).unwrap()
    }

    #[test]
    fn corpus_record_config_reads() {
        let f = read(json!({
            "batch": 1, "heads_q": 32, "heads_kv": 1, "seqlen_q": 2048, "seqlen_kv": 2048,
            "head_dim_qk": 256, "head_dim_v": 256, "dtype": "bf16", "is_causal": false,
            "attn_mask": "float", "dropout_p": 0.0, "enable_gqa": true, "scale": 0.125,
            "requires_grad": true, "layout": "noncontig_lastdim", "deterministic": false,
            "torch": {"version": "2.11.0+cu130", "cudnn": 91900, "sm": "90"}
        }));
        assert_eq!(f.get("sm"), Some(Value::Int(90)));
        assert_eq!(
            f.get("cudnn_version"),
            Some(Value::Version(Version::new(9, 19, 0)))
        );
        assert_eq!(
            f.get("torch_version"),
            Some(Value::Version(Version::new(2, 11, 0)))
        );
        assert_eq!(f.get("stride_last_k"), Some(Value::Int(2)));
        assert_eq!(f.get("heads_v"), Some(Value::Int(1)));
        assert_eq!(f.get("head_dim_k"), Some(Value::Int(256)));
        assert_eq!(f.text("dtype_v"), Some("bf16"));
        // a float mask is [b, 1, sq, skv] in the query dtype
        assert_eq!(f.text("attn_mask.dtype"), Some("bf16"));
        assert_eq!(f.get("attn_mask.h"), Some(Value::Int(1)));
        assert_eq!(f.get("attn_mask.s_kv"), Some(Value::Int(2048)));
    }

    #[test]
    fn defaults_and_explicit_values_win_over_shorthands() {
        let d = TORCH.defaults();
        assert_eq!(d.get("attn_mask"), Some(Value::Null));
        assert_eq!(d.get("stride_last_q"), Some(Value::Int(1)));
        assert_eq!(d.get("heads_v"), Some(Value::Int(16)));
        let f = read(json!({"layout": "noncontig_lastdim", "stride_last_v": 3, "head_dim_k": 32}));
        assert_eq!(f.get("stride_last_q"), Some(Value::Int(2)));
        assert_eq!(f.get("stride_last_k"), Some(Value::Int(2)));
        assert_eq!(f.get("stride_last_v"), Some(Value::Int(3)));
        assert_eq!(f.get("head_dim_k"), Some(Value::Int(32)));
        let f = read(json!({"layout": "noncontig_lastdim", "stride_last_q": 1}));
        assert_eq!(f.get("stride_last_k"), Some(Value::Int(1)));
    }

    #[test]
    fn mask_kinds_and_object_form() {
        let f = read(json!({"attn_mask": "bool_bcast", "batch": 4, "seqlen_q": 7}));
        assert_eq!(f.text("attn_mask.dtype"), Some("bool"));
        assert_eq!(f.get("attn_mask.b"), Some(Value::Int(1)));
        assert_eq!(f.get("attn_mask.s_q"), Some(Value::Int(7)));
        let f = read(json!({"attn_mask": {"shape": [7, 128], "dtype": "fp32", "stride_last": 3}}));
        assert_eq!(f.get("attn_mask.dim"), Some(Value::Int(2)));
        assert_eq!(f.get("attn_mask.b"), Some(Value::Null));
        assert_eq!(f.get("attn_mask.s_q"), Some(Value::Int(7)));
        assert_eq!(f.get("attn_mask.stride_last"), Some(Value::Int(3)));
        assert_eq!(f.get("attn_mask.requires_grad"), Some(Value::Bool(false)));
        let f = read(json!({"attn_mask": {"s_q": 1}, "heads_q": 8}));
        assert_eq!(f.get("attn_mask.h"), Some(Value::Int(8)));
        assert_eq!(f.get("attn_mask.s_q"), Some(Value::Int(1)));
        assert!(TORCH.read(&json!({"attn_mask": {"shape": [5]}})).is_err());
        assert!(
            TORCH
                .read(&json!({"attn_mask": {"shape": [5, 5], "dim": 2}}))
                .is_err()
        );
        let e = TORCH.read(&json!({"attn_mask": "bool_bcst"})).unwrap_err();
        assert_eq!(e.suggestion.as_deref(), Some("bool_bcast"));
    }

    #[test]
    fn device_spellings() {
        for (v, sm) in [
            (json!(90), 90),
            (json!("121"), 121),
            (json!("10.3"), 103),
            (json!("sm_80"), 80),
            (json!([12, 0]), 120),
        ] {
            assert_eq!(read(json!({"sm": v})).get("sm"), Some(Value::Int(sm)));
        }
        assert!(TORCH.read(&json!({"sm": "nine"})).is_err());
        assert_eq!(cudnn_from_int(8903), Version::new(8, 9, 3));
        assert_eq!(cudnn_from_int(91501), Version::new(9, 15, 1));
        let f = read(json!({"cudnn_version": null}));
        assert_eq!(f.get("cudnn_version"), Some(Value::Null));
        let e = TORCH
            .read(&json!({"sm": 90, "torch": {"sm": "90"}}))
            .unwrap_err();
        assert_eq!(e.path, "sm");
        let e = TORCH.read(&json!({"torch": {"cuda": "13.0"}})).unwrap_err();
        assert_eq!(e.suggestion.as_deref(), Some("cudnn"));
    }

    #[test]
    fn env_follows_check_env() {
        let f = read(json!({"env": {"TORCH_CUDNN_SDPA_DEPRIORITIZED": "1",
                                    "TORCH_CUDNN_SDPA_NESTED_TENSOR_ENABLED": "true"}}));
        assert_eq!(
            f.get("env.TORCH_CUDNN_SDPA_DEPRIORITIZED"),
            Some(Value::Bool(true))
        );
        // check_env ignores anything but "0" and "1"
        assert_eq!(
            f.get("env.TORCH_CUDNN_SDPA_NESTED_TENSOR_ENABLED"),
            Some(Value::Bool(false))
        );
        assert!(
            TORCH
                .read(&json!({"env": {"NVTE_FLASH_ATTN": "0"}}))
                .is_err()
        );
    }

    #[test]
    fn out_of_range_sizes_are_refused() {
        assert!(TORCH.read(&json!({"heads_kv": 0})).is_err());
        assert!(TORCH.read(&json!({"seqlen_q": -1})).is_err());
        assert!(TORCH.read(&json!({"layout": "bshd"})).is_err());
        assert!(TORCH.read(&json!({"num_heads": 8})).is_err());
    }
}
