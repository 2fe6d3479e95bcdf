//! Named configurations for `--preset`: the Gemma-4 shapes of the FROST pull request and a few
//! common ones. Each is a config object in the conformance format (a JSON fragment over the
//! defaults); flags given after `--preset` override it. Presets describe a machine, so they
//! also answer the probe facts as that machine would (documented per preset); `--probe`
//! overrides an answer.

use serde_json::{Value as Json, json};

pub struct Preset {
    pub name: &'static str,
    /// The pack family whose facts the config sets (`te` or `torch`).
    pub family: &'static str,
    pub about: &'static str,
    pub config: fn() -> Json,
}

/// A Blackwell (B200) machine with the FROST stack installed (cuDNN frontend 1.29, cutlass-dsl
/// 4.7.1) and flash-attn 2.8.3. FA4 4.0.0b11 conflicts with cutlass-dsl 4.7.1 (PR #3527), so it
/// is absent.
fn b200() -> Json {
    json!({
        "device_compute_capability": [10, 0],
        "cudnn_version": [9, 21, 0],
        "flash_attn_versions": {"v2": "2.8.3", "v3": null, "v4": null},
        "cudnn_frontend_version": "1.29.0",
        "cutlass_dsl_version": "4.7.1",
        // What the FROST pull request reports for B200: cuDNN's FROST engines serve
        // (256, 512]; the C++ fused path caps at 256 (set per preset below).
        "probe": {"frost_plan": true},
    })
}

fn merge(mut base: Json, extra: Json) -> Json {
    if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    base
}

/// Gemma-4 global layer of the PR: b2 hq8 hkv4 head_dim 512 causal bf16, training, bshd.
fn gemma4_global() -> Json {
    merge(
        b200(),
        json!({
            "qkv_dtype": "bf16", "qkv_layout": "bshd_bshd_bshd", "batch_size": 2,
            "num_heads": 8, "num_gqa_groups": 4, "max_seqlen_q": 8192, "max_seqlen_kv": 8192,
            "head_dim_qk": 512, "head_dim_v": 512, "attn_mask_type": "causal",
            "is_training": true, "softmax_scale": 0.044194173824159216,
            "probe": {"frost_plan": true, "fused_attn_graph": false},
        }),
    )
}

/// Gemma-4 sliding layer: head_dim 256 with a 1024-token causal window.
fn gemma4_sliding() -> Json {
    merge(
        gemma4_global(),
        json!({"head_dim_qk": 256, "head_dim_v": 256, "window_size": [1024, 0], "softmax_scale": 0.0625,
               "probe": {"frost_plan": true, "fused_attn_graph": true}}),
    )
}

/// An H100 with PyTorch's cuDNN 9.19 and no flash-attn (the GPU machine this project tests
/// on), training a right-padded batch of 4 sequences of up to 4096 tokens, causal, bf16, bshd:
/// what `attn_policy.transformers` tells the policy for one layer of a fine-tuning step.
fn h100_padded_train(model: Json) -> Json {
    merge(
        json!({
            "device_compute_capability": [9, 0], "cudnn_version": [9, 19, 0],
            "flash_attn_versions": {"v2": null, "v3": null, "v4": null},
            "qkv_dtype": "bf16", "qkv_layout": "bshd_bshd_bshd", "batch_size": 4,
            "max_seqlen_q": 4096, "max_seqlen_kv": 4096, "attn_mask_type": "padding_causal",
            "is_training": true, "probe": {"fused_attn_graph": true},
        }),
        model,
    )
}

fn cp(base: Json, comm: &str) -> Json {
    let (size, a2a) = if comm == "a2a+p2p" { (4, 2) } else { (2, 1) };
    merge(
        base,
        json!({"context_parallel": true, "cp_comm_type": comm, "cp_size": size, "cp_size_a2a": a2a}),
    )
}

