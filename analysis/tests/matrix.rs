//! Support matrices (issue 21): the cell analysis against brute force on fixture packs (every
//! outcome reachable and every deciding fact, on domains that reach every class), the te and
//! torch docs matrices against sampled decisions, every listed example decided as claimed, the
//! Markdown and JSON renderings as reviewed snapshots, the HTML and SVG parsed and checked for
//! external references, and `diff --format matrix` on a known rule deletion.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use attn_policy::Policy;
use attn_policy_analysis::matrix::grid::merge;
use attn_policy_analysis::matrix::{
    AxisQuery, DEFAULT_BUDGET, Free, Matrix, MatrixDiff, Query, build, docs, outcome_label,
};
use serde_json::{Value as Json, json};

fn fixture(name: &str) -> Policy {
    Policy::from_dir(format!(
        "{}/../tests/fixtures/analysis/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("fixture loads")
}

fn query(rows: &str, cols: &str, fix: &[&str], free: &str) -> Query {
    Query {
        rows: AxisQuery::parse(rows),
        cols: AxisQuery::parse(cols),
        fix: fix.iter().map(|f| Query::parse_fix(f)).collect(),
        free: Free::parse(free),
    }
}

/// The outcome label the pack selects for a config (probes answered "supported").
fn decide(p: &Policy, config: &Json) -> String {
    // Like `gaps`, the matrix does not tie te's head-count constraint (it lists what the rules
    // decide there), so brute force decides such inputs too; every other constraint holds in
    // the domains below.
    let mut f = p
        .schema
        .read_unvalidated(config)
        .unwrap_or_else(|e| panic!("{config}: {e}"));
    f.set_all_probes(true);
    let d = p.decide(&f);
    match d.selected {
        None => "none".into(),
        Some(b) => {
            let bk = &p.backends[b as usize];
            let v = d.backends[b as usize]
                .variant
                .filter(|_| !bk.variants.is_empty())
                .map(|v| bk.variants[v as usize].name.clone());
            outcome_label(&Some(bk.name.clone()), &v)
        }
    }
}

/// Every outcome a cell claims (shown first, then the alternatives).
fn claimed(c: &attn_policy_analysis::matrix::Cell) -> BTreeSet<String> {
    std::iter::once(Matrix::label(c))
        .chain(
            c.alternatives
                .iter()
                .map(|a| outcome_label(&a.backend, &a.variant)),
        )
        .collect()
}

/// Brute force over a cell: every combination of the free facts' values (on top of the
/// cell's config): the outcomes seen, and the facts for which two combinations differing in
/// that fact alone are decided differently.
fn brute(
    p: &Policy,
    config: &Json,
    free: &[(&str, Vec<Json>)],
) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut decided: BTreeMap<Vec<usize>, String> = BTreeMap::new();
    let mut idx = vec![0usize; free.len()];
    loop {
        let mut c = config.clone();
        for (k, (name, values)) in free.iter().enumerate() {
            c[*name] = values[idx[k]].clone();
        }
        decided.insert(idx.clone(), decide(p, &c));
        // Next combination (odometer).
        let mut k = 0;
        while k < free.len() {
            idx[k] += 1;
            if idx[k] < free[k].1.len() {
                break;
            }
            idx[k] = 0;
            k += 1;
        }
        if k == free.len() {
            break;
        }
    }
    let outcomes = decided.values().cloned().collect();
    let mut deciding = BTreeSet::new();
    for (i, o) in &decided {
        for (k, (name, values)) in free.iter().enumerate() {
            for j in 0..values.len() {
                let mut other = i.clone();
                other[k] = j;
                if decided[&other] != *o {
                    deciding.insert(name.to_string());
                }
            }
        }
    }
    (outcomes, deciding)
}

/// Checks a matrix against brute force: per cell, the brute-force outcomes are among the
/// claimed ones and every fact brute force finds deciding is listed; with `exact`, both are
/// equal (the domain reaches every class the analysis distinguishes).
fn check_against_brute_force(
    p: &Policy,
    m: &Matrix,
    free: &[(&str, Vec<Json>)],
    exact: bool,
) -> usize {
    let inexact: Vec<&Json> = m
        .cells
        .iter()
        .filter(|c| !c.exact)
        .map(|c| &c.config)
        .collect();
    assert!(m.complete, "inexact cells: {inexact:?}");
    let mut depends = 0;
    for c in &m.cells {
        let (outcomes, deciding) = brute(p, &c.config, free);
        let claims = claimed(c);
        assert!(
            outcomes.is_subset(&claims),
            "{}: brute force {outcomes:?}, claimed {claims:?}",
            c.config
        );
        assert_eq!(decide(p, &c.config), Matrix::label(c), "{}", c.config);
        let listed: BTreeSet<String> = c.depends_on.iter().cloned().collect();
        assert!(
            deciding.is_subset(&listed),
            "{}: brute force finds {deciding:?} deciding, listed {listed:?}",
            c.config
        );
        if exact {
            assert_eq!(outcomes, claims, "{}", c.config);
            assert_eq!(deciding, listed, "{}", c.config);
        }
        depends += usize::from(!c.depends_on.is_empty());
        for a in &c.alternatives {
            let mut config = c.config.clone();
            merge(&mut config, &Json::Object(a.changes.clone()));
            assert_eq!(
                decide(p, &config),
                outcome_label(&a.backend, &a.variant),
                "{config}"
            );
        }
    }
    depends
}

fn ints(v: impl IntoIterator<Item = i64>) -> Vec<Json> {
    v.into_iter().map(|x| json!(x)).collect()
}

/// Remainders, products and per-step lengths of free facts (predicate variables) with the
/// axes pinning some of the facts they read.
#[test]
fn nonlinear_fixture_matrix_equals_brute_force() {
    let p = fixture("nonlinear");
    let m = build(
        &p,
        &query(
            "cp_size=1,2,3,4",
            // KV heads that divide the cells' 16 query heads (TE refuses others when read).
            "num_gqa_groups=1,2,4",
            &["context_parallel=true"],
            "num_heads,batch_size,max_seqlen_q",
        ),
        DEFAULT_BUDGET,
    )
    .unwrap();
    let free = [
        ("num_heads", ints(1..=12)),
        ("batch_size", ints([1, 4, 8, 16, 41, 64, 65])),
        (
            "max_seqlen_q",
            ints([50, 100, 101, 150, 202, 203, 303, 404, 505]),
        ),
    ];
    assert!(check_against_brute_force(&p, &m, &free, true) > 0);
    // cp_size 2, gqa 1: A serves even head counts; otherwise B where batch * heads <= 64 and
    // the per-step length q // 2 <= 100, else nothing.
    let c = m.cell(1, 0);
    assert_eq!(
        c.depends_on,
        ["batch_size", "num_heads", "max_seqlen_q"].map(String::from)
    );
}

/// Orderings between a pinned and a free fact (`head_dim_qk != head_dim_v`, `max_seqlen_q >
/// max_seqlen_kv`), residues of a free fact (`max_seqlen_kv % 64`).
#[test]
fn relation_fixture_matrix_equals_brute_force() {
    let p = fixture("rel");
    let m = build(
        &p,
        &query(
            "head_dim_qk=8,12,264,520",
            "max_seqlen_q=1,64,65",
            &[],
            "head_dim_v,max_seqlen_kv",
        ),
        DEFAULT_BUDGET,
    )
    .unwrap();
    let mut dims: Vec<i64> = (1..=12).collect();
    dims.extend(248..=272);
    dims.extend(500..=530);
    let free = [
        ("head_dim_v", ints(dims)),
        ("max_seqlen_kv", ints([1, 2, 3, 63, 64, 65, 128, 129])),
    ];
    assert!(check_against_brute_force(&p, &m, &free, true) > 0);
}

/// With nothing free every cell is decided by its axes and the held facts: no marks.
#[test]
fn nothing_free_means_no_marks() {
    let p = fixture("rel");
    let m = build(
        &p,
        &query("head_dim_qk=8,264", "max_seqlen_q=1,65", &[], "none"),
        DEFAULT_BUDGET,
    )
    .unwrap();
    assert!(m.free.is_empty() && m.complete);
    assert!(m.cells.iter().all(|c| c.depends_on.is_empty()));
    for c in &m.cells {
        assert_eq!(decide(&p, &c.config), Matrix::label(c));
    }
}

/// The te and torch docs matrices against decisions sampled over their free facts: every
/// sampled outcome is claimed, every fact a sample shows deciding is listed, and each
/// listed alternative is decided as claimed.
#[test]
fn docs_matrices_are_sound_on_samples() {
    let te_free = [
        ("num_heads", ints([1, 3, 16, 64])),
        ("num_gqa_groups", ints([1, 16])),
        ("max_seqlen_q", ints([1, 128, 8192])),
        ("max_seqlen_kv", ints([1, 128, 8192])),
        ("batch_size", ints([1, 2])),
    ];
    let torch_free = [
        ("heads_q", ints([1, 8, 16])),
        ("heads_kv", ints([1, 16])),
        ("seqlen_q", ints([1, 128, 4096])),
        ("seqlen_kv", ints([0, 128, 4096])),
    ];
    for q in docs::QUESTIONS {
        let (pack, _) = q.query().unwrap();
        let p = Policy::embedded(&pack).unwrap();
        let m = q.build(DEFAULT_BUDGET).unwrap();
        let free: &[(&str, Vec<Json>)] = match pack.as_str() {
            "torch" => &torch_free,
            _ => &te_free,
        };
        let depends = check_against_brute_force(&p, &m, free, false);
        // Every te and torch question has cells that depend on the shape facts.
        assert!(depends > 0 || pack == "native", "{}", q.title);
    }
}

/// A small te matrix, reviewed by hand against the rules (see the snapshot's notes).
fn small_te() -> Matrix {
    let p = Policy::embedded("te").unwrap();
    build(
        &p,
        &query(
            "attn_mask_type=no_mask,causal,arbitrary",
            "sm=80,90,100",
            &[
                "head_dim=128",
                "qkv_dtype=bf16",
                "is_training=true",
                "flash_attn_versions.v2=2.7.4",
                "qkv_layout=bshd_bshd_bshd",
                "env",
            ],
            "shape",
        ),
        DEFAULT_BUDGET,
    )
    .unwrap()
}

#[test]
fn markdown_snapshot() {
    insta::assert_snapshot!(small_te().to_markdown());
}

#[test]
fn json_snapshot() {
    insta::assert_json_snapshot!(small_te().to_json());
}

/// The JSON contract: the keys of docs/matrix.md, cells in row-major order with the axes'
/// values, `depends_on` only where the cell depends on free facts.
#[test]
fn json_follows_the_contract() {
    let m = small_te();
    let j = m.to_json();
    let keys: Vec<&str> = j.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        ["pack", "rows", "cols", "fixed", "cells", "free", "complete"]
    );
    assert_eq!(j["rows"]["axis"], "attn_mask_type");
    assert_eq!(j["cols"]["values"], json!([80, 90, 100]));
    let cells = j["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 9);
    for (i, c) in cells.iter().enumerate() {
        let o = c.as_object().unwrap();
        let k: Vec<&str> = o.keys().map(String::as_str).collect();
        let base = ["attn_mask_type", "sm", "backend", "variant"];
        assert_eq!(&k[..4], base);
        assert_eq!(k.len() == 5, !m.cells[i].depends_on.is_empty());
        assert_eq!(c["sm"], j["cols"]["values"][i % 3]);
    }
}

/// Everything an element could load from elsewhere.
fn external_references(doc: &roxmltree::Document) -> Vec<String> {
    let mut out = Vec::new();
    for n in doc.descendants() {
        if n.is_element() {
            let tag = n.tag_name().name();
            if [
                "link", "iframe", "object", "embed", "img", "image", "use", "base",
            ]
            .contains(&tag)
            {
                out.push(format!("<{tag}>"));
            }
            for a in n.attributes() {
                let v = a.value();
                let name = a.name();
                if [
                    "src",
                    "href",
                    "action",
                    "data",
                    "poster",
                    "srcset",
                    "background",
                ]
                .contains(&name)
                    && !v.starts_with('#')
                {
                    out.push(format!("{name}={v}"));
                }
                if v.contains("url(") || v.contains("@import") {
                    out.push(format!("{name}: {v}"));
                }
            }
        }
        if n.is_text() {
            let t = n.text().unwrap_or_default();
            if t.contains("url(") || t.contains("@import") || t.contains("//cdn") {
                out.push(t.chars().take(60).collect());
            }
        }
    }
    // No address anywhere, except the SVG namespace name (an identifier, never fetched).
    let text = doc
        .input_text()
        .replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
    for scheme in ["http://", "https://", "ftp://", "file:"] {
        if text.contains(scheme) {
            out.push(scheme.to_string());
        }
    }
    out
}

/// The docs' HTML and a single matrix's HTML parse (well-formed), load nothing from
/// elsewhere, and carry every cell's explanation: each cell's data names every backend with
/// a status, and every declining rule with its id and `file:line:col` location.
#[test]
fn html_is_self_contained_and_explains_every_cell() {
    let docs_html = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/support-matrix.html"
    ))
    .unwrap();
    for (what, html, cells) in [
        ("docs", docs_html, None),
        ("small", small_te().to_html(), Some(9)),
    ] {
        let doc = roxmltree::Document::parse_with_options(
            &html,
            roxmltree::ParsingOptions {
                allow_dtd: true,
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(external_references(&doc), Vec::<String>::new(), "{what}");
        let script = doc
            .descendants()
            .find(|n| n.attribute("id") == Some("matrix-data"))
            .and_then(|n| n.text())
            .unwrap();
        let data: Json = serde_json::from_str(script).unwrap();
        let tds: Vec<_> = doc
            .descendants()
            .filter(|n| n.has_tag_name("td") && n.attribute("data-i").is_some())
            .collect();
        if let Some(n) = cells {
            assert_eq!(tds.len(), n);
        }
        for td in &tds {
            let m = &data[td.attribute("data-m").unwrap().parse::<usize>().unwrap()];
            let c = &m["cells"][td.attribute("data-i").unwrap().parse::<usize>().unwrap()];
            assert_eq!(
                td.attribute("title").unwrap(),
                c["label"].as_str().unwrap(),
                "{what}"
            );
            let backends = c["backends"].as_array().unwrap();
            assert!(!backends.is_empty());
            for b in backends {
                assert!(
                    ["selected", "outranked", "declined", "disabled", "undecided"]
                        .contains(&b["status"].as_str().unwrap())
                );
                if b["status"] == "declined" {
                    assert!(
                        !b["rules"].as_array().unwrap().is_empty()
                            || !b["unavailable"].as_array().unwrap().is_empty()
                    );
                }
                for r in b["rules"].as_array().unwrap() {
                    let rule = &m["rules"][r.as_u64().unwrap() as usize];
                    assert!(rule["id"].is_string(), "{rule}");
                    let loc = rule["location"].as_str().unwrap();
                    assert_eq!(loc.split(':').count(), 3, "{loc}");
                    assert!(loc.contains(".yaml"), "{loc}");
                }
            }
        }
        // A colour per backend, and a legend naming each.
        let legend: Vec<String> = doc
            .descendants()
            .filter(|n| {
                n.has_tag_name("li")
                    && n.parent().and_then(|p| p.attribute("class")) == Some("legend")
            })
            .map(|n| n.descendants().filter_map(|x| x.text()).collect::<String>())
            .collect();
        assert!(legend.iter().any(|l| l == "none"), "{what}: {legend:?}");
    }
}

#[test]
fn svg_is_well_formed_and_self_contained() {
    let m = small_te();
    let svg = m.to_svg();
    let doc = roxmltree::Document::parse(&svg).unwrap();
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    assert_eq!(external_references(&doc), Vec::<String>::new());
    // One rectangle per cell (with its outcome as the tooltip), and every label drawn.
    let titles: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text())
        .collect();
    let labels: Vec<String> = m.cells.iter().map(Matrix::label).collect();
    assert_eq!(titles, labels);
    assert!(
        doc.descendants()
            .any(|n| n.text() == Some("UnfusedDotProductAttention"))
    );
}

