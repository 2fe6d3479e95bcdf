//! Generation time of each support matrix of docs/support-matrix.md (target: under 2 s each
//! on the 2-core development machine, release build), and of the strict reading of the first
//! one (`--free all`: every fact not on an axis or fixed analysed). Prints one table; run with
//! `cargo bench -p attn-policy-analysis --bench matrix`.

use std::time::Instant;

use attn_policy_analysis::matrix::{DEFAULT_BUDGET, Free, build, docs};

fn main() {
    println!("| matrix | cells | seconds | diagram nodes | classes examined | marked | complete |");
    println!("|---|---|---|---|---|---|---|");
    for q in docs::QUESTIONS {
        let t = Instant::now();
        let m = q.build(DEFAULT_BUDGET).expect("docs matrix");
        let s = t.elapsed().as_secs_f64();
        println!(
            "| {} | {} | {s:.2} | {} | {} | {} | {} |",
            q.title,
            m.cells.len(),
            m.diagram_nodes,
            m.classes_examined,
            m.cells.iter().filter(|c| !c.depends_on.is_empty()).count(),
            m.complete
        );
    }
    if std::env::var_os("MATRIX_BENCH_FREE_ALL").is_some() {
        let q = &docs::QUESTIONS[0];
        let (pack, mut query) = q.query().expect("query");
        query.free = Free::All;
        let p = attn_policy::Policy::embedded(&pack).expect("pack");
        let t = Instant::now();
        let m = build(&p, &query, DEFAULT_BUDGET).expect("matrix");
        println!(
            "| {} with --free all | {} | {:.2} | {} | {} | {} | {} |",
            q.title,
            m.cells.len(),
            t.elapsed().as_secs_f64(),
            m.diagram_nodes,
            m.classes_examined,
            m.cells.iter().filter(|c| !c.depends_on.is_empty()).count(),
            m.complete
        );
    }
}
