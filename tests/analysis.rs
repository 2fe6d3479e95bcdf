//! Analysis (issue 4): gaps, diff, check, why-not on fixture packs, with brute-force soundness
//! checks on a reduced domain, plus facts about the te pack's known regions.

use std::collections::BTreeSet;

use attn_policy::Policy;
use attn_policy::analysis::lint::lint;
use attn_policy::analysis::regions::{DEFAULT_BUDGET, Restriction, decide_example, diff, gaps};
use attn_policy::analysis::why_not::why_not;
use attn_policy::facts::Facts;
use serde_json::{Value as Json, json};

fn fixture(name: &str) -> Policy {
    Policy::from_dir(format!("tests/fixtures/analysis/{name}")).expect("fixture loads")
}

/// The reduced domain: every combination of these values (others at their defaults).
fn reduced_domain() -> Vec<Json> {
    let mut heads: Vec<i64> = (240..=530).collect();
    heads.extend([1, 7, 8, 64, 128, 600]);
    let mut out = Vec::new();
    for sm in [70, 79, 80, 90, 100, 103, 120] {
        for &d in &heads {
            for cp in [false, true] {
                for comm in ["p2p", "all_gather", "a2a", "a2a+p2p"] {
                    for win in [
                        json!(null),
                        json!([128, 0]),
                        json!([-1, -1]),
                        json!([-1, 0]),
                        json!([5, -1]),
                    ] {
                        for mask in ["no_mask", "causal"] {
                            out.push(json!({
                                "device_compute_capability": [sm / 10, sm % 10],
                                "head_dim_qk": d, "head_dim_v": d,
                                "context_parallel": cp, "cp_comm_type": comm,
                                "window_size": win, "attn_mask_type": mask,
                            }));
                        }
                    }
                }
            }
        }
    }
    out
}

#[test]
fn gaps_equal_brute_force_on_reduced_domain() {
    let p = fixture("mini");
    let (report, _, stats) = gaps(&p, None, DEFAULT_BUDGET);
    assert!(report.complete && stats.stuck == 0);
    assert!(!report.regions.is_empty());
    let regions: Vec<Restriction> = report
        .regions
        .iter()
        .map(|r| Restriction::of_constraints(&r.constraints).expect("constraints compile"))
        .collect();
    // Every example really is a gap.
    for r in &report.regions {
        assert_eq!(decide_example(&p, &r.example), Ok(None), "{}", r.example);
    }
    let mut gaps_seen = 0;
    for cfg in reduced_domain() {
        let f = Facts::from_json(&cfg).unwrap();
        let brute = p.decide(&f).selected.is_none();
        let found = regions.iter().filter(|r| r.holds(&f)).count();
        assert_eq!(brute, found > 0, "config {cfg}");
        assert!(found <= 1, "regions overlap at {cfg}");
        gaps_seen += usize::from(brute);
    }
    assert!(gaps_seen > 1000);
}

#[test]
fn diff_equals_brute_force_on_reduced_domain() {
    let (old, new) = (fixture("mini"), fixture("mini-nowin"));
    let (report, _) = diff(&old, &new, DEFAULT_BUDGET);
    assert!(report.complete);
    let regions: Vec<(Restriction, Option<String>, Option<String>)> = report
        .regions
        .iter()
        .map(|r| {
            (
                Restriction::of_constraints(&r.constraints).unwrap(),
                r.old.clone(),
                r.new.clone(),
            )
        })
        .collect();
    for r in &report.regions {
        assert_eq!(r.rules, vec!["FR.win".to_string()]);
        assert_eq!(r.new.as_deref(), Some("Frost"));
        assert_eq!(decide_example(&old, &r.example).unwrap(), r.old);
        assert_eq!(decide_example(&new, &r.example).unwrap(), r.new);
    }
    for cfg in reduced_domain() {
        let f = Facts::from_json(&cfg).unwrap();
        let name = |p: &Policy| {
            p.decide(&f)
                .selected
                .map(|b| p.backends[b as usize].name.clone())
        };
        let (a, b) = (name(&old), name(&new));
        let hits: Vec<_> = regions.iter().filter(|r| r.0.holds(&f)).collect();
        if a != b {
            assert_eq!(hits.len(), 1, "{cfg}");
            assert_eq!((&hits[0].1, &hits[0].2), (&a, &b), "{cfg}");
        } else {
            assert!(hits.is_empty(), "{cfg}");
        }
    }
}

#[test]
fn where_restricts_the_search() {
    let p = fixture("mini");
    let w = Restriction::parse("sm == 90 and context_parallel").unwrap();
    let (r, _, _) = gaps(&p, Some(&w), DEFAULT_BUDGET);
    assert!(!r.regions.is_empty());
    for g in &r.regions {
        assert_eq!(g.example["device_compute_capability"], json!([9, 0]));
        assert!(g.declined_by.contains_key("Unfused"));
    }
    assert!(Restriction::parse("head_dim == 3").is_err());
}

