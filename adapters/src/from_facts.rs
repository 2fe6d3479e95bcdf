//! Attention facts (the policy's typed input) -> an executor [`AttentionProblem`]: the one place
//! where a decided configuration becomes something an executor can run.
//!
//! Facts an executor cannot express are refused with [`NotExpressible`] naming the fact; packs
//! whose backends are executors decline such inputs first, so this is a second line of defence.

use attn_policy::Facts;
use attn_policy::facts::Value;
use thiserror::Error;

use crate::problem::{
    AttentionProblem, DType, DiagonalAlignment, LayoutKind, MaskSpec, SeqLens, SeqPacking,
    SoftmaxKind,
};

/// A fact whose value no executor problem can express (a layout, dtype or mask kind the
/// executors do not run, or a size that is not a positive integer).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{fact} = {value}: {why}")]
pub struct NotExpressible {
    /// The fact's path (`qkv_layout`).
    pub fact: String,
    /// Its value as text.
    pub value: String,
    /// What executors accept instead.
    pub why: String,
}

fn refuse(fact: &str, value: impl ToString, why: &str) -> NotExpressible {
    NotExpressible {
        fact: fact.to_string(),
        value: value.to_string(),
        why: why.to_string(),
    }
}

type FeatureCheck = fn(&Facts, Value) -> bool;

/// Facts whose other values change the result (bias, dropout, FP8, a KV cache, context
/// parallelism, THD padding between sequences, score_mod, extra outputs): no executor computes
/// them, so these must hold. (Soft-capping, sinks and padding are in the problem, and each
/// executor's manifest says whether it serves them.)
const FEATURES: &[(&str, FeatureCheck, &str)] = &[
    (
        "core_attention_bias_type",
        |f, _| f.text("core_attention_bias_type") == Some("no_bias"),
        "executors add no bias",
    ),
    (
        "alibi_slopes_shape",
        |_, v| v == Value::Null,
        "executors add no ALiBi bias",
    ),
    (
        "attention_dropout",
        |f, v| {
            v == Value::Float(0.0)
                || v == Value::Int(0)
                || f.get("is_training") == Some(Value::Bool(false))
        },
        "executors apply no dropout",
    ),
    (
        "fp8",
        |_, v| v == Value::Bool(false),
        "executors do not run FP8",
    ),
    (
        "fp8_output",
        |_, v| v != Value::Bool(true),
        "executors write no FP8 output",
    ),
    (
        "qkv_type",
        |f, _| f.text("qkv_type") == Some("Tensor"),
        "executors take plain tensors (no quantized tensor classes)",
    ),
    (
        "inference",
        |_, v| v == Value::Null,
        "executors have no KV cache",
    ),
    (
        "context_parallel",
        |_, v| v == Value::Bool(false),
        "executors run one device's whole sequence (context parallelism is attn_policy.torch's cp_attention)",
    ),
    (
        "pad_between_seqs",
        |_, v| v != Value::Bool(true),
        "executors take no THD padding",
    ),
    (
        "has_score_mod",
        |_, v| v != Value::Bool(true),
        "executors apply no score_mod",
    ),
    (
        "return_max_logit",
        |_, v| v != Value::Bool(true),
        "executors do not return the max logit",
    ),
];

fn value_text(facts: &Facts, fact: &str, v: Value) -> String {
    match facts.text(fact) {
        Some(t) => t.to_string(),
        None => match v {
            Value::Null => "null".into(),
            Value::Bool(b) => b.to_string(),
            Value::Int(i) => i.to_string(),
            Value::Float(x) => x.to_string(),
            other => format!("{other:?}"),
        },
    }
}

