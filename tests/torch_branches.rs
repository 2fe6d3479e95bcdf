//! The `torch` pack's architecture- and version-dependent branches, each against the source line
//! it cites (docs/packs/torch.md, "Versioned and architecture conditions"). The corpus only holds
//! SM90 with cuDNN 9.19; these expectations were derived by hand from the cited lines.

use attn_policy::Policy;
use serde_json::{Value as Json, json};

fn decide(config: Json) -> (Option<String>, Vec<String>, Option<String>) {
    let p = Policy::embedded("torch").expect("torch pack loads");
    let f = p.read_facts(&config).expect("config reads");
    let d = p.decide(&f);
    let selected = d.selected.map(|s| p.backends[s as usize].name.clone());
    let fired = d
        .fired
        .iter()
        .map(|&r| p.rules[r as usize].id.clone())
        .collect();
    let pref = d.preference.map(|i| p.preference[i as usize].id.clone());
    (selected, fired, pref)
}

fn cfg(extra: Json) -> Json {
    let mut base = json!({"dtype": "bf16", "heads_q": 8, "heads_kv": 8, "seqlen_q": 256,
                          "seqlen_kv": 256, "head_dim_qk": 128, "head_dim_v": 128});
    for (k, v) in extra.as_object().unwrap() {
        base[k] = v.clone();
    }
    base
}

#[test]
fn priority_order_follows_check_prefer_cudnn_attention() {
    // S:91: cudnn_version > 91500 and major in {9, 10} and minor in {0, 3}
    for (sm, cudnn, want) in [
        (90, "9.19.0", "cudnn-first"),
        (100, "9.19.0", "cudnn-first"),
        (103, "9.19.0", "cudnn-first"),
        (101, "9.19.0", "default"),
        (80, "9.19.0", "default"),
        (120, "9.19.0", "default"),
        (90, "9.15.0", "default"),
        (90, "9.15.1", "cudnn-first"),
    ] {
        let (sel, _, pref) = decide(cfg(json!({"sm": sm, "cudnn_version": cudnn})));
        assert_eq!(pref.as_deref(), Some(want), "sm{sm} cuDNN {cudnn}");
        let expect = if want == "cudnn-first" {
            "cudnn"
        } else {
            "flash"
        };
        assert_eq!(sel.as_deref(), Some(expect), "sm{sm} cuDNN {cudnn}");
    }
    // TORCH_CUDNN_SDPA_DEPRIORITIZED=1 keeps the default order (S:79-82)
    let (sel, _, pref) = decide(cfg(json!({"env": {"TORCH_CUDNN_SDPA_DEPRIORITIZED": "1"}})));
    assert_eq!(
        (sel.as_deref(), pref.as_deref()),
        (Some("flash"), Some("default"))
    );
    // default order: math before cuDNN, so cuDNN only once math is off too (C:, S:955-1000)
    let (sel, _, _) = decide(cfg(json!({"sm": 80, "flash_sdp_enabled": false,
                                         "mem_efficient_sdp_enabled": false})));
    assert_eq!(sel.as_deref(), Some("math"));
    let (sel, _, _) = decide(cfg(json!({"sm": 80, "flash_sdp_enabled": false,
        "mem_efficient_sdp_enabled": false, "math_sdp_enabled": false})));
    assert_eq!(sel.as_deref(), Some("cudnn"));
}

#[test]
fn cudnn_head_dim_limit_depends_on_arch_and_version() {
    // S:527-548: 128; 256 on sm90 (major 9, minor 0) from 9.10; 192/128 on sm10x from 9.11
    let limit = |sm: i64, cudnn: &str, qk: i64, v: i64| {
        let (_, fired, _) = decide(cfg(json!({"sm": sm, "cudnn_version": cudnn,
                                              "head_dim_qk": qk, "head_dim_v": v})));
        !fired.contains(&"cudnn.head_dim_limit".to_string())
    };
    assert!(limit(90, "9.19.0", 256, 256));
    assert!(!limit(90, "9.9.0", 256, 256));
    assert!(!limit(80, "9.19.0", 256, 256));
    assert!(limit(80, "9.19.0", 128, 128));
    assert!(!limit(100, "9.19.0", 256, 256));
    assert!(limit(100, "9.11.0", 192, 128));
    assert!(!limit(100, "9.10.0", 192, 128));
    assert!(limit(103, "9.19.0", 192, 128));
    assert!(!limit(100, "9.19.0", 192, 192));
    assert!(!limit(90, "9.19.0", 264, 128));
}

