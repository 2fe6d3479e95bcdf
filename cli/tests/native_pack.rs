//! The `native` pack may not admit what its executor refuses: for a grid of configurations,
//! every backend the pack finds eligible must accept the problem by its manifest. Also: on a
//! machine without a GPU, small problems go to the CPU reference.

use attn_policy::facts::Value;
use attn_policy::{Facts, Policy};
use attn_policy_adapters::{Registry, problem_from_facts};
use serde_json::json;

#[test]
fn pack_admits_nothing_its_executors_refuse() {
    let policy = Policy::embedded("native").expect("native pack loads");
    let registry = Registry::builtin();
    let mut checked = 0;
    for d in [8, 60, 64, 128, 256, 264, 512, 1024, 2048, 4096] {
        for dv in [d, 128] {
            for dtype in ["fp16", "bf16", "fp32"] {
                for layout in ["bshd_bshd_bshd", "sbhd_sbhd_sbhd", "thd_thd_thd"] {
                    for (mask, window) in [
                        ("no_mask", json!(null)),
                        ("causal", json!(null)),
                        ("causal_bottom_right", json!([64, 0])),
                        ("no_mask", json!([32, 32])),
                        ("padding", json!(null)),
                    ] {
                        for (sq, skv, training) in [(64, 64, true), (32, 96, false)] {
                            let c = json!({"qkv_dtype": dtype, "qkv_layout": layout, "attn_mask_type": mask, "window_size": window,
                                "batch_size": 1, "num_heads": 4, "num_gqa_groups": 2, "max_seqlen_q": sq, "max_seqlen_kv": skv,
                                "head_dim_qk": d, "head_dim_v": dv, "device_compute_capability": [9, 0], "is_training": training,
                                "probe": {"cuda_device": true, "fused_attn_graph": true}});
                            let facts = Facts::from_json(&c).expect("valid config");
                            let decision = policy.decide(&facts);
                            for (b, backend) in policy.backends.iter().enumerate() {
                                if !decision.backends[b].status.eligible() {
                                    continue;
                                }
                                let p = problem_from_facts(&facts).unwrap_or_else(|e| {
                                    panic!(
                                        "{} admitted an inexpressible config {c}: {e}",
                                        backend.name
                                    )
                                });
                                let manifest = registry.manifest(&backend.name).ok();
                                // cudnn's manifest lives with its executor; check the ones registered.
                                if let Some(m) = manifest {
                                    m.admits(&p).unwrap_or_else(|e| {
                                        panic!(
                                            "pack admits {c} for {} but its manifest refuses: {e}",
                                            backend.name
                                        )
                                    });
                                    checked += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(
        checked > 100,
        "grid exercised too few admissions: {checked}"
    );
}

/// Head dims 264..512 on Hopper: inference and training run the fused kernels, other GPUs the
/// chunked executor.
#[test]
fn the_fused_kernel_serves_hopper_inference_at_large_head_dims() {
    let policy = Policy::embedded("native").expect("native pack loads");
    let selected = |d: usize, sm: [u32; 2], training: bool| {
        let facts = Facts::from_json(&json!({"head_dim_qk": d, "head_dim_v": d, "max_seqlen_q": 4096, "max_seqlen_kv": 4096,
            "qkv_layout": "bshd_bshd_bshd", "qkv_dtype": "bf16", "attn_mask_type": "causal", "is_training": training,
            "device_compute_capability": sm, "probe": {"cuda_device": true, "fused_attn_graph": true}}))
        .expect("valid");
        let d = policy.decide(&facts);
        d.selected
            .map(|s| policy.backends[s as usize].name.clone())
            .unwrap_or_default()
    };
    assert_eq!(selected(512, [9, 0], false), "fused");
    assert_eq!(selected(264, [9, 0], false), "fused");
    assert_eq!(selected(512, [9, 0], true), "fused");
    assert_eq!(selected(392, [9, 0], true), "fused");
    assert_eq!(selected(512, [10, 0], false), "chunked");
    assert_eq!(selected(256, [9, 0], false), "cudnn");
    assert_eq!(selected(520, [9, 0], false), "chunked");
    // The chain runs chunked when the fused kernel cannot (another GPU, a refusal at run time).
    let b = policy
        .backends
        .iter()
        .position(|b| b.name == "fused")
        .expect("fused backend");
    let chain: Vec<String> = policy
        .executor_chain(b as u16, None)
        .iter()
        .map(|e| e.executor.clone())
        .collect();
    assert_eq!(chain, ["fused", "chunked", "reference"]);
}

#[test]
fn without_gpu_small_problems_go_to_the_reference() {
    let policy = Policy::embedded("native").expect("native pack loads");
    let facts = Facts::from_json(&json!({"head_dim_qk": 64, "head_dim_v": 64, "max_seqlen_q": 128, "max_seqlen_kv": 128, "qkv_layout": "bshd_bshd_bshd",
        "probe": {"cuda_device": false, "fused_attn_graph": false}})).expect("valid");
    let d = policy.decide(&facts);
    assert_eq!(
        d.selected
            .map(|s| policy.backends[s as usize].name.as_str()),
        Some("reference")
    );
    let big = Facts::from_json(&json!({"head_dim_qk": 64, "head_dim_v": 64, "max_seqlen_q": 65536, "max_seqlen_kv": 65536, "qkv_layout": "bshd_bshd_bshd",
        "probe": {"cuda_device": false, "fused_attn_graph": false}})).expect("valid");
    let d = policy.decide(&big);
    assert_eq!(
        d.selected, None,
        "a huge problem without a GPU has no executor"
    );
    assert_eq!(big.get("probe.cuda_device"), Some(Value::Bool(false)));
}

/// Every backend of every embedded pack has an executor chain of catalogued executors, and
/// every te chain ends in the CPU reference (which runs small problems anywhere).
#[test]
fn embedded_packs_chain_every_backend_to_catalogued_executors() {
    let catalogue = std::sync::Arc::new(attn_policy_adapters::catalogue::catalogue());
    for pack in attn_policy::pack::embedded_pack_names() {
        let policy = attn_policy::PackSpec::embedded(pack)
            .with_catalogue(catalogue.clone())
            .load()
            .unwrap_or_else(|e| panic!("{pack} loads with the catalogue: {}", e.render(false)));
        for (b, backend) in policy.backends.iter().enumerate() {
            let chain = policy.executor_chain(b as u16, None);
            assert!(
                !chain.is_empty(),
                "{pack}: backend {} has no executor chain",
                backend.name
            );
            if pack == "te" {
                assert_eq!(
                    chain.last().map(|e| e.executor.as_str()),
                    Some("reference"),
                    "te: {}'s chain ends in reference",
                    backend.name
                );
            }
        }
    }
}
