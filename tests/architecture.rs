//! The core's architecture, enforced: its top-level modules depend on each other one way (no
//! import cycles), the core package depends on no CLI or executor crate, and every `unsafe`
//! block in the repository says why it is sound.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read src") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Top-level module -> the top-level modules its non-test code names through `crate::`.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .map(|f| top_module(&src, f))
        .filter(|m| m != "lib")
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let from = top_module(&src, f);
        if from == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(f).expect("read file");
        // Unit tests may use anything; the dependency structure is about the library itself.
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for line in code.lines() {
            let line = line.split("//").next().unwrap_or("");
            let mut rest = line;
            while let Some(i) = rest.find("crate::") {
                rest = &rest[i + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if modules.contains(&name) && name != from {
                    graph.entry(from.clone()).or_default().insert(name);
                }
            }
        }
        graph.entry(from).or_default();
    }
    graph
}

fn top_module(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next().expect("component");
    first
        .as_os_str()
        .to_string_lossy()
        .trim_end_matches(".rs")
        .to_string()
}

/// A cycle through `start`, if any (depth-first search).
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        g: &BTreeMap<String, BTreeSet<String>>,
        node: &str,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|s| s == node) {
            let mut cycle = stack[i..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_string());
        for next in g.get(node).into_iter().flatten() {
            if let Some(c) = visit(g, next, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(graph, n, &mut Vec::new(), &mut done))
}

#[test]
fn core_modules_have_no_import_cycles() {
    let graph = module_graph();
    assert!(graph.len() > 8, "module graph too small: {graph:?}");
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "import cycle among the core's modules: {}\nwhole graph: {graph:#?}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn the_cycle_check_finds_a_cycle() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    g.entry("c".into()).or_default().insert("a".into());
    assert_eq!(
        find_cycle(&g),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    g.get_mut("c").unwrap().clear();
    assert_eq!(find_cycle(&g), None);
}

#[test]
fn the_core_depends_on_no_front_end_or_executor_crate() {
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
            .expect("Cargo.toml");
    let deps = manifest
        .split("\n[dependencies]\n")
        .nth(1)
        .expect("a [dependencies] table")
        .split("\n[")
        .next()
        .unwrap_or("");
    let names: Vec<&str> = deps
        .lines()
        .filter_map(|l| l.split('=').next())
        .map(str::trim)
        .filter(|n| !n.is_empty() && !n.starts_with('#'))
        .collect();
    assert!(names.contains(&"serde"), "parsed the table: {names:?}");
    for banned in ["clap", "anstream", "cudarc", "attn-policy-adapters", "pyo3"] {
        assert!(
            !names.contains(&banned),
            "the core library depends on `{banned}`"
        );
    }
}

/// Every Rust file of the repository (all crates, their tests and benches), build outputs aside.
fn workspace_rust_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in [
        "src", "tests", "benches", "adapters", "cli", "bindings", "fuzz",
    ] {
        let d = root.join(dir);
        if d.is_dir() {
            rust_files(&d, &mut files);
        }
    }
    files.retain(|f| !f.components().any(|c| c.as_os_str() == "target"));
    files
}

/// `file:line` of each `unsafe` block or impl with no `SAFETY:` comment in the six lines above
/// it (the comment says why the operation is sound; clippy's `undocumented_unsafe_blocks` says
/// the same for the code it compiles, this covers feature-gated GPU code too).
fn undocumented_unsafe(file: &Path, text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        // Code only: comments and string literals (like this file's own examples) do not count.
        let code: String = line
            .split("//")
            .next()
            .unwrap_or("")
            .split('"')
            .step_by(2)
            .collect();
        let opens = code.match_indices("unsafe").any(|(at, _)| {
            let rest = code[at + "unsafe".len()..].trim_start();
            let word_start = at == 0 || !code.as_bytes()[at - 1].is_ascii_alphanumeric();
            word_start && (rest.starts_with('{') || rest.starts_with("impl "))
        });
        if opens
            && !lines[i.saturating_sub(6)..i]
                .iter()
                .any(|l| l.contains("SAFETY:"))
        {
            out.push(format!("{}:{}", file.display(), i + 1));
        }
    }
    out
}

#[test]
fn every_unsafe_block_says_why_it_is_sound() {
    let files = workspace_rust_files();
    assert!(files.len() > 50, "found the sources: {}", files.len());
    let missing: Vec<String> = files
        .iter()
        .flat_map(|f| undocumented_unsafe(f, &std::fs::read_to_string(f).expect("read")))
        .collect();
    assert!(
        missing.is_empty(),
        "`unsafe` without a `// SAFETY:` comment:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_unsafe_check_finds_an_undocumented_block() {
    let f = Path::new("x.rs");
    assert_eq!(
        undocumented_unsafe(f, "fn a() {\n    unsafe { b() }\n}\n"),
        vec!["x.rs:2"]
    );
    assert!(undocumented_unsafe(f, "// SAFETY: b has no contract.\nunsafe { b() }\n").is_empty());
    // `unsafe fn` and `unsafe extern` declare a contract; they are not blocks.
    assert!(undocumented_unsafe(f, "pub unsafe fn a() {}\n").is_empty());
}

#[test]
fn no_crate_allows_missing_safety_docs() {
    for f in workspace_rust_files() {
        let text = std::fs::read_to_string(&f).expect("read");
        assert!(
            !text.contains(concat!("allow(clippy::", "missing_safety_doc")),
            "{} allows undocumented unsafe functions",
            f.display()
        );
    }
}
