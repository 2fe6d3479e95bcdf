//! The FROST pull request (NVIDIA/TransformerEngine #3527) as a checklist, against the `te`
//! pack (issue 30, part 8). Each case is a configuration the pull request describes and the
//! outcome it states: FrostAttention selected, or declined by the FR rule that encodes the
//! reason it gives (and, where the pull request says what happens then, the backend that is
//! selected instead). Configurations and outcomes are restated here in this project's terms;
//! nothing is read from outside the repository.
//!
//! The base is the pull request's motivating shape: a Gemma-4 global layer (batch 2, 8 query
//! heads over 4 KV heads, head_dim 512, causal, bf16, training, bshd, 8192 tokens) on a B200
//! with the stack FROST needs (cuDNN frontend 1.29.0, cutlass-dsl 4.7.1; flash-attn 2.8.3, no
//! FA3/FA4). The probes are answered as the pull request measured on that machine: cuDNN
//! returns a FROST plan, and the C++ fused path has no d512 graph.
//!
//! Where cli/tests/frost_rules.rs checks each rule through the CLI with a neighbour that just
//! passes it, this file follows the pull request's own statements (its scope, its list of
//! declines, the context-parallel matrix it ran, the dependency floors, the preference), and
//! [`every_frost_rule_is_on_the_checklist`] keeps the two in step with the pack.

use std::collections::BTreeSet;

use attn_policy::BackendStatus;
use attn_policy::{Explanation, Policy};
use serde_json::{Value as Json, json};

const FROST: &str = "FrostAttention";
const UNFUSED: &str = "UnfusedDotProductAttention";

/// What the pull request says happens to a configuration.
#[derive(Debug)]
enum Want {
    /// FrostAttention is selected.
    Frost,
    /// FrostAttention is declined by exactly these rules (in pack order) and not selected;
    /// `then` is the decision that follows when the pull request states it (`Some(None)`: no
    /// backend at all).
    Declined {
        rules: &'static [&'static str],
        then: Option<Option<&'static str>>,
    },
    /// A different backend is selected and FrostAttention is eligible but outranked by it.
    OutrankedBy(&'static str),
    /// The input is refused when read (a typed input error), before any rule runs.
    Refused,
}

use Want::*;

fn declined(rules: &'static [&'static str]) -> Want {
    Declined { rules, then: None }
}

struct Case {
    /// The pull request's statement, in short.
    seed: &'static str,
    /// Keys replaced in the base config (a nested object is replaced whole).
    set: Json,
    want: Want,
}

fn case(seed: &'static str, set: Json, want: Want) -> Case {
    Case { seed, set, want }
}

fn base() -> Json {
    json!({
        "device_compute_capability": [10, 0],
        "cudnn_version": [9, 21, 0],
        "flash_attn_versions": {"v2": "2.8.3", "v3": null, "v4": null},
        "cudnn_frontend_version": "1.29.0",
        "cutlass_dsl_version": "4.7.1",
        "qkv_type": "Tensor",
        "qkv_dtype": "bf16",
        "qkv_layout": "bshd_bshd_bshd",
        "batch_size": 2,
        "num_heads": 8,
        "num_gqa_groups": 4,
        "max_seqlen_q": 8192,
        "max_seqlen_kv": 8192,
        "head_dim_qk": 512,
        "head_dim_v": 512,
        "attn_mask_type": "causal",
        "is_training": true,
        "probe": {"frost_plan": true, "fused_attn_graph": false},
    })
}

fn with(set: &Json) -> Json {
    let mut config = base();
    let obj = config.as_object_mut().expect("object");
    for (k, v) in set.as_object().expect("an object of keys to set") {
        obj.insert(k.clone(), v.clone());
    }
    config
}

/// Context parallelism over `size` ranks with `comm` (a2a+p2p: `size` / 2 rings of 2).
fn cp(comm: &str, size: u32) -> Json {
    let a2a = if comm == "a2a+p2p" { 2 } else { 1 };
    json!({"context_parallel": true, "cp_comm_type": comm, "cp_size": size, "cp_size_a2a": a2a})
}