/// Builds the executor problem of a te-family configuration (`qkv_layout`, `attn_mask_type`,
/// `window`, `bottom_right_diagonal`, `softmax_scale`, `deterministic`, sizes and head dims).
pub fn problem_from_facts(facts: &Facts) -> Result<AttentionProblem, NotExpressible> {
    let size = |p: &str| match facts.get(p) {
        Some(Value::Int(i)) if i > 0 => Ok(i as usize),
        other => Err(refuse(
            p,
            format!("{other:?}"),
            "must be a positive integer",
        )),
    };
    let text = |p: &str| facts.text(p).unwrap_or("null");
    let dtype = match text("qkv_dtype") {
        "fp16" => DType::F16,
        "bf16" => DType::BF16,
        other => {
            return Err(refuse(
                "qkv_dtype",
                other,
                "the Rust executors take fp16 and bf16 tensors; fp32 and float64 host tensors run through attn_policy.torch's strided reference path",
            ));
        }
    };
    let mut p = AttentionProblem::new(
        size("batch_size")?,
        size("num_heads")?,
        size("num_gqa_groups")?,
        size("max_seqlen_q")?,
        size("max_seqlen_kv")?,
        size("head_dim_qk")?,
        size("head_dim_v")?,
        dtype,
    );
    let (layout, packed) = match text("qkv_layout") {
        "bshd_bshd_bshd" => (LayoutKind::Bshd, false),
        "sbhd_sbhd_sbhd" => (LayoutKind::Sbhd, false),
        "bhsd_bhsd_bhsd" => (LayoutKind::Bhsd, false),
        "thd_thd_thd" => (LayoutKind::Bshd, true),
        other => {
            return Err(refuse(
                "qkv_layout",
                other,
                "executors run separate q/k/v tensors in bshd, sbhd, bhsd or thd",
            ));
        }
    };
    // `window` is TE's normalised window (derived from window_size and the mask).
    let (left, right) = match (facts.get("window.left"), facts.get("window.right")) {
        (Some(Value::Int(l)), Some(Value::Int(r))) => (l, r),
        _ => (-1, -1),
    };
    let alignment = if facts.get("bottom_right_diagonal") == Some(Value::Bool(true)) {
        DiagonalAlignment::BottomRight
    } else {
        DiagonalAlignment::TopLeft
    };
    let mask_type = text("attn_mask_type");
    let (padding, causal) = match mask_type {
        "no_mask" => (false, None),
        "padding" => (true, None),
        "causal" => (false, Some(MaskSpec::CAUSAL_TOP_LEFT)),
        "padding_causal" => (true, Some(MaskSpec::CAUSAL_TOP_LEFT)),
        "causal_bottom_right" => (false, Some(MaskSpec::CAUSAL_BOTTOM_RIGHT)),
        "padding_causal_bottom_right" => (true, Some(MaskSpec::CAUSAL_BOTTOM_RIGHT)),
        other => {
            return Err(refuse(
                "attn_mask_type",
                other,
                "executors run no_mask, causal and causal_bottom_right (with windows), with or \
                 without padding",
            ));
        }
    };
    p.mask = match causal {
        None => MaskSpec::window(left, right, alignment),
        Some(c) => MaskSpec {
            window_left: left,
            ..c
        },
    };
    // The facts say a batch is padded (a padding mask) or packed (THD), not the lengths: the
    // problem gets a fixed pattern of them, sequence b holding `max - b * max / (2 * batch)`
    // tokens (from the full length down to about half), so a run exercises uneven sequences.
    if padding || packed {
        let lens = |max: usize| -> Vec<usize> {
            (0..p.batch)
                .map(|b| (max - b * max / (2 * p.batch)).max(1))
                .collect()
        };
        let packing = if packed {
            SeqPacking::Packed
        } else {
            SeqPacking::PaddedRight
        };
        p.seqlens = Some(SeqLens::padded(
            packing,
            lens(p.seqlen_q),
            lens(p.seqlen_kv),
        ));
    }
    p.set_layout(layout);
    if let Some(c) = facts.get("softcap") {
        match c {
            Value::Float(0.0) | Value::Int(0) => {}
            Value::Float(c) => p.softcap = Some(c),
            Value::Int(c) => p.softcap = Some(c as f64),
            other => {
                return Err(refuse(
                    "softcap",
                    value_text(facts, "softcap", other),
                    "must be a number",
                ));
            }
        }
    }
    p.softmax = match facts.text("softmax_type").unwrap_or("vanilla") {
        "vanilla" => SoftmaxKind::Vanilla,
        "off-by-one" => SoftmaxKind::OffByOne,
        "learnable" => SoftmaxKind::Learnable,
        other => {
            return Err(refuse(
                "softmax_type",
                other,
                "executors compute vanilla, off-by-one and learnable softmaxes",
            ));
        }
    };
    // Features that change what is computed: an executor ignoring one would return a silently
    // different result, so the problem is not expressible with them.
    for (fact, ok, what) in FEATURES {
        if let Some(v) = facts.get(fact)
            && !ok(facts, v)
        {
            return Err(refuse(fact, value_text(facts, fact, v), what));
        }
    }
    // Null (not given): the problem keeps its default 1/sqrt(d); a given scale is taken as it
    // is, and one that is not finite and positive fails validation below.
    if let Some(Value::Float(s)) = facts.get("softmax_scale") {
        p.softmax_scale = s;
    }
    p.deterministic = facts.get("deterministic") == Some(Value::Bool(true));
    p.validate()
        .map_err(|e| refuse("problem", "invalid", e.as_str()))?;
    Ok(p)
}

