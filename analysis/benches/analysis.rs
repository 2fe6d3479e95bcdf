//! Analysis timings on the te pack (docs/analysis.md, "Measured"): `check` (every lint), `gaps`
//! on the CP head_dim (256, 512] slice for sm90 and sm100/103, `gaps` over the full
//! pack (exact; the default number of regions listed), and `diff` of the te pack against a copy
//! without FROST's FR.22 and against the small `mini` fixture, over the whole space. Prints one
//! table; run with `cargo bench -p attn-policy-analysis --bench analysis`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use attn_policy::Policy;
use attn_policy_analysis::lint::lint;
use attn_policy_analysis::regions::{DEFAULT_BUDGET, DEFAULT_MAX_REGIONS, Restriction, diff, gaps};

use common::TE_SLICE;

fn main() {
    let p = Policy::embedded("te").expect("te pack");
    println!("| what | seconds | classes examined | diagram nodes | regions | complete |");
    println!("|---|---|---|---|---|---|");
    let t = Instant::now();
    let d = lint(&p);
    println!(
        "| check (te, {} findings) | {:.2} | - | - | - | {} |",
        d.len(),
        t.elapsed().as_secs_f64(),
        !d.iter().any(|x| x.code == "W-ANALYSIS-INCOMPLETE")
    );
    let budget: u64 = std::env::var("GAPS_BUDGET")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_BUDGET);
    let cases = [
        (
            "gaps sm90 CP slice",
            format!("sm == 90 and {TE_SLICE}"),
            u64::MAX,
        ),
        (
            "gaps sm100/103 CP slice",
            format!("sm in [100, 103] and {TE_SLICE}"),
            budget,
        ),
        ("gaps full pack", "true".to_string(), budget),
    ];
    for (name, w, b) in cases {
        let r = Restriction::parse(&w).expect("where");
        let t = Instant::now();
        let (rep, _) = gaps(&p, Some(&r), b, DEFAULT_MAX_REGIONS);
        println!(
            "| {name} (budget {}) | {:.2} | {} | {} | {} | {} |",
            if b == u64::MAX {
                "none".to_string()
            } else {
                b.to_string()
            },
            t.elapsed().as_secs_f64(),
            rep.classes_examined,
            rep.diagram_nodes,
            rep.regions.len(),
            rep.complete
        );
    }
    // diff: te against te without FR.22 (every region listed), and against `mini` (50 listed).
    let (dir, nowin) = common::te_without_fr22("bench");
    let mini = Policy::from_dir(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/analysis/mini"
    ))
    .expect("mini");
    for (name, other, listed) in [
        ("diff te vs te without FR.22", &nowin, usize::MAX),
        ("diff te vs mini", &mini, 50),
    ] {
        let t = Instant::now();
        let (rep, _) = diff(&p, other, None, DEFAULT_BUDGET, listed);
        println!(
            "| {name} | {:.2} | {} | {} | {}{} | {} |",
            t.elapsed().as_secs_f64(),
            rep.classes_examined,
            rep.diagram_nodes,
            rep.regions.len(),
            if rep.regions_truncated { " (cut)" } else { "" },
            rep.complete
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