/// Deleting FROST's FR.22 (window with p2p / a2a+p2p) changes exactly the windowed p2p and
/// a2a+p2p cells above head dim 256 on sm103, from none to FrostAttention.
#[test]
fn diff_matrix_shows_the_frost_window_rule_deletion() {
    let old = Policy::embedded("te").unwrap();
    let (dir, new) = common::te_without_fr22("matrix-nowin");
    let q = query(
        "cp_comm_type",
        "head_dim=128,256,264,512",
        &[
            "sm=103",
            "window_size=[128,0]",
            "attn_mask_type=causal",
            "qkv_dtype=bf16",
            "is_training=true",
            "flash_attn_versions.v2=2.7.4",
            "cudnn_frontend_version=1.29.0",
            "cutlass_dsl_version=4.7.1",
            "qkv_layout=bshd_bshd_bshd",
        ],
        "shape",
    );
    let (mo, mn) = (
        build(&old, &q, DEFAULT_BUDGET).unwrap(),
        build(&new, &q, DEFAULT_BUDGET).unwrap(),
    );
    let d = MatrixDiff {
        old: &mo,
        new: &mn,
        old_name: "te".into(),
        new_name: "te without FR.22".into(),
    };
    let changes = d.changes();
    let mut changed_outcomes = Vec::new();
    for (i, ch) in changes.iter().enumerate() {
        let (r, c) = (i / 4, i % 4);
        let (comm, hd) = (mo.rows.values[r].as_str().unwrap(), &mo.cols.values[c]);
        if *ch == Some(attn_policy_analysis::matrix::Change::Outcome) {
            assert_eq!(Matrix::label(&mo.cells[i]), "none");
            assert_eq!(Matrix::label(&mn.cells[i]), "FrostAttention");
            changed_outcomes.push(format!("{comm} {hd}"));
        }
    }
    assert_eq!(
        changed_outcomes,
        ["p2p 264", "p2p 512", "a2a+p2p 264", "a2a+p2p 512"]
    );
    let md = d.to_markdown();
    assert!(md.contains("**FrostAttention ◆** ✱"), "{md}");
    let j = d.to_json();
    assert!(
        j["changed"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["change"] == "outcome")
            .count()
            == 4
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// torch: a key/value fact that follows the query's when absent (`head_dim_k`) is modelled
/// as following it, as the family's reader does; the table the analysis uses agrees with it.
#[test]
fn follower_table_matches_the_torch_reader() {
    let p = Policy::embedded("torch").unwrap();
    for &(family, follower, source) in attn_policy_analysis::matrix::grid::FOLLOWS {
        assert_eq!(family, "torch");
        let slot = p.schema.slot(source).unwrap();
        let value = match p.schema.fields[slot].ty {
            attn_policy::facts::schema::Ty::Enum(_) => json!("fp16"),
            _ => json!(7),
        };
        let f = p.read_facts(&json!({ source: value })).unwrap();
        assert_eq!(
            f.get(follower),
            f.get(source),
            "{follower} follows {source}"
        );
    }
}
