//! Documentation that is generated from code stays current.

#[test]
fn facts_md_matches_the_schema() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/facts.md");
    let expected = attn_policy::facts::te::TE.markdown_page();
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(path, &expected).expect("write docs/facts.md");
    }
    let doc = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        doc == expected,
        "docs/facts.md is stale: regenerate it with `UPDATE_DOCS=1 cargo test --test docs`"
    );
}

#[test]
fn diagnostics_md_matches_the_codes() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/diagnostics.md");
    let expected = attn_policy::diag::Code::markdown();
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(path, &expected).expect("write docs/diagnostics.md");
    }
    let doc = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        doc == expected,
        "docs/diagnostics.md is stale: regenerate it with `UPDATE_DOCS=1 cargo test --test docs`"
    );
}

#[test]
fn definitions_md_matches_the_packs() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/definitions.md");
    let expected = attn_policy::pack::docs::definitions_page();
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(path, &expected).expect("write docs/definitions.md");
    }
    let doc = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        doc == expected,
        "docs/definitions.md is stale: regenerate it with `UPDATE_DOCS=1 cargo test --test docs`"
    );
}

#[test]
fn torch_pack_doc_lists_the_torch_facts() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/packs/torch.md"))
        .expect("docs/packs/torch.md");
    let table = attn_policy::facts::torch::TORCH.markdown_table();
    assert!(
        doc.contains(&table),
        "docs/packs/torch.md is stale: regenerate its facts table with `attn-policy facts --pack torch`"
    );
}

/// docs/support-matrix.md and docs/support-matrix.html are the matrices of
/// `attn_policy::matrix::docs::QUESTIONS` as the rules produce them today.
#[test]
fn support_matrix_docs_match_the_rules() {
    use attn_policy::matrix::{DEFAULT_BUDGET, docs};
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
        let path = format!("{}/docs/{name}", env!("CARGO_MANIFEST_DIR"));
        if std::env::var_os("UPDATE_DOCS").is_some() {
            std::fs::write(&path, &expected).expect("write the doc");
        }
        let doc = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            doc == expected,
            "docs/{name} is stale: regenerate it with `UPDATE_DOCS=1 cargo test --test docs`"
        );
    }
}