/// What [`problem_from_facts`] accepts, as a condition of the te family's rule language: the
/// layouts, dtypes and masks it expresses and the features it refuses.
const TE_EXPRESSIBLE: &str = r#"qkv_layout in ["bshd_bshd_bshd", "sbhd_sbhd_sbhd", "bhsd_bhsd_bhsd", "thd_thd_thd"]
    and attn_mask_type in ["no_mask", "causal", "causal_bottom_right", "padding", "padding_causal", "padding_causal_bottom_right"]
    and batch_size > 0 and num_heads > 0 and num_gqa_groups > 0 and num_heads % num_gqa_groups == 0
    and max_seqlen_q > 0 and max_seqlen_kv > 0 and head_dim_qk > 0 and head_dim_v > 0
    and window.left >= -1 and (attn_mask_type != "no_mask" or window.right >= -1)
    and (softmax_scale == null or softmax_scale > 0)
    and core_attention_bias_type == "no_bias" and alibi_slopes_shape == null
    and (attention_dropout == 0 or not is_training)
    and softmax_type in ["vanilla", "off-by-one", "learnable"]
    and not fp8 and not fp8_output and qkv_type == "Tensor"
    and inference == null and not context_parallel and not pad_between_seqs
    and not has_score_mod and not return_max_logit"#;

