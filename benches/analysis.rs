//! Analysis timings on the te pack (docs/analysis.md, "Measured"): `check` (every lint), `gaps`
//! on the CP head_dim (256, 512] slice for sm90 and sm100/103, and `gaps` over the full
//! pack (exact; the default number of regions listed). Prints one table; run with
//! `cargo bench --bench analysis`.

use std::time::Instant;

use attn_policy::Policy;
use attn_policy::analysis::lint::lint;
use attn_policy::analysis::regions::{DEFAULT_BUDGET, DEFAULT_MAX_REGIONS, Restriction, gaps};

const SLICE: &str = "256 < head_dim_qk <= 512 and head_dim_v == head_dim_qk and context_parallel \
    and qkv_dtype == \"bf16\" and not fp8 and core_attention_bias_type == \"no_bias\" \
    and attention_dropout == 0.0 and softmax_type == \"vanilla\" and num_splits == 1 \
    and not has_score_mod and not has_score_mod_bprop and inference == null \
    and alibi_slopes_shape == null and qkv_layout == \"bshd_bshd_bshd\" \
    and attn_mask_type == \"causal\" and not return_max_logit and not deterministic \
    and not cuda_graph and not checkpoint_core_attention and not fp8_output and softcap == 0.0 \
    and window_size == null and is_training and max_seqlen_q == 8192 and max_seqlen_kv == 8192 \
    and num_heads == 16 and num_gqa_groups == 16 and cp_size == 2 and cp_size_a2a == 2 \
    and batch_size == 2 and flash_attn_versions.v2 == 2.7.4 and flash_attn_versions.v3 == null \
    and flash_attn_versions.v4 == null and cudnn_version == 9.19.0 \
    and cudnn_frontend_version == 1.29.0 and cutlass_dsl_version == 4.7.1";

fn main() {
    let p = Policy::embedded("te").expect("te pack");
    println!("| what | seconds | classes examined | diagram nodes | regions | complete |");
    println!("|---|---|---|---|---|---|");
    let t = Instant::now();
    let d = lint(&p);
    println!(
        "| check (te, {} findings) | {:.2} | - | - | - | {} |",
        d.len(),
        t.elapsed().as_secs_f64(),
        !d.iter().any(|x| x.code == "W-ANALYSIS-INCOMPLETE")
    );
    let budget: u64 = std::env::var("GAPS_BUDGET")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_BUDGET);
    let cases = [
        (
            "gaps sm90 CP slice",
            format!("sm == 90 and {SLICE}"),
            u64::MAX,
        ),
        (
            "gaps sm100/103 CP slice",
            format!("sm in [100, 103] and {SLICE}"),
            budget,
        ),
        ("gaps full pack", "true".to_string(), budget),
    ];
    for (name, w, b) in cases {
        let r = Restriction::parse(&w).expect("where");
        let t = Instant::now();
        let (rep, _) = gaps(&p, Some(&r), b, DEFAULT_MAX_REGIONS);
        println!(
            "| {name} (budget {}) | {:.2} | {} | {} | {} | {} |",
            if b == u64::MAX {
                "none".to_string()
            } else {
                b.to_string()
            },
            t.elapsed().as_secs_f64(),
            rep.classes_examined,
            rep.diagram_nodes,
            rep.regions.len(),
            rep.complete
        );
    }
}