/// `a` with the keys of `b` added.
fn and(mut a: Json, b: Json) -> Json {
    let m = a.as_object_mut().expect("object");
    for (k, v) in b.as_object().expect("object") {
        m.insert(k.clone(), v.clone());
    }
    a
}

fn checklist() -> Vec<Case> {
    let window = json!({"window_size": [1024, 0]});
    vec![
        // ---- scope: what FROST serves
        case(
            "the motivating shape (Gemma-4 global layer, d512, causal) runs on FROST",
            json!({}),
            Frost,
        ),
        case(
            "bf16 and fp16 are served (fp16)",
            json!({"qkv_dtype": "fp16"}),
            Frost,
        ),
        case(
            "SM103 is served",
            json!({"device_compute_capability": [10, 3]}),
            Frost,
        ),
        case(
            "symmetric head_dim in (256, 512]: 320 (a verified numerics shape)",
            json!({"head_dim_qk": 320, "head_dim_v": 320}),
            Frost,
        ),
        case(
            "no_mask is a served mask type",
            json!({"attn_mask_type": "no_mask"}),
            Frost,
        ),
        case(
            "causal_bottom_right is a served mask type (without context parallelism)",
            json!({"attn_mask_type": "causal_bottom_right", "max_seqlen_q": 4096}),
            Frost,
        ),
        case(
            "sbhd is served directly (Megatron's layout)",
            json!({"qkv_layout": "sbhd_sbhd_sbhd"}),
            Frost,
        ),
        case(
            "MHA as well as GQA (8 query heads, 8 KV heads)",
            json!({"num_gqa_groups": 8}),
            Frost,
        ),
        case(
            "inference without a KV cache is served",
            json!({"is_training": false}),
            Frost,
        ),
        // ---- context parallelism: the matrix the pull request ran (bshd and sbhd, CP=2 and
        // CP=4; a2a+p2p on 4 ranks as 2 a2a x 2 p2p)
        case("p2p, CP=2, bshd", cp("p2p", 2), Frost),
        case("p2p, CP=4, bshd", cp("p2p", 4), Frost),
        case(
            "p2p, CP=4, sbhd (the relaxed sbhd assertion)",
            and(cp("p2p", 4), json!({"qkv_layout": "sbhd_sbhd_sbhd"})),
            Frost,
        ),
        case("all_gather, CP=2, bshd", cp("all_gather", 2), Frost),
        case("all_gather, CP=4, bshd", cp("all_gather", 4), Frost),
        case(
            "all_gather, CP=2, sbhd",
            and(cp("all_gather", 2), json!({"qkv_layout": "sbhd_sbhd_sbhd"})),
            Frost,
        ),
        case("a2a, CP=2, bshd", cp("a2a", 2), Frost),
        case("a2a, CP=4, bshd", cp("a2a", 4), Frost),
        case(
            "a2a, CP=2, sbhd",
            and(cp("a2a", 2), json!({"qkv_layout": "sbhd_sbhd_sbhd"})),
            Frost,
        ),
        case(
            "a2a+p2p on 4 ranks (2 a2a x 2 p2p)",
            cp("a2a+p2p", 4),
            Frost,
        ),
        case(
            "RG.a2a_heads: a2a+p2p splits heads across its a2a group (3 KV heads over 2 ranks)",
            and(
                cp("a2a+p2p", 4),
                json!({"num_heads": 6, "num_gqa_groups": 3}),
            ),
            declined(&["RG.a2a_heads"]),
        ),
        case(
            "RG.a2a_heads: a2a over 8 ranks cannot split 4 KV heads",
            cp("a2a", 8),
            declined(&["RG.a2a_heads"]),
        ),
        // ---- the problem it solves and the preference (FR.P)
        case(
            "FR.P: where FROST and unfused both serve d512, FROST suppresses unfused",
            json!({}),
            Frost,
        ),
        case(
            "FR.P: FROST never displaces a backend ahead of it (a fused d512 graph wins)",
            json!({"probe": {"frost_plan": true, "fused_attn_graph": true}}),
            OutrankedBy("FusedAttention"),
        ),
        case(
            "the problem: d512 with CP and no FROST (SM90) has no backend at all",
            and(cp("p2p", 2), json!({"device_compute_capability": [9, 0]})),
            Declined {
                rules: &["FR.2"],
                then: Some(None),
            },
        ),
        case(
            "without CP and without FROST, unfused covers d512",
            json!({"device_compute_capability": [9, 0]}),
            Declined {
                rules: &["FR.2"],
                then: Some(Some(UNFUSED)),
            },
        ),
        case(
            "Gemma 4 end to end: the sliding layers (d256, 1024 window) run on FlashAttention",
            json!({"head_dim_qk": 256, "head_dim_v": 256, "window_size": [1024, 0],
                   "probe": {"frost_plan": true, "fused_attn_graph": true}}),
            Declined {
                rules: &["FR.7"],
                then: Some(Some("FlashAttention")),
            },
        ),
        // ---- the switches
        case(
            "FR.1: NVTE_FROST_ATTN=0 turns FROST off (unfused serves without CP)",
            json!({"env": {"NVTE_FROST_ATTN": "0"}}),
            Declined {
                rules: &["FR.1"],
                then: Some(Some(UNFUSED)),
            },
        ),
        case(
            "FR.29: an explicit CUDNN_FRONTEND_ENABLE_FROST_ENGINES=0 declines cleanly",
            json!({"env": {"CUDNN_FRONTEND_ENABLE_FROST_ENGINES": "0"}}),
            declined(&["FR.29"]),
        ),
        // ---- scope limits: architecture, dtype, head dims, layout, mask
        case(
            "FR.2: SM100/SM103 only (SM90)",
            json!({"device_compute_capability": [9, 0]}),
            declined(&["FR.2"]),
        ),
        case(
            "FR.2: SM100/SM103 only (SM120)",
            json!({"device_compute_capability": [12, 0]}),
            declined(&["FR.2"]),
        ),
        case(
            "FR.3: bf16/fp16 only (fp32)",
            json!({"qkv_dtype": "fp32"}),
            declined(&["FR.3"]),
        ),
        case(
            "FR.4: a quantized qkv_type with a nominal bf16 dtype outside FP8 autocast",
            json!({"qkv_type": "Float8Tensor"}),
            declined(&["FR.4"]),
        ),
        case(
            "FR.5: no FP8 attention",
            json!({"fp8": true,
                   "fp8_recipe": {"recipe": "DelayedScaling", "fp8_dpa": true, "fp8_mha": false}}),
            declined(&["FR.5"]),
        ),
        case(
            "FR.6: symmetric head dims only (512 / 256)",
            json!({"head_dim_v": 256}),
            declined(&["FR.6"]),
        ),
        case(
            "FR.7: the band is (256, 512] (256 is below it)",
            json!({"head_dim_qk": 256, "head_dim_v": 256}),
            declined(&["FR.7"]),
        ),
        case(
            "FR.7: the band is (256, 512] (520 is above it)",
            json!({"head_dim_qk": 520, "head_dim_v": 520}),
            declined(&["FR.7"]),
        ),
        case(
            "FR.8: head_dim a multiple of 8 (260 passed the band, then failed at plan selection)",
            json!({"head_dim_qk": 260, "head_dim_v": 260}),
            declined(&["FR.8"]),
        ),
        case(
            "FR.9: thd is not implemented",
            json!({"qkv_layout": "thd_thd_thd", "num_tokens_q": 16384, "num_tokens_kv": 16384}),
            declined(&["FR.9"]),
        ),
        case(
            "FR.10: padding masks are out",
            json!({"attn_mask_type": "padding_causal"}),
            declined(&["FR.10"]),
        ),
        // ---- the explicit declines the pull request lists
        case(
            "FR.11: attention bias",
            json!({"core_attention_bias_type": "post_scale_bias",
                   "core_attention_bias_shape": [1, 8, 8192, 8192]}),
            declined(&["FR.11"]),
        ),
        case(
            "FR.11: ALiBi counts as bias",
            json!({"core_attention_bias_type": "alibi"}),
            declined(&["FR.11"]),
        ),
        case(
            "FR.12: dropout",
            json!({"attention_dropout": 0.1}),
            declined(&["FR.12"]),
        ),
        case(
            "FR.13: softcap",
            json!({"softcap": 30.0}),
            declined(&["FR.13"]),
        ),
        case(
            "FR.14: non-vanilla softmax, declined in the selector instead of the CP assert",
            and(cp("a2a", 2), json!({"softmax_type": "off-by-one"})),
            declined(&["FR.14"]),
        ),
        case(
            "FR.15: max_logit",
            json!({"return_max_logit": true}),
            declined(&["FR.15"]),
        ),
        case(
            "FR.16: KV caching",
            json!({"is_training": false, "inference": {"is_paged": false}}),
            declined(&["FR.16"]),
        ),
        case(
            "FR.16: KV caching, paged",
            json!({"is_training": false,
                   "inference": {"is_paged": true, "page_size": 256, "total_num_pages": 128,
                                 "max_pages_per_seq": 64}}),
            declined(&["FR.16"]),
        ),
        // ---- the five capabilities that were silently ignored
        case(
            "FR.17: score_mod",
            json!({"has_score_mod": true}),
            declined(&["FR.17"]),
        ),
        case(
            "FR.17: score_mod_bprop without score_mod ends with no backend available",
            json!({"has_score_mod_bprop": true}),
            Declined {
                rules: &["FR.17"],
                then: Some(None),
            },
        ),
        case(
            "FR.18: num_splits",
            json!({"num_splits": 2}),
            declined(&["FR.18"]),
        ),
        case(
            "FR.19: checkpoint_core_attention",
            json!({"checkpoint_core_attention": true}),
            declined(&["FR.19"]),
        ),
        case(
            "FR.20: CUDA graph capture",
            json!({"cuda_graph": true}),
            declined(&["FR.20"]),
        ),
        // ---- determinism: cuDNN refuses a deterministic FROST backward
        case(
            "FR.21: deterministic training declines FROST",
            json!({"deterministic": true}),
            declined(&["FR.21"]),
        ),
        case(
            "FR.21: NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 is honoured (it asks for determinism)",
            json!({"env": {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}}),
            declined(&["FR.21"]),
        ),
        case(
            "FR.21: only the backward is missing: deterministic inference runs on FROST",
            json!({"deterministic": true, "is_training": false}),
            Frost,
        ),
        // ---- sliding windows
        case(
            "a sliding window is served without context parallelism",
            window.clone(),
            Frost,
        ),
        case(
            "a sliding window is served with all_gather",
            and(cp("all_gather", 2), window.clone()),
            Frost,
        ),
        case(
            "a sliding window is served with a2a",
            and(cp("a2a", 2), window.clone()),
            Frost,
        ),
        case(
            "FR.22: a sliding window with p2p declines (the ring discards it)",
            and(cp("p2p", 2), window.clone()),
            declined(&["FR.22"]),
        ),
        case(
            "FR.22: a sliding window with a2a+p2p declines",
            and(cp("a2a+p2p", 4), window.clone()),
            declined(&["FR.22"]),
        ),
        case(
            "FR.22 keys on the window, not on p2p: no real window under p2p runs on FROST",
            and(cp("p2p", 2), json!({"window_size": [-1, 0]})),
            Frost,
        ),
        case(
            "window (0, 0), the boundary of cuDNN's convention, is served",
            json!({"window_size": [0, 0]}),
            Frost,
        ),
        case(
            "FR.25: a windowed non-causal mask with unequal lengths declines (anchor ambiguity)",
            json!({"attn_mask_type": "no_mask", "window_size": [128, 128], "max_seqlen_q": 4096}),
            declined(&["FR.25"]),
        ),
        case(
            "a windowed non-causal mask with equal lengths is served",
            json!({"attn_mask_type": "no_mask", "window_size": [128, 128]}),
            Frost,
        ),
        case(
            "FR.26: a left bound below -1 is refused before the selector",
            json!({"window_size": [-2, 0]}),
            Refused,
        ),
        case(
            "FR.26: a window that is not a pair is refused before the selector",
            json!({"window_size": [128, 0, 0]}),
            Refused,
        ),
        // ---- CP mask limits
        case(
            "FR.23: causal cross-attention under CP declines",
            and(cp("p2p", 2), json!({"max_seqlen_q": 4096})),
            declined(&["FR.23"]),
        ),
        case(
            "FR.23: no_mask with unequal lengths under CP stays allowed",
            and(
                cp("p2p", 2),
                json!({"max_seqlen_q": 4096, "attn_mask_type": "no_mask"}),
            ),
            Frost,
        ),
        case(
            "FR.24: bottom-right masking under CP declines",
            and(
                cp("all_gather", 2),
                json!({"attn_mask_type": "causal_bottom_right"}),
            ),
            declined(&["FR.24"]),
        ),
        // ---- dependency floors
        case(
            "FR.27: cuDNN frontend 1.28 has the d512 forward but not the backward",
            json!({"cudnn_frontend_version": "1.28.0"}),
            declined(&["FR.27"]),
        ),
        case(
            "FR.27: a pre-release 1.29.0rc1 counts below the floor",
            json!({"cudnn_frontend_version": "1.29.0rc1"}),
            declined(&["FR.27"]),
        ),
        case(
            "FR.27: cuDNN frontend not installed",
            json!({"cudnn_frontend_version": null}),
            declined(&["FR.27"]),
        ),
        case(
            "FR.28: cutlass-dsl 4.6.2 satisfies the frontend's declared floor but FROST declines",
            json!({"cutlass_dsl_version": "4.6.2"}),
            declined(&["FR.28"]),
        ),
        case(
            "FR.28: a pre-release 4.7.0rc1 counts below the floor",
            json!({"cutlass_dsl_version": "4.7.0rc1"}),
            declined(&["FR.28"]),
        ),
        case(
            "FR.28: cutlass-dsl not installed (it only arrives with flash-attn-4)",
            json!({"cutlass_dsl_version": null}),
            declined(&["FR.28"]),
        ),
        case(
            "FR.27 + FR.28: the stock 26.08 container (frontend 1.26.0, cutlass-dsl 4.6.2)",
            json!({"cudnn_frontend_version": "1.26.0", "cutlass_dsl_version": "4.6.2"}),
            declined(&["FR.27", "FR.28"]),
        ),
        case(
            "FR.plan: the chosen plan is checked by name; a non-FROST plan declines",
            json!({"probe": {"frost_plan": false, "fused_attn_graph": false}}),
            declined(&["FR.plan"]),
        ),
    ]
}

