//! Decision grid of the `te` pack (docs/analysis.md, "Decision grid"): a cartesian product of
//! the facts that matter most, one compact line per configuration
//! `config -> selected backend (variant) | declined-by summary`, stored as an insta snapshot.
//! Any rule change shows its effect here as a reviewable diff; CI fails on an unreviewed
//! change (insta does not write snapshots under `CI`; review with `cargo insta review`).
//!
//! Fixed for every line: bshd_bshd_bshd, batch 2, 16 heads (no GQA), seqlen 8192 (self
//! attention), cp_size 2, no bias/dropout/softcap, cuDNN 9.19.0, cudnn-frontend 1.29.0,
//! cutlass-dsl 4.7.1, flash-attn 2.7.4 (no FA3/FA4), every probe answered "supported".

use attn_policy::Status;
use attn_policy::{Facts, Policy};
use serde_json::{Value as Json, json};

fn grid() -> Vec<(String, Json)> {
    let mut out = Vec::new();
    for sm in [80, 90, 100, 103, 120] {
        for (dq, dv) in [
            (64, 64),
            (128, 128),
            (192, 128),
            (256, 256),
            (320, 320),
            (512, 512),
        ] {
            for fp8 in [false, true] {
                for mask in ["causal", "no_mask"] {
                    for win in [json!(null), json!([128, 0])] {
                        for cp in ["-", "p2p", "a2a", "all_gather"] {
                            for train in [true, false] {
                                let mut c = json!({
                                    "device_compute_capability": [sm / 10, sm % 10],
                                    "head_dim_qk": dq, "head_dim_v": dv,
                                    "qkv_dtype": "bf16", "qkv_layout": "bshd_bshd_bshd",
                                    "attn_mask_type": mask, "window_size": win,
                                    "batch_size": 2, "num_heads": 16, "num_gqa_groups": 16,
                                    "max_seqlen_q": 8192, "max_seqlen_kv": 8192,
                                    "context_parallel": cp != "-", "cp_size": 2,
                                    "cp_size_a2a": 2, "is_training": train,
                                    "core_attention_bias_type": "no_bias",
                                    "cudnn_version": "9.19.0",
                                    "cudnn_frontend_version": "1.29.0",
                                    "cutlass_dsl_version": "4.7.1",
                                    "flash_attn_versions": {"v2": "2.7.4"},
                                    "probe": {"fused_attn_graph": true, "frost_plan": true,
                                              "cuda_device": true}
                                });
                                if cp != "-" {
                                    c["cp_comm_type"] = json!(cp);
                                }
                                if fp8 {
                                    c["fp8"] = json!(true);
                                    c["fp8_recipe"] = json!({"recipe": "DelayedScaling",
                                        "fp8_dpa": true, "fp8_mha": false});
                                }
                                let label = format!(
                                    "sm{sm} d{dq}/{dv} {} {mask} win={} cp={cp} {}",
                                    if fp8 { "fp8dpa" } else { "bf16" },
                                    if win.is_null() { "-" } else { "128,0" },
                                    if train { "train" } else { "infer" },
                                );
                                out.push((label, c));
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

fn short(name: &str) -> &str {
    match name {
        "FlashAttention" => "Flash",
        "FusedAttention" => "Fused",
        "FrostAttention" => "Frost",
        "UnfusedDotProductAttention" => "Unfused",
        n => n,
    }
}

/// One line: `config -> selected (variant) | Backend:first declining rules ...`.
fn line(p: &Policy, label: &str, cfg: &Json) -> String {
    let facts = Facts::from_json(cfg).unwrap_or_else(|e| panic!("{label}: {e}"));
    let d = p.decide(&facts);
    let sel = match d.selected {
        Some(b) => {
            let bk = &p.backends[b as usize];
            match d.backends[b as usize].variant {
                Some(v) if !bk.variants.is_empty() => {
                    format!("{} ({})", short(&bk.name), bk.variants[v as usize].name)
                }
                _ => short(&bk.name).to_string(),
            }
        }
        None => "NONE".to_string(),
    };
    let mut parts = Vec::new();
    for (bi, bk) in p.backends.iter().enumerate() {
        if d.selected == Some(bi as u16) {
            continue;
        }
        let st = &d.backends[bi].status;
        let mut ids: Vec<&str> = d
            .fired
            .iter()
            .map(|&r| &p.rules[r as usize])
            .filter(|r| r.backend as usize == bi)
            .map(|r| r.id.as_str())
            .collect();
        ids.dedup();
        let more = ids.len().saturating_sub(3);
        ids.truncate(3);
        let what = match st {
            Status::Outranked { .. } => "eligible".to_string(),
            Status::Undecided => "undecided".to_string(),
            _ if ids.is_empty() => "n/a".to_string(),
            _ if more > 0 => format!("{}+{more}", ids.join(",")),
            _ => ids.join(","),
        };
        parts.push(format!("{}:{what}", short(&bk.name)));
    }
    format!("{label} -> {sel} | {}", parts.join(" "))
}

#[test]
fn te_decision_grid() {
    let p = Policy::embedded("te").expect("te pack");
    let g = grid();
    assert_eq!(g.len(), 5 * 6 * 2 * 2 * 2 * 4 * 2);
    let text: Vec<String> = g.iter().map(|(l, c)| line(&p, l, c)).collect();
    insta::assert_snapshot!("te_decision_grid", text.join("\n"));
}
