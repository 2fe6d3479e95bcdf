//! Attention facts (the policy's typed input) -> an executor [`AttentionProblem`]: the one place
//! where a decided configuration becomes something an executor can run.
//!
//! Facts an executor cannot express are refused with [`NotExpressible`] naming the fact; packs
//! whose backends are executors decline such inputs first, so this is a second line of defence.

use attn_policy::Facts;
use attn_policy::facts::Value;
use thiserror::Error;

use crate::problem::{AttentionProblem, DType, DiagonalAlignment, LayoutKind, MaskSpec};

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
        other => return Err(refuse("qkv_dtype", other, "executors run fp16 and bf16")),
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
    p.set_layout(match text("qkv_layout") {
        "bshd_bshd_bshd" => LayoutKind::Bshd,
        "sbhd_sbhd_sbhd" => LayoutKind::Sbhd,
        "bhsd_bhsd_bhsd" => LayoutKind::Bhsd,
        other => {
            return Err(refuse(
                "qkv_layout",
                other,
                "executors run separate q/k/v tensors in bshd, sbhd or bhsd",
            ));
        }
    });
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
    p.mask = match text("attn_mask_type") {
        "no_mask" => MaskSpec::window(left, right, alignment),
        "causal" => MaskSpec {
            window_left: left,
            ..MaskSpec::CAUSAL_TOP_LEFT
        },
        "causal_bottom_right" => MaskSpec {
            window_left: left,
            ..MaskSpec::CAUSAL_BOTTOM_RIGHT
        },
        other => {
            return Err(refuse(
                "attn_mask_type",
                other,
                "executors run no_mask, causal and causal_bottom_right (with windows)",
            ));
        }
    };
    if let Some(Value::Float(s)) = facts.get("softmax_scale") {
        // TE's schema default is 1.0; a config that leaves it unset means the usual 1/sqrt(d).
        if s > 0.0 && s != 1.0 {
            p.softmax_scale = s;
        }
    }
    p.deterministic = facts.get("deterministic") == Some(Value::Bool(true));
    p.validate()
        .map_err(|e| refuse("problem", "invalid", e.as_str()))?;
    Ok(p)
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

    #[test]
    fn inexpressible_facts_are_named() {
        let e = problem_from_facts(&facts(json!({"qkv_layout": "thd_thd_thd"}))).unwrap_err();
        assert_eq!(
            (e.fact.as_str(), e.value.as_str()),
            ("qkv_layout", "thd_thd_thd")
        );
        let e = problem_from_facts(&facts(json!({"qkv_dtype": "fp32"}))).unwrap_err();
        assert_eq!(e.fact, "qkv_dtype");
        let e = problem_from_facts(&facts(json!({
            "qkv_layout": "bshd_bshd_bshd", "attn_mask_type": "padding"})))
        .unwrap_err();
        assert_eq!(e.fact, "attn_mask_type");
    }
}