/// What the pack decides for `config`, against `want`; `None` when it matches.
fn mismatch(policy: &Policy, config: &Json, want: &Want) -> Option<String> {
    let facts = match policy.read_facts(config) {
        Ok(facts) => facts,
        Err(_) if matches!(want, Refused) => return None,
        Err(e) => return Some(format!("refused when read: {e}")),
    };
    if matches!(want, Refused) {
        return Some("read, but the pull request's input is invalid".into());
    }
    let decision = policy.decide(&facts);
    let ex = Explanation::new(policy, &facts, &decision);
    let frost = ex.backend(FROST).expect("FrostAttention in the te pack");
    let rules: Vec<&str> = frost.declined_by.iter().map(|r| r.id.as_str()).collect();
    let pending: Vec<&str> = frost.pending.iter().map(|r| r.id.as_str()).collect();
    let got = format!(
        "selected {:?}, FrostAttention {} (declined by {rules:?}, pending {pending:?}){}",
        ex.selected,
        frost.status.word(),
        if decision.pending {
            ", provisional"
        } else {
            ""
        }
    );
    let ok = match want {
        Frost => ex.selected.as_deref() == Some(FROST) && !decision.pending && rules.is_empty(),
        Declined { rules: want, then } => {
            !frost.status.eligible()
                && ex.selected.as_deref() != Some(FROST)
                && rules == *want
                && then.is_none_or(|t| ex.selected.as_deref() == t && !decision.pending)
        }
        OutrankedBy(by) => {
            ex.selected.as_deref() == Some(*by)
                && frost.status
                    == BackendStatus::Outranked {
                        by: Some(by.to_string()),
                    }
        }
        Refused => unreachable!(),
    };
    (!ok).then_some(got)
}

