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
    let expected = attn_policy::Code::markdown();
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
    let expected = attn_policy::pack::definitions_page();
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

/// The path-looking tokens of a Markdown text: every inline code span (outside fenced blocks)
/// with no whitespace that contains a `/` or ends in a file extension, with a `::item` suffix
/// stripped (`src/policy.rs::Policy::decide_into` is `src/policy.rs`). Templates (`<pack>`,
/// `{a,b}`, `*`) are not paths.
fn named_paths(markdown: &str) -> Vec<String> {
    const EXTENSIONS: [&str; 9] = [
        ".rs", ".py", ".md", ".yaml", ".json", ".toml", ".h", ".cu", ".html",
    ];
    let mut prose = String::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    prose
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| !t.is_empty() && !t.contains(char::is_whitespace))
        .filter(|t| !t.contains(['<', '>', '{', '}', '*']) && !t.contains("://"))
        .map(|t| t.split("::").next().unwrap_or(t))
        .filter(|t| t.contains('/') || EXTENSIONS.iter().any(|e| t.ends_with(e)))
        .map(str::to_string)
        .collect()
}

/// Every file or folder docs/architecture.md and docs/add-a-backend.md name (in backticks)
/// exists, relative to the repository root: the documents are read from the code and stay so.
#[test]
fn every_path_the_architecture_docs_name_exists() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for (doc, at_least) in [("docs/architecture.md", 40), ("docs/add-a-backend.md", 8)] {
        let text = std::fs::read_to_string(root.join(doc)).expect("the doc");
        let paths = named_paths(&text);
        assert!(
            paths.len() >= at_least,
            "{doc} names only {} paths: {paths:?}",
            paths.len()
        );
        let missing: Vec<&String> = paths.iter().filter(|p| !root.join(p).exists()).collect();
        assert!(
            missing.is_empty(),
            "{doc} names paths that do not exist: {missing:?}"
        );
    }
}

#[test]
fn the_path_extraction_finds_paths_and_skips_the_rest() {
    let text = "Open `src/eval/plan.rs` and `adapters/src/chain.rs::walk_entries`, \
                then `_chain.py`; not `Policy::decide`, `a b/c`, `rules/<pack>/x.yaml`.\n\
                ```\nsrc/not_checked.rs\n```\n`docs/`";
    assert_eq!(
        named_paths(text),
        [
            "src/eval/plan.rs",
            "adapters/src/chain.rs",
            "_chain.py",
            "docs/"
        ]
    );
}
