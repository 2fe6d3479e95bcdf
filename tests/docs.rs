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
