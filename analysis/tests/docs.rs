//! The generated docs of the analysis crate: the support matrices (docs/support-matrix.md,
//! docs/support-matrix.html) match the rules. The core's generated docs are checked by the
//! root crate's tests/docs.rs.

/// docs/support-matrix.md and docs/support-matrix.html are the matrices of
/// `attn_policy_analysis::matrix::docs::QUESTIONS` as the rules produce them today.
#[test]
fn support_matrix_docs_match_the_rules() {
    use attn_policy_analysis::matrix::{DEFAULT_BUDGET, docs};
    let built: Vec<_> = docs::QUESTIONS
        .iter()
        .map(|q| {
            let m = q
                .build(DEFAULT_BUDGET)
                .unwrap_or_else(|e| panic!("{}: {e}", q.title));
            assert!(m.complete, "{}: INCOMPLETE", q.title);
            (q, m)
        })
        .collect();
    for (name, expected) in [
        ("support-matrix.md", docs::markdown(&built)),
        ("support-matrix.html", docs::html(&built)),
    ] {
        let path = format!("{}/../docs/{name}", env!("CARGO_MANIFEST_DIR"));
        if std::env::var_os("UPDATE_DOCS").is_some() {
            std::fs::write(&path, &expected).expect("write the doc");
        }
        let doc = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            doc == expected,
            "docs/{name} is stale: regenerate it with `UPDATE_DOCS=1 cargo test -p attn-policy-analysis --test docs`"
        );
    }
}
