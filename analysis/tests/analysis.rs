//! Analysis (issue 4): gaps, diff, check, why-not on fixture packs, with brute-force soundness
//! checks on a reduced domain, plus facts about the te pack's known regions.

mod common;

use std::collections::BTreeSet;

use attn_policy::Policy;
use attn_policy::Status;
use attn_policy::facts::Facts;
use attn_policy_analysis::lint::lint;
use attn_policy_analysis::regions::{
    ChangeKind, CorpusConfig, DEFAULT_BUDGET, DiffReport, Restriction, decide_example, diff,
    diff_over_corpus, gaps,
};
use attn_policy_analysis::why_not::why_not;
use serde_json::{Value as Json, json};

use common::TE_SLICE;

fn fixture(name: &str) -> Policy {
    Policy::from_dir(format!(
        "{}/../tests/fixtures/analysis/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("fixture loads")
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
    let (report, _) = gaps(&p, None, DEFAULT_BUDGET, usize::MAX);
    assert!(report.complete && !report.regions_truncated && report.gaps_exist);
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
        // Inputs refused when read (docs/facts.md) are no configuration: nothing to decide.
        let Ok(f) = Facts::from_json(&cfg) else {
            continue;
        };
        let brute = p.decide(&f).selected.is_none();
        let found = regions.iter().filter(|r| r.holds(&f)).count();
        // The regions are a cover (they may overlap): their union is exactly the gaps.
        assert_eq!(brute, found > 0, "config {cfg}");
        gaps_seen += usize::from(brute);
    }
    assert!(gaps_seen > 1000);
}

/// Two facts compared with each other inside one class (`head_dim_qk != head_dim_v` with both
/// in the same interval and residue): the regions must still be exactly the gaps. Before the
/// diagrams had ordering variables, such a pair was evaluated at equal representatives and
/// every unequal pair in the class was silently left out of the gaps.
#[test]
fn comparisons_inside_one_class_equal_brute_force() {
    let p = fixture("rel");
    let (report, _) = gaps(&p, None, DEFAULT_BUDGET, usize::MAX);
    assert!(report.complete && !report.regions_truncated && report.gaps_exist);
    let regions: Vec<Restriction> = report
        .regions
        .iter()
        .map(|r| Restriction::of_constraints(&r.constraints).expect("constraints compile"))
        .collect();
    for r in &report.regions {
        assert_eq!(decide_example(&p, &r.example), Ok(None), "{}", r.example);
    }
    let mut dims: Vec<i64> = (1..=12).collect();
    dims.extend(248..=272);
    dims.extend(500..=520);
    let lens = [1, 2, 3, 63, 64, 65, 128];
    let (mut gaps_seen, mut unequal_same_class) = (0, 0);
    for &qk in &dims {
        for &v in &dims {
            for &q in &lens {
                for &kv in &lens {
                    let cfg = json!({"head_dim_qk": qk, "head_dim_v": v,
                        "max_seqlen_q": q, "max_seqlen_kv": kv});
                    let f = Facts::from_json(&cfg).unwrap();
                    let brute = p.decide(&f).selected.is_none();
                    let found = regions.iter().any(|r| r.holds(&f));
                    assert_eq!(brute, found, "config {cfg}");
                    gaps_seen += usize::from(brute);
                    // e.g. 264 vs 272: both multiples of 8 in (256, 512], unequal.
                    unequal_same_class +=
                        usize::from(brute && qk != v && qk > 256 && v > 256 && qk % 8 == v % 8);
                }
            }
        }
    }
    assert!(gaps_seen > 10_000 && unequal_same_class > 100);
}

/// Every concrete configuration of the `nonlinear` fixtures' reduced domain (remainders and
/// products of two facts, per-step lengths `max_seqlen_q // cp_size`).
fn nonlinear_domain() -> Vec<Json> {
    let mut out = Vec::new();
    for heads in 1..=12 {
        for gqa in 1..=6 {
            for batch in [1, 4, 8, 16, 41, 64, 65] {
                for (cp, cp_size) in [
                    (false, 1),
                    (true, 1),
                    (true, 2),
                    (true, 3),
                    (true, 4),
                    (true, 5),
                ] {
                    for q in [50, 100, 101, 150, 202, 203, 404, 505] {
                        out.push(json!({"num_heads": heads, "num_gqa_groups": gqa,
                            "batch_size": batch, "context_parallel": cp, "cp_size": cp_size,
                            "max_seqlen_q": q}));
                    }
                }
            }
        }
    }
    out
}

/// Conditions the classes cannot decide (`num_heads % cp_size`, `batch_size * num_heads`)
/// are relation variables in the diagrams: `gaps` and `diff` stay exact there. Before, such a
/// condition was evaluated at a block's representative (`16 % 2` for every even head count
/// above 5 and every a2a size above 1).
#[test]
fn non_linear_conditions_equal_brute_force() {
    let (p, q) = (fixture("nonlinear"), fixture("nonlinear-edited"));
    // The search does not tie KV heads to query heads by itself (`kv_heads_divide_heads` is
    // not searched: docs/analysis.md); this fixture relates them, so the restriction does.
    let tied =
        Restriction::parse("num_gqa_groups <= num_heads and num_heads % num_gqa_groups == 0")
            .unwrap();
    let (g, _) = gaps(&p, Some(&tied), DEFAULT_BUDGET, usize::MAX);
    let (d, _) = diff(&p, &q, Some(&tied), DEFAULT_BUDGET, usize::MAX);
    // `b * h > 64` and `b * h > 40` are separate predicate variables: the cover must not list
    // (or leave unverified) cubes needing the first true and the second false.
    assert!(g.complete && !g.regions_truncated && d.complete && !d.regions_truncated);
    assert_eq!((g.regions_unverified, d.regions_unverified), (0, 0));
    let compile = |c| Restriction::of_constraints(c).expect("constraints compile");
    let gap_regions: Vec<Restriction> = g.regions.iter().map(|r| compile(&r.constraints)).collect();
    let diff_regions: Vec<Restriction> =
        d.regions.iter().map(|r| compile(&r.constraints)).collect();
    // A condition of two facts appears as a constraint of its own.
    assert!(
        g.regions
            .iter()
            .any(|r| r.constraints.keys().any(|k| k.contains(", ")))
    );
    for r in &g.regions {
        assert_eq!(decide_example(&p, &r.example), Ok(None), "{}", r.example);
    }
    for r in &d.regions {
        assert_eq!(
            decide_example(&p, &r.example).unwrap(),
            r.old,
            "{}",
            r.example
        );
        assert_eq!(
            decide_example(&q, &r.example).unwrap(),
            r.new,
            "{}",
            r.example
        );
        assert_eq!(r.rules, vec!["B.prod".to_string()]);
    }
    let (mut gaps_seen, mut changed) = (0, 0);
    for cfg in nonlinear_domain() {
        // Inputs refused when read (docs/facts.md) are no configuration: nothing to decide.
        let Ok(f) = Facts::from_json(&cfg) else {
            continue;
        };
        let gap = p.decide(&f).selected.is_none();
        assert_eq!(
            gap,
            gap_regions.iter().any(|r| r.holds(&f)),
            "gaps, config {cfg}"
        );
        gaps_seen += usize::from(gap);
        let name = |p: &Policy| {
            p.decide(&f)
                .selected
                .map(|b| p.backends[b as usize].name.clone())
        };
        let hits: Vec<usize> = (0..diff_regions.len())
            .filter(|&i| diff_regions[i].holds(&f))
            .collect();
        if name(&p) != name(&q) {
            changed += 1;
            assert_eq!(hits.len(), 1, "diff, config {cfg}");
            assert_eq!(
                (&d.regions[hits[0]].old, &d.regions[hits[0]].new),
                (&name(&p), &name(&q)),
                "{cfg}"
            );
        } else {
            assert!(hits.is_empty(), "diff, config {cfg}");
        }
    }
    assert!(gaps_seen > 1000 && changed > 100, "{gaps_seen} {changed}");
}

#[test]
fn diff_equals_brute_force_on_reduced_domain() {
    let (old, new) = (fixture("mini"), fixture("mini-nowin"));
    let (report, _) = diff(&old, &new, None, DEFAULT_BUDGET, usize::MAX);
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
        // Inputs refused when read (docs/facts.md) are no configuration: nothing to decide.
        let Ok(f) = Facts::from_json(&cfg) else {
            continue;
        };
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

/// `diff --corpus` (issue 32): each region's kind follows from its two outcomes, and its
/// `corpus_count` is, brute force over a corpus made of the reduced domain, the number of
/// configurations decided differently whose facts its (disjoint) `constraints` hold; the
/// counts add up to the corpus's differing configurations, `corpus_example_id` names one of
/// them, and the regions come most-hit first. A listing cut short counts the rest as outside.
#[test]
fn diff_over_a_corpus_counts_each_configuration_in_its_region() {
    let (old, new) = (fixture("mini"), fixture("mini-nowin"));
    let corpus: Vec<CorpusConfig> = reduced_domain()
        .iter()
        .enumerate()
        .filter_map(|(i, cfg)| {
            let f = Facts::from_json(cfg).ok()?;
            Some(CorpusConfig {
                id: format!("c{i}"),
                old: f.clone(),
                new: f,
                config: cfg.clone(),
            })
        })
        .collect();
    let name = |p: &Policy, f: &Facts| {
        p.decide(f)
            .selected
            .map(|b| p.backends[b as usize].name.clone())
    };
    let differing: Vec<&CorpusConfig> = corpus
        .iter()
        .filter(|c| name(&old, &c.old) != name(&new, &c.new))
        .collect();
    assert!(differing.len() > 100, "{}", differing.len());
    let (report, _) = diff_over_corpus(&old, &new, None, DEFAULT_BUDGET, usize::MAX, Some(&corpus));
    let summary = report.corpus.clone().expect("a corpus summary");
    assert_eq!(summary.configurations, corpus.len() as u64);
    assert_eq!(summary.decided_differently, differing.len() as u64);
    assert_eq!(
        summary.outside_listed_regions,
        0,
        "{} regions, {} unverified, complete {}",
        report.regions.len(),
        report.regions_unverified,
        report.complete
    );
    let counts: Vec<u64> = report
        .regions
        .iter()
        .map(|r| r.corpus_count.unwrap())
        .collect();
    assert!(counts.windows(2).all(|w| w[0] >= w[1]), "{counts:?}");
    assert_eq!(counts.iter().sum::<u64>(), differing.len() as u64);
    for r in &report.regions {
        let kind = match (&r.old, &r.new) {
            (None, _) => ChangeKind::Gained,
            (_, None) => ChangeKind::Lost,
            _ => ChangeKind::Switched,
        };
        assert_eq!(r.kind, kind);
        assert!(!r.old_rules.is_empty() || !r.new_rules.is_empty(), "{r:?}");
        let within = Restriction::of_constraints(&r.constraints).unwrap();
        let members: Vec<&&CorpusConfig> =
            differing.iter().filter(|c| within.holds(&c.new)).collect();
        assert_eq!(
            r.corpus_count,
            Some(members.len() as u64),
            "{:?}",
            r.constraints
        );
        match &r.corpus_example_id {
            Some(id) => assert!(members.iter().any(|c| &c.id == id)),
            None => assert!(members.is_empty()),
        }
    }
    // Cut to one region fewer: the most-hit ones stay, the rest is counted outside.
    assert!(!counts.is_empty());
    let keep = counts.len() - 1;
    let (cut, _) = diff_over_corpus(&old, &new, None, DEFAULT_BUDGET, keep, Some(&corpus));
    assert!(cut.regions_truncated && cut.regions.len() == keep);
    let listed: Vec<u64> = cut
        .regions
        .iter()
        .map(|r| r.corpus_count.unwrap())
        .collect();
    assert_eq!(listed, counts[..keep].to_vec());
    let outside = cut.corpus.unwrap().outside_listed_regions;
    assert_eq!(outside, counts[keep]);
}

/// Regions omit the facts whose value does not change the outcome there (issue 15: the EXPAND
/// step on each listed cube). In `mini`, nothing is selected with context parallelism below
/// sm80 whatever the window: before, the cover's cube kept `window_size == null` (wider
/// windows reached invalid ones, `window_fits_mask`) and listed every window shape apart.
/// Brute force: every valid member of each (widened) region of the reduced domain, every
/// window and mask included, is a gap; and diff's `widened` regions hold only inputs decided
/// as they say, while `constraints` stays a disjoint cover.
#[test]
fn regions_omit_facts_that_do_not_matter() {
    let p = fixture("mini");
    let (report, _) = gaps(&p, None, DEFAULT_BUDGET, usize::MAX);
    assert!(report.complete && !report.regions_truncated);
    let json = serde_json::to_value(&report).unwrap();
    let short = json["regions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| {
            r["constraints"].get("context_parallel").is_some()
                && r["constraints"].get("sm").is_some()
                && r["constraints"].as_object().unwrap().len() == 2
        })
        .unwrap_or_else(|| panic!("no region `context_parallel and sm <= 79`: {json:#}"));
    assert_eq!(short["constraints"]["sm"], json!("sm <= 79"));
    let region = Restriction::of_constraints(short["constraints"].as_object().unwrap()).unwrap();
    let mut windows_in_region = BTreeSet::new();
    for cfg in reduced_domain() {
        let Ok(f) = Facts::from_json(&cfg) else {
            continue;
        };
        if region.holds(&f) {
            assert_eq!(p.decide(&f).selected, None, "{cfg}");
            windows_in_region.insert((
                cfg["window_size"].to_string(),
                cfg["attn_mask_type"].to_string(),
            ));
        }
    }
    // Every window of the domain that TE accepts for its mask lies in the one region.
    assert_eq!(windows_in_region.len(), 9, "{windows_in_region:?}");
    for r in &report.regions {
        let region = Restriction::of_constraints(&r.constraints).unwrap();
        for cfg in reduced_domain() {
            let Ok(f) = Facts::from_json(&cfg) else {
                continue;
            };
            if region.holds(&f) {
                assert_eq!(p.decide(&f).selected, None, "{cfg} in {:?}", r.constraints);
            }
        }
    }

    let new = fixture("mini-nowin");
    let (d, _) = diff(&p, &new, None, DEFAULT_BUDGET, usize::MAX);
    assert!(d.complete && !d.regions.is_empty());
    assert!(
        d.regions
            .iter()
            .any(|r| r.widened.len() < r.constraints.len())
    );
    let name = |q: &Policy, f: &Facts| {
        q.decide(f)
            .selected
            .map(|b| q.backends[b as usize].name.clone())
    };
    for r in &d.regions {
        let (wide, cube) = (
            Restriction::of_constraints(&r.widened).unwrap(),
            Restriction::of_constraints(&r.constraints).unwrap(),
        );
        let mut members = 0;
        for cfg in reduced_domain() {
            let Ok(f) = Facts::from_json(&cfg) else {
                continue;
            };
            if wide.holds(&f) {
                members += 1;
                assert_eq!(
                    (name(&p, &f), name(&new, &f)),
                    (r.old.clone(), r.new.clone()),
                    "{cfg}"
                );
            } else {
                assert!(
                    !cube.holds(&f),
                    "{cfg}: in the cube, not in the widened region"
                );
            }
        }
        assert!(members > 0);
    }
}

#[test]
fn where_restricts_the_search() {
    let p = fixture("mini");
    let w = Restriction::parse("sm == 90 and context_parallel").unwrap();
    let (r, _) = gaps(&p, Some(&w), DEFAULT_BUDGET, usize::MAX);
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
    let codes: BTreeSet<&str> = diags.iter().map(|d| d.code.name()).collect();
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
fn te_sm90_cp_head_dim_256_512_has_no_backend_and_frost_closes_it_on_blackwell() {
    let p = Policy::embedded("te").unwrap();
    let w = Restriction::parse(&format!("sm == 90 and {TE_SLICE}")).unwrap();
    let (r, _) = gaps(&p, Some(&w), DEFAULT_BUDGET, usize::MAX);
    assert!(r.complete);
    // On sm90 the whole slice is a gap: every comm type, every head dim in (256, 512].
    assert!(!r.regions.is_empty());
    let mut comms = BTreeSet::new();
    for g in &r.regions {
        assert_eq!(decide_example(&p, &g.example), Ok(None), "{}", g.example);
        assert_eq!(g.example["device_compute_capability"], json!([9, 0]));
        let d = g.example["head_dim_qk"].as_i64().unwrap();
        assert!(256 < d && d <= 512, "{d}");
        assert!(
            g.declined_by.contains_key("FrostAttention"),
            "{:?}",
            g.declined_by
        );
        assert!(g.declined_by.contains_key("UnfusedDotProductAttention"));
        comms.insert(
            g.example["cp_comm_type"]
                .as_str()
                .unwrap_or("p2p")
                .to_string(),
        );
        // No constraint narrows the slice further: the gap covers all of it.
        assert!(
            !g.constraints.contains_key("cp_comm_type"),
            "{:?}",
            g.constraints
        );
    }
    let frost = p
        .backends
        .iter()
        .position(|b| b.name == "FrostAttention")
        .unwrap();
    // FROST closes it on sm100/sm103 for every comm type it serves (all four without a
    // window; with a window only all_gather and a2a, the p2p rings discard it: FR.win_p2p).
    for sm in [[10, 0], [10, 3]] {
        for comm in ["p2p", "all_gather", "a2a", "a2a+p2p"] {
            for d in [264, 320, 384, 512] {
                for win in [json!(null), json!([128, 0])] {
                    let cfg = json!({
                        "device_compute_capability": sm, "head_dim_qk": d, "head_dim_v": d,
                        "context_parallel": true, "cp_comm_type": comm, "cp_size": 2,
                        "cp_size_a2a": 2, "num_heads": 16, "num_gqa_groups": 16,
                        "max_seqlen_q": 8192, "max_seqlen_kv": 8192, "attn_mask_type": "causal",
                        "window_size": win, "qkv_layout": "bshd_bshd_bshd", "qkv_dtype": "bf16",
                        "flash_attn_versions": {"v2": "2.7.4"},
                        "cudnn_frontend_version": "1.29.0", "cutlass_dsl_version": "4.7.1",
                        "cudnn_version": "9.19.0",
                        "probe": {"fused_attn_graph": true, "frost_plan": true}
                    });
                    let served = win.is_null() || comm == "all_gather" || comm == "a2a";
                    let dec = p.decide(&Facts::from_json(&cfg).unwrap());
                    let st = &dec.backends[frost].status;
                    let eligible = matches!(st, Status::Selected | Status::Outranked { .. });
                    assert_eq!(eligible, served, "{cfg}: {st:?}");
                    // Something serves every such config (FusedAttention comes first in the
                    // sm90+ order where cuDNN takes the head dim; FROST where it does not).
                    assert!(dec.selected.is_some() || !served, "{cfg}");
                    // The same config on sm90 has no backend at all.
                    let mut h = cfg.clone();
                    h["device_compute_capability"] = json!([9, 0]);
                    assert_eq!(decide_example(&p, &h), Ok(None), "{h}");
                }
            }
        }
    }
}

/// The slice of [`TE_SLICE`] without its context-parallel and window pinning.
fn te_slice_any_cp() -> String {
    TE_SLICE
        .replace("context_parallel \\\n    and ", "")
        .replace(" context_parallel and", "")
        .replace(" and window_size == null", "")
}

/// `diff` of `old` and `new` within `slice`: complete, with `rule` the only changed rule and
/// some region where the decisions differ. Returns the report and the slice as a restriction.
fn diff_changing_one_rule(
    old: &Policy,
    new: &Policy,
    slice: &str,
    rule: &str,
) -> (DiffReport, Restriction) {
    let w = Restriction::parse(slice).unwrap();
    let (report, _) = diff(old, new, Some(&w), DEFAULT_BUDGET, usize::MAX);
    assert!(report.complete);
    assert_eq!(report.changed_rules, vec![rule.to_string()]);
    assert!(!report.regions.is_empty());
    (report, w)
}

#[test]
fn te_diff_deleting_frost_window_p2p_rule_shows_exactly_the_windowed_p2p_regions() {
    let old = Policy::embedded("te").unwrap();
    let (dir, new) = common::te_without_fr22("te-nowin");
    let slice = te_slice_any_cp();
    assert!(!slice.contains("context_parallel") && !slice.contains("window_size"));
    let (report, w) = diff_changing_one_rule(&old, &new, &slice, "FR.22@FrostAttention");
    let regions: Vec<Restriction> = report
        .regions
        .iter()
        .map(|r| Restriction::of_constraints(&r.constraints).unwrap())
        .collect();
    for r in &report.regions {
        assert_eq!(r.old, None, "{:?}", r.constraints);
        assert_eq!(r.new.as_deref(), Some("FrostAttention"));
        assert_eq!(r.rules, vec!["FR.22".to_string()]);
        let cc = &r.example["device_compute_capability"];
        assert!(cc == &json!([10, 0]) || cc == &json!([10, 3]), "{cc}");
        let comm = r.example["cp_comm_type"].as_str().unwrap_or("p2p");
        assert!(comm == "p2p" || comm == "a2a+p2p", "{comm}");
        assert_eq!(r.example["context_parallel"], json!(true));
        assert!(!r.example["window_size"].is_null());
        assert_eq!(decide_example(&old, &r.example).unwrap(), None);
        assert_eq!(
            decide_example(&new, &r.example).unwrap().as_deref(),
            Some("FrostAttention")
        );
    }
    // Brute force over a grid of the slice: a config lies in a region iff the packs differ.
    let base = json!({
        "qkv_dtype": "bf16", "qkv_layout": "bshd_bshd_bshd", "attn_mask_type": "causal",
        "max_seqlen_q": 8192, "max_seqlen_kv": 8192, "num_heads": 16, "num_gqa_groups": 16,
        "cp_size": 2, "cp_size_a2a": 2, "batch_size": 2, "flash_attn_versions": {"v2": "2.7.4"},
        "cudnn_version": "9.19.0", "cudnn_frontend_version": "1.29.0",
        "cutlass_dsl_version": "4.7.1",
        "probe": {"fused_attn_graph": true, "frost_plan": true, "cuda_device": true}
    });
    let mut differ = 0;
    for sm in [80, 90, 100, 103, 120] {
        for d in [264, 320, 384, 512] {
            for cp in [false, true] {
                for comm in ["p2p", "all_gather", "a2a", "a2a+p2p"] {
                    for win in [
                        json!(null),
                        json!([128, 0]),
                        json!([-1, -1]),
                        json!([64, 64]),
                    ] {
                        let mut c = base.clone();
                        c["device_compute_capability"] = json!([sm / 10, sm % 10]);
                        c["head_dim_qk"] = json!(d);
                        c["head_dim_v"] = json!(d);
                        c["context_parallel"] = json!(cp);
                        c["cp_comm_type"] = json!(comm);
                        c["window_size"] = win.clone();
                        let facts = Facts::from_json(&c).unwrap();
                        assert!(w.holds(&facts), "{c}");
                        let (a, b) = (
                            decide_example(&old, &c).unwrap(),
                            decide_example(&new, &c).unwrap(),
                        );
                        let hits = regions.iter().filter(|r| r.holds(&facts)).count();
                        if a != b {
                            differ += 1;
                            assert_eq!(hits, 1, "{c}");
                        } else {
                            assert_eq!(hits, 0, "{c}");
                        }
                    }
                }
            }
        }
    }
    assert_eq!(
        differ,
        2 * 4 * 2 * 2,
        "sm100/103 x 4 dims x 2 comm types x 2 windows"
    );
    // Over the whole space (no --where): still only FR.22's regions, none -> FROST, every
    // example decided so by both packs, and the cover complete.
    let (all, _) = diff(&old, &new, None, DEFAULT_BUDGET, usize::MAX);
    assert!(all.complete && !all.regions_truncated && all.regions_unverified == 0);
    assert!(all.regions.len() >= report.regions.len());
    for r in &all.regions {
        assert_eq!(
            (r.old.as_deref(), r.new.as_deref()),
            (None, Some("FrostAttention"))
        );
        assert_eq!(r.rules, vec!["FR.22".to_string()]);
        assert_eq!(
            decide_example(&old, &r.example).unwrap(),
            None,
            "{}",
            r.example
        );
        assert_eq!(
            decide_example(&new, &r.example).unwrap().as_deref(),
            Some("FrostAttention")
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Non-linear arithmetic between facts (the te pack's FE.gqa / RG.a2a_heads) and negative
/// window bounds (FR.26) were false W-NEVER-FIRES: now the rules are shown satisfiable (or,
/// where no witness exists among the classes, reported as incomplete), never "never fires".
#[test]
fn check_has_no_false_never_fires_for_fact_modulo_fact_and_negative_windows() {
    let dir = std::env::temp_dir().join(format!("attn-policy-nonlinear-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("pack.yaml"),
        "name: nonlinear\ndefs:\n  fq_h: num_heads // if(context_parallel, cp_size, 1)\n  \
         fq_hg: num_gqa_groups // if(context_parallel, cp_size, 1)\nbackends:\n  - a.yaml\n\
         preference:\n  - id: default\n    order: [A]\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("a.yaml"),
        "backend: A\nsupports: [fp8, bias, alibi, dropout, softcap, score_mod, num_splits, \
         cuda_graph, checkpoint_core_attention, return_max_logit, kv_cache, paged_kv, thd, \
         deterministic, window, cp_p2p, cp_all_gather, cp_a2a, cp_a2a+p2p, softmax_type]\n\
         rules:\n  - id: A.heads\n    when: context_parallel and num_heads % cp_size != 0\n    \
         reason: heads\n  - id: A.gqa\n    when: fq_hg != 0 and fq_h % fq_hg != 0\n    \
         reason: gqa\n  - id: A.win\n    when: window.left < -1\n    reason: window\n",
    )
    .unwrap();
    let p = Policy::from_dir(&dir).unwrap();
    let diags = lint(&p);
    for id in ["A.heads", "A.gqa", "A.win"] {
        assert!(
            !diags
                .iter()
                .any(|d| d.code == "W-NEVER-FIRES" && d.message.contains(&format!("`{id}`"))),
            "{id}: {diags:#?}"
        );
        assert!(
            !diags
                .iter()
                .any(|d| d.code == "W-ALWAYS-FIRES" && d.message.contains(&format!("`{id}`"))),
            "{id}: {diags:#?}"
        );
    }
    // And each really fires on a concrete input. The lints search the space the facts' types
    // allow; A.gqa and A.win fire only on inputs the te family refuses when read (KV heads that
    // do not divide the query heads, a window bound below -1), so those are read unvalidated.
    let fires = |cfg: Json, id: &str| {
        let d = p.decide(&attn_policy::facts::te::TE.read_unvalidated(&cfg).unwrap());
        d.fired.iter().any(|&r| p.rules[r as usize].id == id)
    };
    assert!(fires(
        json!({"context_parallel": true, "cp_size": 2, "num_heads": 3, "num_gqa_groups": 3}),
        "A.heads"
    ));
    assert!(fires(
        json!({"num_heads": 12, "num_gqa_groups": 8}),
        "A.gqa"
    ));
    assert!(fires(json!({"window_size": [-5, 0]}), "A.win"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A comparison between two facts is evaluated on blocks that line up on both sides: with each
/// fact's own coarse blocks ("every head dim above 1" as one block), `head_dim_qk > head_dim_v`
/// was evaluated once, at equal values, and the restriction below selected nothing.
#[test]
fn comparisons_between_facts_keep_their_regions() {
    let p = Policy::embedded("te").unwrap();
    let w = Restriction::parse(
        "sm == 90 and context_parallel and 256 < head_dim_qk <= 512 and head_dim_qk > head_dim_v \
         and head_dim_v >= 64",
    )
    .unwrap();
    let (r, _) = gaps(&p, Some(&w), DEFAULT_BUDGET, 5);
    assert!(r.complete && r.gaps_exist);
    assert!(!r.regions.is_empty());
    for g in &r.regions {
        let (qk, v) = (
            g.example["head_dim_qk"].as_i64().unwrap(),
            g.example["head_dim_v"].as_i64().unwrap_or(0),
        );
        assert!(qk > v && v >= 64 && 256 < qk && qk <= 512, "{}", g.example);
        assert_eq!(decide_example(&p, &g.example), Ok(None), "{}", g.example);
    }
}

/// Executor-chain lints over a catalogue: `huge` admits only head dims the backend declines
/// (dead), and head dims 129..=256 are admitted by the backend but by no entry.
#[test]
fn executor_chain_lints_find_dead_entries_and_stranded_inputs() {
    use attn_policy::{CatalogueEntry, ExecutorCatalogue, PackSpec, Provider};
    let entry = |name: &str, admits: &str| CatalogueEntry {
        name: name.into(),
        description: String::new(),
        provider: Provider::Builtin,
        admits: vec![("te".into(), admits.into())],
    };
    let mut catalogue = ExecutorCatalogue::new();
    catalogue.add(entry("small", "head_dim_qk <= 128"));
    catalogue.add(entry("huge", "head_dim_qk > 1000"));
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/analysis/chains"
    );
    let policy = PackSpec::dir(dir)
        .with_catalogue(std::sync::Arc::new(catalogue))
        .load()
        .expect("fixture loads");
    let diags = lint(&policy);
    let dead: Vec<_> = diags
        .iter()
        .filter(|d| d.code == "W-DEAD-EXECUTOR")
        .collect();
    assert_eq!(dead.len(), 1, "{diags:#?}");
    assert!(dead[0].message.contains("`huge`"), "{}", dead[0].message);
    let stranded: Vec<_> = diags.iter().filter(|d| d.code == "W-NO-EXECUTOR").collect();
    assert_eq!(stranded.len(), 1, "{diags:#?}");
    // The example is a real stranded input: the backend serves it, no entry admits it.
    let help = stranded[0].help.as_deref().expect("an example");
    let example: serde_json::Value =
        serde_json::from_str(help.strip_prefix("e.g. ").expect("e.g. prefix")).expect("json");
    let d = example["head_dim_qk"]
        .as_i64()
        .expect("head_dim_qk in the example");
    assert!((129..=256).contains(&d), "example head_dim_qk {d}");
    // With `small` widened to every served head dim, nothing is stranded.
    let mut wide = ExecutorCatalogue::new();
    wide.add(entry("small", "head_dim_qk <= 256"));
    wide.add(entry("huge", "head_dim_qk > 1000"));
    let policy = PackSpec::dir(dir)
        .with_catalogue(std::sync::Arc::new(wide))
        .load()
        .expect("fixture loads");
    assert!(!lint(&policy).iter().any(|d| d.code == "W-NO-EXECUTOR"));
}

/// The analysis enumerates the third version state: a copy of the te pack whose FR.27 also
/// declines an unparseable frontend version differs from the te pack exactly where the
/// version is present but unparseable (and FROST would otherwise serve), and the regions say
/// so in the rule language (`parsed(...)`), with examples that read back as unparseable.
#[test]
fn te_diff_sees_the_unparseable_frontend_version() {
    let old = Policy::embedded("te").unwrap();
    let dir = std::env::temp_dir().join(format!("attn-policy-te-fe-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../rules/te")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    let f = dir.join("frost_attention.yaml");
    let text = std::fs::read_to_string(&f).unwrap();
    let guarded = "when: cudnn_frontend_version == null or (parsed(cudnn_frontend_version) and \
                   cudnn_frontend_version < 1.29.0)";
    assert!(text.contains(guarded), "FR.27 as in the te pack");
    let declines_unparseable = "when: cudnn_frontend_version == null or not \
                                parsed(cudnn_frontend_version) or cudnn_frontend_version < 1.29.0";
    std::fs::write(&f, text.replace(guarded, declines_unparseable)).unwrap();
    let new = Policy::from_dir(&dir).expect("the copy loads");
    // The frontend version free; the head dims pinned to the seed's 512 (with the two dims
    // free, the diff's witness search leaves cubes of their relation unverified, whatever the
    // change: a limitation of the search, not of the version state).
    let slice = TE_SLICE
        .replace("cudnn_frontend_version == 1.29.0 and ", "")
        .replace(
            "256 < head_dim_qk <= 512 and head_dim_v == head_dim_qk",
            "head_dim_qk == 512 and head_dim_v == 512",
        );
    assert!(!slice.contains("cudnn_frontend_version") && !slice.contains("256 <"));
    let (report, w) = diff_changing_one_rule(&old, &new, &slice, "FR.27@FrostAttention");
    for r in &report.regions {
        assert_eq!(
            r.old.as_deref(),
            Some("FrostAttention"),
            "{:?}",
            r.constraints
        );
        assert_ne!(r.new.as_deref(), Some("FrostAttention"));
        assert_eq!(r.rules, vec!["FR.27".to_string()]);
        assert_eq!(
            r.constraints["cudnn_frontend_version"],
            json!("cudnn_frontend_version != null and not parsed(cudnn_frontend_version)")
        );
        let fe = r.example["cudnn_frontend_version"].as_str().unwrap();
        assert!(attn_policy::lang::Version::parse(fe).is_none(), "{fe}");
        assert_eq!(
            decide_example(&old, &r.example).unwrap().as_deref(),
            Some("FrostAttention")
        );
        assert_ne!(
            decide_example(&new, &r.example).unwrap().as_deref(),
            Some("FrostAttention")
        );
    }
    let regions: Vec<Restriction> = report
        .regions
        .iter()
        .map(|r| Restriction::of_constraints(&r.constraints).unwrap())
        .collect();
    // Brute force over the three states (and the floor's neighbours): a config lies in a
    // region iff the packs differ, and they differ exactly for the unparseable versions.
    let mut differ = 0;
    for sm in [90, 100, 103] {
        // FusedAttention (answered "supported") comes first unless it is switched off.
        for fused in [json!(null), json!("0")] {
            for fe in [
                json!(null),
                json!("1.28.0"),
                json!("1.29.0rc1"),
                json!("1.29.0"),
                json!("1.30.1"),
                json!("1.29.x-custom"),
                json!("not-a-version"),
            ] {
                let c = json!({
                    "qkv_dtype": "bf16", "qkv_layout": "bshd_bshd_bshd",
                    "attn_mask_type": "causal", "max_seqlen_q": 8192, "max_seqlen_kv": 8192,
                    "num_heads": 16, "num_gqa_groups": 16, "context_parallel": true,
                    "cp_size": 2, "cp_size_a2a": 2, "batch_size": 2,
                    "flash_attn_versions": {"v2": "2.7.4"}, "cudnn_version": "9.19.0",
                    "cudnn_frontend_version": fe, "cutlass_dsl_version": "4.7.1",
                    "device_compute_capability": [sm / 10, sm % 10],
                    "head_dim_qk": 512, "head_dim_v": 512,
                    "env": {"NVTE_FUSED_ATTN": fused},
                    "probe": {"fused_attn_graph": true, "frost_plan": true, "cuda_device": true}
                });
                let facts = Facts::from_json(&c).unwrap();
                assert!(w.holds(&facts), "{c}");
                let (a, b) = (
                    decide_example(&old, &c).unwrap(),
                    decide_example(&new, &c).unwrap(),
                );
                let hits = regions.iter().filter(|r| r.holds(&facts)).count();
                if a != b {
                    differ += 1;
                    assert!(fe.as_str().is_some_and(|s| s.contains('-')), "{c}");
                    assert_eq!(hits, 1, "{c}");
                } else {
                    assert_eq!(hits, 0, "{c}");
                }
            }
        }
    }
    assert_eq!(
        differ,
        2 * 2,
        "sm100/103 x 2 unparseable versions, FusedAttention off"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// te@2.19.0's CQ.hdim admits (256, 256) training on sm100 from `cudnn_version >=
/// if(thd_any, 9.25.0, 9.23.0)`: a version compared with a choice between constants. Those
/// constants must cut the version's classes (else the class (9.24.0, 9.26.0) is decided at its
/// representative 9.24.1, and THD configurations on cuDNN 9.25 decided FusedAttention ->
/// none, such as the corpus's s1-4246, lie in no region). Brute force over cuDNN versions in
/// a slice pinning the other facts: a configuration lies in a region iff the packs differ.
#[test]
fn te_diff_splits_versions_at_constants_chosen_by_if() {
    let old = Policy::embedded("te@2.19.0").unwrap();
    let new = Policy::embedded("te@2.20.2").unwrap();
    let base = json!({
        "device_compute_capability": [10, 0], "flash_attn_versions": {"v2": "2.8.3"},
        "qkv_type": "Tensor", "qkv_dtype": "bf16", "fp8": false, "is_training": true,
        "qkv_layout": "th3d", "batch_size": 2, "num_heads": 8, "num_gqa_groups": 8,
        "max_seqlen_q": 255, "max_seqlen_kv": 255, "head_dim_qk": 256, "head_dim_v": 256,
        "attn_mask_type": "causal", "num_tokens_q": 510, "num_tokens_kv": 510,
        "pad_between_seqs": true, "window_size": null, "bottom_right_diagonal": false,
        "core_attention_bias_type": "no_bias", "attention_dropout": 0.0, "deterministic": false,
        "softmax_type": "vanilla", "softcap": 0.0, "return_max_logit": false,
        "cuda_graph": false, "num_splits": 1, "checkpoint_core_attention": false,
        "has_score_mod": false, "has_score_mod_bprop": false
    });
    let slice = "sm == 100 and qkv_layout == \"th3d\" and attn_mask_type == \"causal\" \
        and is_training and not fp8 and qkv_dtype == \"bf16\" and qkv_type == \"Tensor\" \
        and batch_size == 2 and num_heads == 8 and num_gqa_groups == 8 \
        and max_seqlen_q == 255 and max_seqlen_kv == 255 and head_dim_qk == 256 \
        and head_dim_v == 256 and num_tokens_q == 510 and num_tokens_kv == 510 \
        and pad_between_seqs and window_size == null and not bottom_right_diagonal \
        and core_attention_bias_type == \"no_bias\" and attention_dropout == 0.0 \
        and not deterministic and softmax_type == \"vanilla\" and softcap == 0.0 \
        and not return_max_logit and not cuda_graph and num_splits == 1 \
        and not checkpoint_core_attention and not has_score_mod and not has_score_mod_bprop \
        and flash_attn_versions.v2 == 2.8.3 and flash_attn_versions.v3 == null \
        and flash_attn_versions.v4 == null";
    let w = Restriction::parse(slice).unwrap();
    let (report, _) = diff(&old, &new, Some(&w), DEFAULT_BUDGET, usize::MAX);
    assert!(report.complete && !report.regions_truncated);
    let regions: Vec<Restriction> = report
        .regions
        .iter()
        .map(|r| Restriction::of_constraints(&r.constraints).unwrap())
        .collect();
    let mut differ = 0;
    for cudnn in [
        "9.22.0", "9.23.0", "9.24.0", "9.24.1", "9.24.9", "9.25.0", "9.25.3", "9.26.0", "9.27.0",
    ] {
        let mut config = base.clone();
        config["cudnn_version"] = json!(cudnn);
        let facts = Facts::from_json(&config).unwrap();
        assert!(w.holds(&facts), "{cudnn}");
        let (o, n) = (
            decide_example(&old, &config).unwrap(),
            decide_example(&new, &config).unwrap(),
        );
        let held = regions.iter().filter(|r| r.holds(&facts)).count();
        assert_eq!(
            held > 0,
            o != n,
            "cuDNN {cudnn}: {o:?} -> {n:?}, {held} regions"
        );
        assert!(held <= 1, "cuDNN {cudnn}: regions overlap");
        differ += usize::from(o != n);
    }
    // 9.25.0 and 9.25.3 (s1-4246 is on 9.25.0): FusedAttention -> none by C.2.
    assert!(differ >= 2, "{differ}");
}

/// Runs `f` on the te pack's diagrams, built in a fresh manager: (pack, space, manager,
/// diagrams).
fn with_te_diagrams<R>(
    f: impl FnOnce(
        &Policy,
        &attn_policy_analysis::space::Space,
        &mut attn_policy_analysis::mdd::Mdd<'_>,
        &attn_policy_analysis::mdd::PolicyDiagrams,
    ) -> R,
) -> R {
    use attn_policy_analysis::mdd::{Mdd, PolicyDiagrams};
    use attn_policy_analysis::regions::add_policy;
    use attn_policy_analysis::space::SpaceBuilder;
    let policy = Policy::embedded("te").unwrap();
    let mut sb = SpaceBuilder::for_schema(policy.schema);
    add_policy(&mut sb, &policy);
    let space = sb.build();
    let mut m = Mdd::for_policies(&space, &[&policy]);
    let d = PolicyDiagrams::build(&mut m, &policy);
    f(&policy, &space, &mut m, &d)
}

/// `Mdd::first_cube` (check's W-NO-EXECUTOR example, walked on the pair "f and ties" without
/// building it) is exactly the first cube of `Mdd::cover` (which builds it): on the te pack's
/// diagrams of where each backend is eligible, whose first cubes test relation variables (so
/// ties are applied on the way and `widest_path_and` groups the pair's children).
#[test]
fn first_cube_is_the_first_cube_of_the_cover() {
    use attn_policy_analysis::mdd::{FALSE, TRUE};
    with_te_diagrams(|policy, space, m, d| {
        let (mut asked, mut with_relations) = (0, 0);
        for b in 0..policy.backends.len() {
            let out = d.declined_within(m, b, TRUE);
            let eligible = m.not(out);
            if eligible == FALSE {
                continue;
            }
            let first = m.first_cube(eligible);
            let (cubes, _) = m.cover(eligible, 1);
            assert_eq!(first, cubes.first().cloned(), "{}", policy.backends[b].name);
            asked += 1;
            let cube = first.expect("an eligible backend has a cube");
            if cube[space.vars.len()..].iter().any(Option::is_some) {
                with_relations += 1;
            }
        }
        assert!(asked >= 3, "{asked} backends asked");
        assert!(
            with_relations >= 1,
            "no first cube tested a relation variable"
        );
    });
}

/// `widen_inside` keeps its walks' answers for the manager's life, keyed by the cube suffix
/// they read: widening cubes one after the other (in either order) gives what a fresh
/// manager gives for each cube alone.
#[test]
fn widening_with_kept_memos_equals_widening_afresh() {
    use attn_policy_analysis::mdd::{FALSE, Mdd, PolicyDiagrams, TRUE};
    use attn_policy_analysis::regions::add_policy;
    use attn_policy_analysis::space::SpaceBuilder;
    let policy = Policy::embedded("torch").unwrap();
    let mut sb = SpaceBuilder::for_schema(policy.schema);
    add_policy(&mut sb, &policy);
    let space = sb.build();
    // The same diagrams in a fresh manager: (manager, per backend (eligible, valid, eligible
    // or some rule: a larger set its cubes widen inside)).
    let fresh = || {
        let mut m = Mdd::for_policies(&space, &[&policy]);
        let d = PolicyDiagrams::build(&mut m, &policy);
        let sets: Vec<(u32, u32, Vec<u32>)> = (0..policy.backends.len())
            .map(|b| {
                let out = d.declined_within(&mut m, b, TRUE);
                let eligible = m.not(out);
                // Some valid set that is not everything: where the first rule does not fire.
                let valid = m.not(d.rule[0]);
                let wider = d.rule.iter().take(3).map(|&r| m.or(eligible, r)).collect();
                (eligible, valid, wider)
            })
            .collect();
        (m, sets)
    };
    let (mut m, sets) = fresh();
    let mut jobs = Vec::new();
    for (eligible, valid, wider) in &sets {
        if *eligible == FALSE {
            continue;
        }
        let (cubes, _) = m.cover(*eligible, 2);
        for cube in cubes {
            for &f in wider {
                jobs.push((f, TRUE, cube.clone()));
                jobs.push((f, *valid, cube.clone()));
            }
        }
    }
    assert!(jobs.len() >= 6, "{} cubes", jobs.len());
    let alone: Vec<_> = jobs
        .iter()
        .map(|(f, valid, cube)| fresh().0.widen_inside(*f, *valid, cube))
        .collect();
    let forward: Vec<_> = jobs
        .iter()
        .map(|(f, valid, cube)| m.widen_inside(*f, *valid, cube))
        .collect();
    assert_eq!(forward, alone);
    let (m2, _) = fresh();
    let mut backward: Vec<_> = jobs
        .iter()
        .rev()
        .map(|(f, valid, cube)| m2.widen_inside(*f, *valid, cube))
        .collect();
    backward.reverse();
    assert_eq!(backward, alone);
    // Some cube widened at all (the test compares something).
    assert!(jobs.iter().zip(&alone).any(|(j, w)| &j.2 != w));
}

/// Nodes are hash-consed in two tables (those created since the last flush of a small table,
/// and the older ones): a function rebuilt by other operations, long after its nodes were
/// moved to the large table, or just after, is the same node. Identities over the te pack's
/// diagrams (hundreds of thousands of nodes, so the small table was flushed many times).
#[test]
fn equal_functions_are_equal_nodes_across_table_flushes() {
    with_te_diagrams(|_, _, m, d| {
        assert!(m.size() > 100_000, "{} nodes", m.size());
        let outs: Vec<u32> = d.variant_out.iter().flatten().copied().collect();
        let mut checked = 0;
        for (i, &a) in outs.iter().enumerate() {
            for &b in d.rule.iter().skip(i * 7).take(5) {
                // `(a and b) or (a and not b)` is `a`: rebuilt bottom-up, found again.
                let (ab, a_not_b) = (m.and(a, b), m.minus(a, b));
                assert_eq!(m.or(ab, a_not_b), a, "variant_out {i}");
                // De Morgan: `a and b` (just built) built again through negations.
                let (na, nb) = (m.not(a), m.not(b));
                let either = m.or(na, nb);
                assert_eq!(m.not(either), ab, "variant_out {i}");
                checked += 1;
            }
        }
        assert!(checked >= 10, "{checked} identities checked");
    });
}
