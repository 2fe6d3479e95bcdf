//! What the analysis and matrix tests (and the analysis bench, through `#[path]`) build alike.
// Each test binary compiles this module on its own and uses only part of it.
#![allow(dead_code)]

use attn_policy::Policy;

/// A slice of the te pack around the example: context parallelism, head_dim in
/// (256, 512], one representative training setup (bf16, bshd, causal, no bias/dropout/window,
/// pinned library versions). The full pack is too large to enumerate in CI (docs/analysis.md).
pub const TE_SLICE: &str = "256 < head_dim_qk <= 512 and head_dim_v == head_dim_qk and context_parallel \
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

/// A copy of the te pack without FROST's FR.22 (window with p2p / a2a+p2p), read back from
/// `$TMP/attn-policy-{tag}-{pid}`: the directory, to remove when done, and the pack.
pub fn te_without_fr22(tag: &str) -> (std::path::PathBuf, Policy) {
    let dir = std::env::temp_dir().join(format!("attn-policy-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    for e in
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../rules/te")).expect("rules/te")
    {
        let e = e.expect("entry");
        std::fs::copy(e.path(), dir.join(e.file_name())).expect("copy");
    }
    let f = dir.join("frost_attention.yaml");
    let text = std::fs::read_to_string(&f).expect("frost rules");
    let (a, b) = (
        text.find("  - id: FR.22\n").expect("FR.22"),
        text.find("  - id: FR.23\n").expect("FR.23"),
    );
    // The rule cut out is the one meant, not whatever now stands between the two ids.
    assert!(text[a..b].contains("cp and has_win and cp_comm_type in [\"p2p\", \"a2a+p2p\"]"));
    std::fs::write(&f, format!("{}{}", &text[..a], &text[b..])).expect("write");
    let policy = Policy::from_dir(&dir).expect("te without FR.22");
    (dir, policy)
}
