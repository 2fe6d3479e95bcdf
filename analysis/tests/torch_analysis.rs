//! The analysis over the `torch` family's facts: `gaps --only`, `why-not`, `check`.

use attn_policy::Policy;
use attn_policy_analysis::lint::lint;
use attn_policy_analysis::regions::{DEFAULT_BUDGET, Restriction, gaps, gaps_only};
use attn_policy_analysis::why_not::why_not;
use serde_json::json;

/// Dense, contiguous bf16 inputs with every backend enabled on an H200 with cuDNN 9.19, as in
/// the public corpus: what is left free is the shape (heads, head dims, lengths).
const HOPPER_BF16: &str = "sm == 90 and cudnn_version == 9.19.0 and dtype == \"bf16\" \
    and dtype_k == \"bf16\" and dtype_v == \"bf16\" and not nested and dim_q == 4 and dim_k == 4 \
    and dim_v == 4 and stride_last_q == 1 and stride_last_k == 1 and stride_last_v == 1 \
    and flash_sdp_enabled and mem_efficient_sdp_enabled and cudnn_sdp_enabled \
    and math_sdp_enabled and attn_mask == null and head_dim_k == head_dim_qk \
    and heads_v == heads_kv and batch >= 1 and batch_k == batch and batch_v == batch \
    and not deterministic and seqlen_q > 1 and seqlen_kv > 1 and seqlen_q == seqlen_kv";

fn torch() -> Policy {
    Policy::embedded("torch").expect("torch pack loads")
}

#[test]
fn on_hopper_with_gqa_only_math_serves_head_dims_above_256() {
    let p = torch();
    let w = Restriction::parse_for(
        p.schema,
        &format!(
            "{HOPPER_BF16} and head_dim_v == head_dim_qk and head_dim_qk % 8 == 0 \
             and enable_gqa and heads_kv < heads_q and heads_q % heads_kv == 0"
        ),
    )
    .expect("restriction compiles over torch facts");
    let math = p.backend_index("math").unwrap();
    let (r, _) = gaps_only(&p, Some(&w), DEFAULT_BUDGET, 50, Some(math));
    assert!(r.complete && !r.regions_truncated, "{r:#?}");
    assert_eq!(r.only.as_deref(), Some("math"));
    assert!(!r.regions.is_empty());
    for g in &r.regions {
        assert_eq!(
            g.constraints["head_dim_qk"],
            json!("head_dim_qk > 256 and head_dim_qk % 8 == 0"),
            "{g:#?}"
        );
        assert_eq!(g.declined_by["flash"], ["flash.head_dim"]);
        assert_eq!(g.declined_by["cudnn"], ["cudnn.head_dim_limit"]);
        assert!(g.declined_by["efficient"].contains(&"efficient.heads".to_string()));
        // the example decides as the region says: math only
        let facts = p.read_facts(&g.example).expect("example reads");
        let d = p.decide(&facts);
        assert_eq!(d.selected, Some(math as u16));
        let eligible: Vec<&str> = p
            .backends
            .iter()
            .enumerate()
            .filter(|(b, _)| d.backends[*b].status.eligible())
            .map(|(_, b)| b.name.as_str())
            .collect();
        assert_eq!(eligible, ["math"], "{}", g.example);
    }
    // The same shapes with one head_dim <= 256: flash or cuDNN serve, math is never alone.
    let w = Restriction::parse_for(
        p.schema,
        &format!(
            "{HOPPER_BF16} and head_dim_v == head_dim_qk and head_dim_qk % 8 == 0 \
             and head_dim_qk <= 256 and enable_gqa and heads_kv < heads_q \
             and heads_q % heads_kv == 0"
        ),
    )
    .unwrap();
    let (r, _) = gaps_only(&p, Some(&w), DEFAULT_BUDGET, 50, Some(math));
    assert!(
        r.complete && r.regions.is_empty() && !r.gaps_exist,
        "{r:#?}"
    );
}

#[test]
fn with_math_enabled_the_torch_pack_always_selects() {
    let p = torch();
    let w = Restriction::parse_for(
        p.schema,
        &format!("{HOPPER_BF16} and head_dim_v == head_dim_qk and enable_gqa and heads_kv < heads_q and heads_q % heads_kv == 0"),
    )
    .unwrap();
    // Every backend enabled: the pack always selects (math serves whatever the others do not).
    let (r, _) = gaps(&p, Some(&w), DEFAULT_BUDGET, 10);
    assert!(r.complete && !r.gaps_exist, "{r:#?}");
}

#[test]
fn why_not_proposes_verified_changes_for_torch_facts() {
    let p = torch();
    let config = json!({"heads_q": 32, "heads_kv": 8, "enable_gqa": true,
                        "head_dim_qk": 512, "head_dim_v": 512});
    let r = why_not(&p, "efficient", &config).unwrap();
    assert!(!r.eligible);
    assert_eq!(r.selected.as_deref(), Some("math"));
    let texts: Vec<&str> = r.hints.iter().map(|h| h.text.as_str()).collect();
    assert!(texts.contains(&"raise heads_kv 8 -> 32"), "{texts:?}");
    let r = why_not(&p, "flash", &config).unwrap();
    assert_eq!(r.declined_by[0].0, "flash.head_dim");
    assert!(
        r.hints[0].text.starts_with("lower head_dim_qk 512 -> 256"),
        "{:?}",
        r.hints
    );
    // the GPU cannot be changed: flash on a V100 is reported, not proposed
    let r = why_not(&p, "flash", &json!({"sm": 70})).unwrap();
    assert!(r.hints.is_empty());
    assert!(
        r.unchangeable.iter().any(|u| u.contains("sm")),
        "{:?}",
        r.unchangeable
    );
}

#[test]
fn the_torch_pack_checks_clean() {
    let p = torch();
    let diags = lint(&p);
    assert!(diags.is_empty(), "{diags:#?}");
}
