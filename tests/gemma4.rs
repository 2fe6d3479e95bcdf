//! The Gemma-4 cases of the FROST pull request (#3527), explained by the `te` pack: sliding
//! layers at head_dim 256 (with and without their 1024-token window), global layers at 512;
//! without CP and with CP p2p / all_gather / a2a / a2a+p2p; on sm90 and sm100.
//!
//! Probes are answered as measured: FROST returns its plan on B200 (cuDNN frontend 1.29.0,
//! cutlass-dsl 4.7.1; PR #3527), and the C++ fused path has a graph at head_dim 256 but none at
//! 512 (PR: "the C++ cuDNN fused path caps at 256" on B200; on H200 cuDNN returns no d512
//! backward engine, measured with the raw cuDNN SDPA recipe in docs/cudnn.md). Snapshots reviewed by hand:
//! sm100 global layers select FROST with and without CP (p2p, all_gather, a2a, a2a+p2p), sm90
//! global layers fall to unfused (none under CP), sliding layers select FlashAttention 2 except
//! with a window under p2p rings (guard RG.2, FU.33, FR.22).

use attn_policy::facts::presets;
use attn_policy::{Explanation, Facts, Policy};
use serde_json::{Value as Json, json};

fn explain(preset: &str, sm: u32, window: Option<[i64; 2]>) -> String {
    let mut config: Json = (presets::find(preset).expect("preset").config)();
    let obj = config.as_object_mut().unwrap();
    obj.insert(
        "device_compute_capability".into(),
        json!([sm / 10, sm % 10]),
    );
    if let Some(w) = window {
        obj.insert("window_size".into(), json!(w));
    }
    let d512 = obj["head_dim_qk"] == 512;
    obj.insert(
        "probe".into(),
        json!({"frost_plan": true, "fused_attn_graph": !d512}),
    );
    let policy = Policy::embedded("te").expect("te pack loads");
    let facts = Facts::from_json(&config).expect("preset config is valid");
    let decision = policy.decide(&facts);
    Explanation::new(&policy, &facts, &decision).to_text(false)
}

const CP: [(&str, &str); 5] = [
    ("", "nocp"),
    ("-cp-p2p", "cp_p2p"),
    ("-cp-all-gather", "cp_all_gather"),
    ("-cp-a2a", "cp_a2a"),
    ("-cp-a2a-p2p", "cp_a2a_p2p"),
];

fn snapshots(layer: &str, window: Option<[i64; 2]>, tag: &str) {
    for sm in [90, 100] {
        for (suffix, cp) in CP {
            let name = format!("{tag}_sm{sm}_{cp}");
            insta::assert_snapshot!(
                name,
                explain(&format!("gemma4-{layer}{suffix}"), sm, window)
            );
        }
    }
}

#[test]
fn global_layers_d512() {
    snapshots("global", None, "global_d512");
}

#[test]
fn sliding_layers_d256_window_1024() {
    snapshots("sliding", None, "sliding_d256_window");
}

#[test]
fn sliding_layers_d256_without_window() {
    snapshots("sliding", Some([-1, 0]), "sliding_d256_nowindow");
}
