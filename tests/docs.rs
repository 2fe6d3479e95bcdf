//! Documentation that is generated from code stays current.

#[test]
fn facts_md_matches_the_schema() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/facts.md"))
        .expect("docs/facts.md");
    let table = attn_policy::facts::te::TE.markdown_table();
    assert!(
        doc.contains(&table),
        "docs/facts.md is stale: regenerate its table with `attn-policy facts`"
    );
}