/// The condition (te family) under which an executor with this manifest runs the problem a
/// configuration describes: [`problem_from_facts`] succeeds and [`Manifest::admits`] accepts.
/// The catalogue gives it to the pack loader, and `check` uses it to prove executor-chain
/// entries dead or backends without a runnable entry. A test checks it against the two
/// functions on a grid of configurations.
pub fn te_admits(m: &crate::executor::Manifest) -> String {
    use crate::problem::{LayoutKind, MaskKind};
    let quoted = |xs: Vec<&str>| {
        xs.iter()
            .map(|x| format!("{x:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut parts = vec![format!("({TE_EXPRESSIBLE})")];
    let dtypes: Vec<&str> = [DType::F16, DType::BF16]
        .into_iter()
        .filter(|d| m.dtypes.contains(d))
        .map(DType::rule_name)
        .collect();
    parts.push(format!("qkv_dtype in [{}]", quoted(dtypes)));
    if let Some(cc) = m.min_compute_capability {
        parts.push(format!("sm >= {cc}"));
    }
    if let Some(cc) = m.max_compute_capability {
        parts.push(format!("sm <= {cc}"));
    }
    for (fact, r) in [("head_dim_qk", m.head_dim_qk), ("head_dim_v", m.head_dim_v)] {
        parts.push(format!("{fact} >= {} and {fact} <= {}", r.min, r.max));
        if r.multiple_of > 1 {
            parts.push(format!("{fact} % {} == 0", r.multiple_of));
        }
    }
    if !m.head_dim_v_may_differ {
        parts.push("head_dim_qk == head_dim_v".into());
    }
    let masks: Vec<&str> = [
        MaskKind::NoMask,
        MaskKind::CausalTopLeft,
        MaskKind::CausalBottomRight,
    ]
    .into_iter()
    .filter(|k| m.masks.contains(k))
    .flat_map(|k| {
        let padded = match k {
            MaskKind::NoMask => "padding",
            MaskKind::CausalTopLeft => "padding_causal",
            MaskKind::CausalBottomRight => "padding_causal_bottom_right",
        };
        // The padding kinds only where the executor takes per-sequence lengths at all.
        std::iter::once(k.rule_name()).chain((!m.features.seqlens.is_empty()).then_some(padded))
    })
    .collect();
    parts.push(format!("attn_mask_type in [{}]", quoted(masks)));
    // Per-sequence lengths: a padding mask on bshd/sbhd/bhsd is a right-padded batch, THD a
    // packed one (problem_from_facts).
    let f = &m.features;
    if !f.seqlens.contains(&SeqPacking::Packed) {
        parts.push(r#"qkv_layout != "thd_thd_thd""#.into());
    }
    if !f.seqlens.is_empty() && !f.seqlens.contains(&SeqPacking::PaddedRight) {
        parts.push(
            r#"(qkv_layout == "thd_thd_thd" or not (attn_mask_type in ["padding", "padding_causal", "padding_causal_bottom_right"]))"#
                .into(),
        );
    }
    if !f.softcap {
        parts.push("softcap == 0".into());
    }
    let sinks: Vec<&str> = std::iter::once(SoftmaxKind::Vanilla)
        .chain(f.sinks.iter().copied())
        .map(SoftmaxKind::te_name)
        .collect();
    parts.push(format!("softmax_type in [{}]", quoted(sinks)));
    if !m.windows {
        parts.push(
            r#"window.left < 0 and (attn_mask_type != "no_mask" or window.right < 0)"#.into(),
        );
    }
    if !m.rectangular {
        parts.push("max_seqlen_q == max_seqlen_kv".into());
    }
    if !m.arbitrary_strides {
        let layouts: Vec<&str> = [
            (LayoutKind::Bshd, "bshd_bshd_bshd"),
            (LayoutKind::Sbhd, "sbhd_sbhd_sbhd"),
            (LayoutKind::Bhsd, "bhsd_bhsd_bhsd"),
        ]
        .into_iter()
        .filter(|(k, _)| m.layouts.contains(k))
        .map(|(_, name)| name)
        // A packed batch has bshd's strides (batch stride 0).
        .chain(
            (m.layouts.contains(&LayoutKind::Bshd)
                && m.features.seqlens.contains(&SeqPacking::Packed))
            .then_some("thd_thd_thd"),
        )
        .collect();
        parts.push(format!("qkv_layout in [{}]", quoted(layouts)));
    }
    if m.stride_multiple_of > 1 {
        // Contiguous named layouts: every stride is a multiple of the head dims (and of
        // num_heads * head_dim), so the head dims' alignment decides.
        let k = m.stride_multiple_of;
        parts.push(format!("head_dim_qk % {k} == 0 and head_dim_v % {k} == 0"));
    }
    if !m.gqa {
        parts.push("num_gqa_groups == num_heads".into());
    }
    if let Some(s) = m.max_seqlen {
        parts.push(format!("max_seqlen_q <= {s} and max_seqlen_kv <= {s}"));
    }
    if let Some(n) = m.max_score_elements {
        parts.push(format!(
            "batch_size * num_heads * max_seqlen_q * max_seqlen_kv <= {n}"
        ));
    }
    if !m.deterministic {
        parts.push("not deterministic".into());
    }
    if !m.backward {
        parts.push("not is_training".into());
    }
    parts.join("\n    and ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::MaskKind;
    use serde_json::json;

    fn facts(c: serde_json::Value) -> Facts {
        Facts::from_json(&c).expect("valid config")
    }

    #[test]
    fn sizes_layout_and_causal_window_carry_over() {
        let p = problem_from_facts(&facts(json!({
            "batch_size": 2, "num_heads": 8, "num_gqa_groups": 4, "max_seqlen_q": 64,
            "max_seqlen_kv": 96, "head_dim_qk": 128, "head_dim_v": 64, "qkv_dtype": "fp16",
            "qkv_layout": "bshd_bshd_bshd", "attn_mask_type": "causal_bottom_right",
            "window_size": [32, 0]})))
        .expect("expressible");
        assert_eq!(
            (p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_kv),
            (2, 8, 4, 64, 96)
        );
        assert_eq!(
            (p.head_dim_qk, p.head_dim_v, p.dtype),
            (128, 64, DType::F16)
        );
        assert_eq!(p.mask.kind, MaskKind::CausalBottomRight);
        assert_eq!(p.mask.window_left, 32);
    }

    /// The te condition of each manifest is exactly "expressible and admitted", on a grid that
    /// crosses every limit the manifests state.
    #[test]
    fn te_admits_agrees_with_the_conversion_and_the_manifest() {
        use attn_policy::eval::program::Truth;
        // One manifest serving every feature, one serving some: the conditions for the
        // features are checked against `admits` whatever the executors serve today.
        let mut all = crate::reference::manifest();
        all.features = crate::executor::Features::all();
        let mut some = crate::chunked::manifest();
        some.features = crate::executor::Features {
            softcap: true,
            sinks: vec![SoftmaxKind::OffByOne],
            seqlens: vec![SeqPacking::Packed],
        };
        let manifests = [
            all,
            some,
            crate::reference::manifest(),
            crate::chunked::manifest(),
            crate::cudnn::manifest(),
            crate::frost::manifest(),
        ];
        let mut compiled = Vec::new();
        let mut compiler = attn_policy::typecheck::Compiler::default();
        for m in &manifests {
            let src = te_admits(m);
            let ast = attn_policy::lang::parse_expr(&src)
                .unwrap_or_else(|e| panic!("{}: {e:?}\n{src}", m.name));
            let c = compiler
                .condition(&ast)
                .unwrap_or_else(|e| panic!("{}: {e}\n{src}", m.name));
            compiled.push(c.node);
        }
        let (mut admitted, mut total) = (0, 0);
        for d in [64, 72, 128, 256, 260, 264, 512, 1024, 4096] {
            for dv in [d, 128] {
                for dtype in ["fp16", "bf16", "fp32"] {
                    for layout in ["bshd_bshd_bshd", "bhsd_bhsd_bhsd", "thd_thd_thd"] {
                        for (mask, window) in [
                            ("no_mask", json!(null)),
                            ("causal", json!(null)),
                            ("causal_bottom_right", json!([64, 0])),
                            ("no_mask", json!([32, 32])),
                            ("padding", json!(null)),
                            ("padding_causal", json!(null)),
                            ("padding_causal_bottom_right", json!([16, 0])),
                            ("arbitrary", json!(null)),
                        ] {
                            for (sq, skv, hkv, sm, det, extra) in [
                                (64, 64, 2, [9, 0], false, json!({})),
                                (32, 96, 4, [8, 0], true, json!({})),
                                (8192, 8192, 1, [10, 0], false, json!({})),
                                (64, 64, 2, [9, 0], false, json!({"attention_dropout": 0.1})),
                                (64, 64, 2, [7, 5], false, json!({"softmax_scale": 0.5})),
                                (64, 64, 2, [9, 0], false, json!({"softcap": 30.0})),
                                (
                                    64,
                                    96,
                                    2,
                                    [9, 0],
                                    false,
                                    json!({"softmax_type": "learnable"}),
                                ),
                                (
                                    64,
                                    64,
                                    4,
                                    [9, 0],
                                    true,
                                    json!({"softmax_type": "off-by-one"}),
                                ),
                            ] {
                                let mut c = json!({"qkv_dtype": dtype, "qkv_layout": layout,
                                    "attn_mask_type": mask, "window_size": window,
                                    "batch_size": 2, "num_heads": 4, "num_gqa_groups": hkv,
                                    "max_seqlen_q": sq, "max_seqlen_kv": skv,
                                    "head_dim_qk": d, "head_dim_v": dv,
                                    "device_compute_capability": sm, "deterministic": det});
                                for (k, v) in extra.as_object().unwrap() {
                                    c[k] = v.clone();
                                }
                                let f = facts(c.clone());
                                let problem = problem_from_facts(&f);
                                for (m, &node) in manifests.iter().zip(&compiled) {
                                    // The device's compute capability is the one manifest limit
                                    // a problem does not carry.
                                    let cc = (sm[0] * 10 + sm[1]) as u32;
                                    let expected =
                                        problem.as_ref().is_ok_and(|p| m.admits(p).is_ok())
                                            && m.min_compute_capability.is_none_or(|min| cc >= min)
                                            && m.max_compute_capability.is_none_or(|max| cc <= max);
                                    let got = Truth::of(compiler.program.eval(node, f.values()));
                                    assert_eq!(
                                        got,
                                        if expected { Truth::True } else { Truth::False },
                                        "{} on {c}: problem {problem:?}",
                                        m.name
                                    );
                                    admitted += usize::from(expected);
                                    total += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(
            admitted > 200 && admitted < total - 200,
            "{admitted} of {total}"
        );
    }

    #[test]
    fn inexpressible_facts_are_named() {
        let e = problem_from_facts(&facts(json!({"qkv_layout": "thd_bshd_bshd"}))).unwrap_err();
        assert_eq!(
            (e.fact.as_str(), e.value.as_str()),
            ("qkv_layout", "thd_bshd_bshd")
        );
        let e = problem_from_facts(&facts(json!({"qkv_dtype": "fp32"}))).unwrap_err();
        assert_eq!(e.fact, "qkv_dtype");
        let e = problem_from_facts(&facts(json!({
            "qkv_layout": "bshd_bshd_bshd", "attn_mask_type": "arbitrary"})))
        .unwrap_err();
        assert_eq!(e.fact, "attn_mask_type");
        for (fact, value) in [
            ("attention_dropout", json!(0.1)),
            ("core_attention_bias_type", json!("post_scale_bias")),
            ("pad_between_seqs", json!(true)),
            ("fp8", json!(true)),
            ("context_parallel", json!(true)),
            ("return_max_logit", json!(true)),
        ] {
            let mut c = json!({"qkv_layout": "bshd_bshd_bshd"});
            c[fact] = value;
            let e = problem_from_facts(&facts(c)).unwrap_err();
            assert_eq!(e.fact, fact, "{e}");
        }
        // Dropout does nothing at inference, so it does not stop execution there.
        let p = problem_from_facts(&facts(json!({
            "qkv_layout": "bshd_bshd_bshd", "attention_dropout": 0.1, "is_training": false})));
        assert!(p.is_ok(), "{p:?}");
    }
}