#[test]
fn the_pull_requests_configurations_decide_as_it_states() {
    let policy = Policy::embedded("te").expect("te");
    let cases = checklist();
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| {
            let got = mismatch(&policy, &with(&c.set), &c.want)?;
            Some(format!(
                "- {}\n    set {}\n    want {:?}\n    got  {got}",
                c.seed, c.set, c.want
            ))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} checklist items decide otherwise:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// The unconditional outcome of the base: FROST selected over an eligible unfused backend
/// (FR.P, "it suppresses unfused when both are eligible"), by name in the TE tuple too.
#[test]
fn frost_suppresses_unfused_in_the_te_tuple() {
    let policy = Policy::embedded("te").expect("te");
    let facts = policy.read_facts(&base()).expect("base");
    let decision = policy.decide(&facts);
    let ex = Explanation::new(&policy, &facts, &decision);
    assert_eq!(
        ex.backend(UNFUSED).expect("unfused").status,
        BackendStatus::Outranked {
            by: Some(FROST.into())
        }
    );
    let te = ex.to_te();
    assert_eq!(te["use_frost_attention"], true);
    assert_eq!(te["use_unfused_attention"], false);
    assert_eq!(te["use_fused_attention"], false);
    assert_eq!(te["use_flash_attention"], false);
}

/// Every rule that can decline FrostAttention in the te pack (its own FR rules and the layer
/// rules that name it) is an item of the checklist, and every rule the checklist names is one
/// of them: a new rule needs its case from the pull request, a renamed one fails here.
#[test]
fn every_frost_rule_is_on_the_checklist() {
    let policy = Policy::embedded("te").expect("te");
    let frost = policy.backend_index(FROST).expect("FrostAttention") as u16;
    let in_pack: BTreeSet<&str> = policy
        .rules
        .iter()
        .filter(|r| r.backend == frost)
        .map(|r| r.id.as_str())
        .collect();
    let cases = checklist();
    let named: BTreeSet<&str> = cases
        .iter()
        .filter_map(|c| match &c.want {
            Declined { rules, .. } => Some(rules.iter().copied()),
            _ => None,
        })
        .flatten()
        // FR.26 is refused when read (its cases are `Refused`): it is TE's own check, kept in
        // the pack, that no valid input reaches.
        .chain(["FR.26"])
        .collect();
    assert!(in_pack.len() >= 30, "{in_pack:?}");
    assert_eq!(in_pack, named);
}

/// The pull request: an unparseable cuDNN frontend version does not decline; it defers to the
/// check of the plan by name (FROST selected when the plan is a FROST plan, declined by
/// FR.plan when it is not): the third version state (present but unparseable).
#[test]
fn fr27_unparseable_frontend_version_defers_to_the_plan_name_check() {
    let policy = Policy::embedded("te").expect("te");
    let unparseable = json!({"cudnn_frontend_version": "not-a-version"});
    assert_eq!(
        mismatch(&policy, &with(&unparseable), &Frost),
        None,
        "with a passing plan-name check"
    );
    let no_plan = and(
        unparseable,
        json!({"probe": {"frost_plan": false, "fused_attn_graph": false}}),
    );
    assert_eq!(
        mismatch(&policy, &with(&no_plan), &declined(&["FR.plan"])),
        None,
        "with a failing plan-name check"
    );
}