#[test]
fn cudnn_version_gates() {
    let fired = |extra: Json| decide(cfg(extra)).1;
    // S:764-771: dropout on 9.11.1 .. 9.13.x
    assert!(
        fired(json!({"cudnn_version": "9.12.0", "dropout_p": 0.1}))
            .contains(&"cudnn.dropout_9_11".into())
    );
    for v in ["9.11.0", "9.14.0", "9.19.0"] {
        assert!(
            !fired(json!({"cudnn_version": v, "dropout_p": 0.1}))
                .contains(&"cudnn.dropout_9_11".into()),
            "{v}"
        );
    }
    // S:752-763: no cuDNN in the build; cuDNN 8
    assert!(fired(json!({"cudnn_version": null})).contains(&"cudnn.not_built".into()));
    assert!(fired(json!({"cudnn_version": 8907})).contains(&"cudnn.too_old".into()));
    // S:736-747: strict determinism only
    assert!(fired(json!({"deterministic": true})).contains(&"cudnn.deterministic".into()));
    assert!(
        !fired(json!({"deterministic": true, "deterministic_warn_only": true}))
            .contains(&"cudnn.deterministic".into())
    );
    // S:682-697: nested inputs need the variable and sm9x/sm10x
    let nested = json!({"nested": true});
    assert!(fired(nested.clone()).contains(&"cudnn.nested_env".into()));
    let on = json!({"nested": true, "env": {"TORCH_CUDNN_SDPA_NESTED_TENSOR_ENABLED": "1"}});
    assert!(!fired(on.clone()).iter().any(|r| r.starts_with("cudnn.")));
    let mut sm80 = on;
    sm80["sm"] = json!(80);
    assert!(fired(sm80).contains(&"cudnn.nested_arch".into()));
}

#[test]
fn flash_and_efficient_architecture_branches() {
    let fired = |extra: Json| decide(cfg(extra)).1;
    let has = |f: &[String], id: &str| f.iter().any(|r| r == id);
    // S:298-353 / S:355-413 / S:658-680: architecture ranges
    let f = fired(json!({"sm": 75, "dtype": "fp16"}));
    assert!(has(&f, "flash.arch") && has(&f, "cudnn.arch") && !has(&f, "efficient.arch"));
    // The ranges' far ends (sm 45, sm 122) are no GPU, so a config naming them is refused
    // when read (`compute_capability_exists`); the rules' bounds are checked on facts read
    // without that check.
    let fired_any_sm = |extra: Json| {
        let p = Policy::embedded("torch").expect("torch pack loads");
        let f = p
            .schema
            .read_unvalidated(&cfg(extra))
            .expect("config reads");
        let d = p.decide(&f);
        d.fired
            .iter()
            .map(|&r| p.rules[r as usize].id.clone())
            .collect::<Vec<String>>()
    };
    assert!(has(&fired_any_sm(json!({"sm": 122})), "flash.arch"));
    assert!(has(&fired_any_sm(json!({"sm": 45})), "efficient.arch"));
    // S:701-711, S:946-952: bf16 from sm80
    let f = fired(json!({"sm": 75}));
    assert!(has(&f, "efficient.dtype") && has(&f, "flash.dtype") && has(&f, "cudnn.dtype"));
    assert!(!has(
        &fired(json!({"sm": 75, "dtype": "fp32"})),
        "efficient.dtype"
    ));
    // S:713-722: fp8_e4m3fn for flash only with FA3 on sm90+
    let fp8 = json!({"dtype": "fp8_e4m3fn"});
    assert!(has(&fired(fp8.clone()), "flash.dtype"));
    let fa3 = json!({"dtype": "fp8_e4m3fn", "fa3_sdp_enabled": true});
    assert!(!has(&fired(fa3.clone()), "flash.dtype"));
    let mut fa3_80 = fa3;
    fa3_80["sm"] = json!(80);
    assert!(has(&fired(fa3_80), "flash.dtype"));
    // S:118-141 minimum_gemm_alignment: sm80+ 8 (half) / 4 (fp32); sm7x 8 (half) / 1 (fp32)
    let me = |sm: i64, dtype: &str, d: i64| {
        has(
            &fired(json!({"sm": sm, "dtype": dtype, "head_dim_qk": d, "head_dim_v": d})),
            "efficient.head_dim",
        )
    };
    assert!(me(90, "bf16", 100) && !me(90, "bf16", 104));
    assert!(me(90, "fp32", 98) && !me(90, "fp32", 100));
    assert!(!me(75, "fp32", 97) && me(75, "fp16", 100));
    assert!(!me(60, "fp16", 97));
    // S:415-447: flash backward on sm86-89 / sm120-121
    let t = |sm: i64, d: i64, p: f64, grad: bool| {
        has(
            &fired(
                json!({"sm": sm, "head_dim_qk": d, "head_dim_v": d, "dropout_p": p,
                          "requires_grad": true, "grad_enabled": grad}),
            ),
            "flash.train_head_dim",
        )
    };
    assert!(t(86, 200, 0.0, true) && t(89, 224, 0.0, true) && t(120, 200, 0.0, true));
    assert!(!t(86, 192, 0.0, true) && !t(86, 240, 0.0, true) && t(86, 240, 0.1, true));
    assert!(!t(90, 200, 0.0, true) && !t(86, 200, 0.0, false));
}