/// Presets of the `te` family (packs `te` and `native`).
pub static PRESETS: &[Preset] = &[
    Preset {
        family: "te",
        name: "gemma4-global",
        about: "Gemma-4 global layer: d512 GQA 8/4 causal bf16 on B200, no CP",
        config: gemma4_global,
    },
    Preset {
        family: "te",
        name: "gemma4-global-cp-p2p",
        about: "Gemma-4 global layer under context parallelism, p2p ring (cp 2)",
        config: || cp(gemma4_global(), "p2p"),
    },
    Preset {
        family: "te",
        name: "gemma4-global-cp-all-gather",
        about: "Gemma-4 global layer, CP all_gather (cp 2)",
        config: || cp(gemma4_global(), "all_gather"),
    },
    Preset {
        family: "te",
        name: "gemma4-global-cp-a2a",
        about: "Gemma-4 global layer, CP a2a (cp 2)",
        config: || cp(gemma4_global(), "a2a"),
    },
    Preset {
        family: "te",
        name: "gemma4-global-cp-a2a-p2p",
        about: "Gemma-4 global layer, CP a2a+p2p (cp 4, a2a 2)",
        config: || cp(gemma4_global(), "a2a+p2p"),
    },
    Preset {
        family: "te",
        name: "gemma4-sliding",
        about: "Gemma-4 sliding layer: d256, window (1024, 0), B200, no CP",
        config: gemma4_sliding,
    },
    Preset {
        family: "te",
        name: "gemma4-sliding-cp-p2p",
        about: "Gemma-4 sliding layer, CP p2p (TE asserts: SWA needs a2a/all_gather)",
        config: || cp(gemma4_sliding(), "p2p"),
    },
    Preset {
        family: "te",
        name: "gemma4-sliding-cp-all-gather",
        about: "Gemma-4 sliding layer, CP all_gather",
        config: || cp(gemma4_sliding(), "all_gather"),
    },
    Preset {
        family: "te",
        name: "gemma4-sliding-cp-a2a",
        about: "Gemma-4 sliding layer, CP a2a",
        config: || cp(gemma4_sliding(), "a2a"),
    },
    Preset {
        family: "te",
        name: "gemma4-sliding-cp-a2a-p2p",
        about: "Gemma-4 sliding layer, CP a2a+p2p",
        config: || cp(gemma4_sliding(), "a2a+p2p"),
    },
    Preset {
        family: "te",
        name: "llama3-8b-h100",
        about: "Llama-3 8B training layer on H100: d128 GQA 32/8 causal bf16, s 8192, flash-attn 2.8.3 + 3.0.0",
        config: || {
            json!({
                "device_compute_capability": [9, 0], "cudnn_version": [9, 19, 0],
                "flash_attn_versions": {"v2": "2.8.3", "v3": "3.0.0", "v4": null, "fa3_supports_softcap": true},
                "qkv_dtype": "bf16", "qkv_layout": "bshd_bshd_bshd", "batch_size": 1, "num_heads": 32,
                "num_gqa_groups": 8, "max_seqlen_q": 8192, "max_seqlen_kv": 8192, "head_dim_qk": 128,
                "head_dim_v": 128, "attn_mask_type": "causal", "softmax_scale": 0.08838834764831843,
                "probe": {"fused_attn_graph": true},
            })
        },
    },
    Preset {
        family: "te",
        name: "qwen3",
        about: "Qwen3-8B layer, right-padded training batch on H100: d128 GQA 32/8, padding_causal",
        config: || {
            h100_padded_train(
                json!({"num_heads": 32, "num_gqa_groups": 8, "head_dim_qk": 128,
                "head_dim_v": 128, "softmax_scale": 0.08838834764831843}),
            )
        },
    },
    Preset {
        family: "te",
        name: "mistral",
        about: "Mistral-7B layer, right-padded training batch on H100: d128 GQA 32/8, sliding window 4096",
        config: || {
            h100_padded_train(
                json!({"num_heads": 32, "num_gqa_groups": 8, "head_dim_qk": 128,
                "head_dim_v": 128, "window_size": [4095, 0], "softmax_scale": 0.08838834764831843}),
            )
        },
    },
    Preset {
        family: "te",
        name: "gemma2",
        about: "Gemma-2-9B sliding layer, right-padded training batch on H100: d256 GQA 16/8, softcap 50, window 4096",
        config: || {
            h100_padded_train(
                json!({"num_heads": 16, "num_gqa_groups": 8, "head_dim_qk": 256,
                "head_dim_v": 256, "window_size": [4095, 0], "softcap": 50.0, "softmax_scale": 0.0625}),
            )
        },
    },
    Preset {
        family: "te",
        name: "gemma3",
        about: "Gemma-3-12B sliding layer, right-padded training batch on H100: d256 GQA 16/8, window 1024",
        config: || {
            h100_padded_train(
                json!({"num_heads": 16, "num_gqa_groups": 8, "head_dim_qk": 256,
                "head_dim_v": 256, "window_size": [1023, 0], "softmax_scale": 0.0625}),
            )
        },
    },
    Preset {
        family: "te",
        name: "gpt-oss",
        about: "gpt-oss-20b sliding layer, right-padded training batch on H100: d64 GQA 64/8, learnable sinks, window 128",
        config: || {
            h100_padded_train(
                json!({"num_heads": 64, "num_gqa_groups": 8, "head_dim_qk": 64,
                "head_dim_v": 64, "window_size": [127, 0], "softmax_type": "learnable",
                "softmax_scale": 0.125}),
            )
        },
    },
    Preset {
        family: "te",
        name: "deepseek-v3",
        about: "DeepSeek-V3 MLA layer, right-padded training batch on H100: 128 heads, head_dim_qk 192, head_dim_v 128",
        config: || {
            h100_padded_train(
                json!({"num_heads": 128, "num_gqa_groups": 128, "head_dim_qk": 192,
                "head_dim_v": 128, "softmax_scale": 0.07216878364870323}),
            )
        },
    },
    Preset {
        family: "te",
        name: "a100-d256-inference",
        about: "A100 inference, d256 MHA causal fp16, flash-attn 2.8.3",
        config: || {
            json!({
                "device_compute_capability": [8, 0], "cudnn_version": [9, 19, 0],
                "flash_attn_versions": {"v2": "2.8.3", "v3": null, "v4": null},
                "qkv_dtype": "fp16", "qkv_layout": "bshd_bshd_bshd", "batch_size": 4, "num_heads": 16,
                "num_gqa_groups": 16, "max_seqlen_q": 2048, "max_seqlen_kv": 2048, "head_dim_qk": 256,
                "head_dim_v": 256, "attn_mask_type": "causal", "is_training": false, "softmax_scale": 0.0625,
                "probe": {"fused_attn_graph": true},
            })
        },
    },
];