#[test]
fn check_reports_every_lint_with_locations() {
    let p = fixture("lints");
    let mut diags = lint(&p);
    for d in &mut diags {
        d.locate(&p.sources);
    }
    let codes: BTreeSet<&str> = diags.iter().map(|d| d.code).collect();
    for code in [
        "W-NEVER-FIRES",
        "W-ALWAYS-FIRES",
        "W-SUBSUMED",
        "W-UNSELECTABLE",
        "W-CAPABILITY",
        "W-UNKNOWN-CAPABILITY",
        "W-OBSOLETE-WORKAROUND",
    ] {
        assert!(codes.contains(code), "missing {code}: {diags:#?}");
    }
    let find = |code: &str| diags.iter().find(|d| d.code == code).unwrap();
    assert!(find("W-NEVER-FIRES").message.contains("A.never"));
    assert!(
        find("W-SUBSUMED")
            .message
            .contains("`A.narrow` is subsumed by rule `A.wide`")
    );
    assert!(find("W-OBSOLETE-WORKAROUND").message.contains("A.bug"));
    assert!(find("W-ALWAYS-FIRES").message.contains("C.always"));
    assert!(find("W-UNSELECTABLE").message.contains("`C`"));
    let cap = find("W-CAPABILITY");
    assert!(cap.message.contains("`A`") && cap.message.contains("`window`"));
    for d in &diags {
        let loc = d.location.as_deref().unwrap_or("");
        assert!(loc.contains("tests/fixtures/analysis/lints/"), "{d:?}");
        assert_eq!(loc.matches(':').count(), 2, "file:line:col in {loc}");
    }
    // The mini pack declares its capabilities: no capability warnings there.
    assert!(
        lint(&fixture("mini"))
            .iter()
            .all(|d| d.code != "W-CAPABILITY")
    );
}

#[test]
fn why_not_proposes_verified_minimal_changes() {
    let p = fixture("mini");
    let cfg = json!({"device_compute_capability": [10, 0], "head_dim_qk": 260, "head_dim_v": 260});
    let r = why_not(&p, "Frost", &cfg).unwrap();
    assert!(!r.eligible);
    assert!(
        r.hints
            .iter()
            .any(|h| h.text == "pad head_dim_qk 260 -> 264 (and head_dim_v with it)"),
        "{r:#?}"
    );
    assert!(r.hints.iter().all(|h| h.verified));

    let cfg = json!({"device_compute_capability": [10, 0], "head_dim_qk": 264, "head_dim_v": 264,
        "context_parallel": true, "cp_comm_type": "p2p", "window_size": [128, 0]});
    let r = why_not(&p, "Frost", &cfg).unwrap();
    let texts: Vec<&str> = r.hints.iter().map(|h| h.text.as_str()).collect();
    assert!(
        texts.iter().any(|t| t.starts_with("use cp_comm_type")
            && t.contains("all_gather")
            && t.contains("a2a")),
        "{texts:?}"
    );

    // The GPU is reported, never proposed.
    let cfg = json!({"device_compute_capability": [9, 0], "head_dim_qk": 264, "head_dim_v": 264});
    let r = why_not(&p, "Frost", &cfg).unwrap();
    assert!(
        r.hints
            .iter()
            .all(|h| h.changes.iter().all(|c| c.fact != "sm"))
    );
    assert!(r.unchangeable.iter().any(|u| u.contains("sm")), "{r:#?}");
    assert!(why_not(&p, "Nope", &cfg).is_err());
}

#[test]
#[ignore = "gaps over the full te pack does not finish in CI time yet: see docs/analysis.md (per-backend decomposition pending)"]
fn te_sm90_cp_head_dim_256_512_has_no_backend_and_frost_closes_it_on_blackwell() {
    let p = Policy::embedded("te").unwrap();
    let w = Restriction::parse(
        "256 < head_dim_qk <= 512 and head_dim_v == head_dim_qk and head_dim_qk % 8 == 0 and context_parallel and window_size == null and attn_mask_type == \"causal\"",
    )
    .unwrap();
    let (r, _, _) = gaps(&p, Some(&w), DEFAULT_BUDGET);
    assert!(r.complete);
    let sm_of = |g: &attn_policy::analysis::regions::GapRegion| {
        let cc = &g.example["device_compute_capability"];
        cc.as_array()
            .map(|a| a[0].as_i64().unwrap() * 10 + a[1].as_i64().unwrap())
    };
    // A gap on sm90 exists in the slice.
    assert!(
        r.regions.iter().any(|g| sm_of(g) == Some(90)),
        "{:#?}",
        r.regions.len()
    );
    // On sm100 with a supported cp comm type, FROST serves: no gap example there is plain.
    let plain_blackwell = json!({
        "device_compute_capability": [10, 0], "head_dim_qk": 512, "head_dim_v": 512,
        "context_parallel": true, "cp_comm_type": "all_gather", "attn_mask_type": "causal",
        "probe": {"fused_attn_graph": true, "frost_plan": true},
        "cudnn_frontend_version": "1.29.0", "cutlass_dsl_version": "4.7.1", "cudnn_version": "9.19.0"
    });
    let sel = decide_example(&p, &plain_blackwell).unwrap();
    assert_eq!(sel.as_deref(), Some("FrostAttention"));
}