/// A PyTorch 2.11 SDPA call on `sm` (as conformance records name the device: torch 2.11 with
/// cuDNN 9.19) over `call`, the `sdp_params` fields it sets.
fn sdpa(sm: &str, call: Json) -> Json {
    merge(
        json!({
            "torch": {"version": "2.11.0+cu130", "cudnn": 91900, "sm": sm},
            "batch": 4, "heads_q": 32, "heads_kv": 32, "seqlen_q": 4096, "seqlen_kv": 4096,
            "head_dim_qk": 128, "head_dim_v": 128, "dtype": "bf16", "is_causal": false,
            "attn_mask": null, "dropout_p": 0.0, "enable_gqa": false, "scale": null,
            "requires_grad": false, "layout": "bhsd", "deterministic": false,
        }),
        call,
    )
}

/// Presets of the `torch` family (pack `torch`): SDPA calls that land on each of its backends.
pub static TORCH_PRESETS: &[Preset] = &[
    Preset {
        family: "torch",
        name: "sdpa-h100-gqa-causal-train",
        about: "SDPA on H100: d128 GQA 32/8 causal bf16 training, s 4096",
        config: || {
            sdpa(
                "90",
                json!({"heads_kv": 8, "enable_gqa": true, "is_causal": true, "requires_grad": true}),
            )
        },
    },
    Preset {
        family: "torch",
        name: "sdpa-h100-causal-inference",
        about: "SDPA on H100: d128 MHA causal bf16 inference, s 4096",
        config: || sdpa("90", json!({"is_causal": true})),
    },
    Preset {
        family: "torch",
        name: "sdpa-h100-fp32-mask",
        about: "SDPA on H100: d64 fp32 with a boolean mask broadcast over heads",
        config: || {
            sdpa(
                "90",
                json!({"dtype": "fp32", "head_dim_qk": 64, "head_dim_v": 64, "attn_mask": "bool_bcast"}),
            )
        },
    },
    Preset {
        family: "torch",
        name: "sdpa-h100-d256-dropout-train",
        about: "SDPA on H100: d256 bf16 training with dropout 0.1",
        config: || {
            sdpa(
                "90",
                json!({"head_dim_qk": 256, "head_dim_v": 256, "dropout_p": 0.1, "requires_grad": true}),
            )
        },
    },
    Preset {
        family: "torch",
        name: "sdpa-h100-d512",
        about: "SDPA on H100: d512 bf16 causal (past flash and cuDNN's head_dim limits)",
        config: || {
            sdpa(
                "90",
                json!({"head_dim_qk": 512, "head_dim_v": 512, "is_causal": true}),
            )
        },
    },
    Preset {
        family: "torch",
        name: "sdpa-h100-strided-lastdim",
        about: "SDPA on H100: d64 bf16 whose last dimension is strided (no fused kernel takes it)",
        config: || {
            sdpa(
                "90",
                json!({"head_dim_qk": 64, "head_dim_v": 64, "layout": "noncontig_lastdim"}),
            )
        },
    },
    Preset {
        family: "torch",
        name: "sdpa-a100-fp16-decode",
        about: "SDPA on A100: fp16 d128 decode step (one query over 8192 keys)",
        config: || {
            sdpa(
                "80",
                json!({"dtype": "fp16", "seqlen_q": 1, "seqlen_kv": 8192}),
            )
        },
    },
];

/// Every preset of every family.
pub fn all() -> impl Iterator<Item = &'static Preset> {
    PRESETS.iter().chain(TORCH_PRESETS)
}

/// The presets of one pack family.
pub fn of_family(family: &str) -> impl Iterator<Item = &'static Preset> {
    all().filter(move |p| p.family == family)
}

pub fn find(name: &str) -> Option<&'static Preset> {
    all().find(|p| p.name == name)
}

pub fn names() -> impl Iterator<Item = &'static str> {
    all().map(|p| p.name)
}
