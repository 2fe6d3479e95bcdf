//! The architecture, enforced: the core's top-level modules depend on each other one way (no
//! import cycles), no crate has a circle of files (every workspace crate and both bindings; see
//! "Circles of files" below), the core package depends on no analysis, CLI or executor crate
//! and the analysis crate on the core alone of the workspace's crates (core <- analysis <- cli),
//! every
//! `unsafe` block in the repository says why it is sound, and no function is over 150 lines
//! (see "Function length" below).

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

/// The package names of the `[dependencies]` table of a package's `Cargo.toml` (`package` is
/// relative to the repository root).
fn dependencies(package: &str) -> Vec<String> {
    let manifest = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(package)
            .join("Cargo.toml"),
    )
    .expect("Cargo.toml");
    let deps = manifest
        .split("\n[dependencies]\n")
        .nth(1)
        .expect("a [dependencies] table")
        .split("\n[")
        .next()
        .unwrap_or("");
    deps.lines()
        .filter_map(|l| l.split('=').next())
        .map(str::trim)
        .filter(|n| !n.is_empty() && !n.starts_with('#'))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_core_depends_on_no_front_end_or_executor_crate() {
    let names = dependencies(".");
    assert!(
        names.iter().any(|n| n == "serde"),
        "parsed the table: {names:?}"
    );
    for banned in [
        "clap",
        "anstream",
        "cudarc",
        "attn-policy-analysis",
        "attn-policy-adapters",
        "attn-policy-cli",
        "pyo3",
    ] {
        assert!(
            !names.iter().any(|n| n == banned),
            "the core library depends on `{banned}`"
        );
    }
}

/// One way: core <- analysis <- cli. The analysis crate uses the core and names no executor
/// crate or front end.
#[test]
fn the_analysis_depends_on_the_core_and_no_front_end_or_executor_crate() {
    let names = dependencies("analysis");
    assert!(
        names.iter().any(|n| n == "attn-policy"),
        "parsed the table: {names:?}"
    );
    for banned in [
        "clap",
        "anstream",
        "cudarc",
        "attn-policy-adapters",
        "attn-policy-cli",
        "pyo3",
    ] {
        assert!(
            !names.iter().any(|n| n == banned),
            "the analysis crate depends on `{banned}`"
        );
    }
    assert!(
        dependencies("cli")
            .iter()
            .any(|n| n == "attn-policy-analysis"),
        "the CLI runs the analysis through the analysis crate"
    );
}

/// The modules of the core's `lib.rs` that are public and documented: its curated API is these
/// plus the root re-exports. Every other `pub mod` there must be `#[doc(hidden)]` (a building
/// block for this workspace's crates, no stability promise); the rest are private.
const DOCUMENTED_CORE_MODULES: [&str; 3] = ["conformance", "facts", "pack"];

/// `pub mod` names in `lib_rs` that are neither documented nor `#[doc(hidden)]`.
fn uncurated_modules(lib_rs: &str) -> Vec<String> {
    let lines: Vec<&str> = lib_rs.lines().map(str::trim).collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = line
            .strip_prefix("pub mod ")
            .and_then(|r| r.strip_suffix(';'))
        else {
            continue;
        };
        let hidden = i > 0 && lines[i - 1] == "#[doc(hidden)]";
        if !hidden && !DOCUMENTED_CORE_MODULES.contains(&name) {
            out.push(name.to_string());
        }
    }
    out
}

#[test]
fn the_core_api_is_curated() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    assert!(lib.contains("pub use policy::Policy;"), "read src/lib.rs");
    let loose = uncurated_modules(&lib);
    assert!(
        loose.is_empty(),
        "src/lib.rs makes {loose:?} public: re-export what users need at the root, make the \
         module private (or `#[doc(hidden)]` if a sibling crate needs its internals), or add it \
         to DOCUMENTED_CORE_MODULES"
    );
}

#[test]
fn the_curation_check_finds_a_loose_module() {
    let lib = "pub mod facts;\n#[doc(hidden)]\npub mod eval;\nmod policy;\npub mod decision;\n";
    assert_eq!(uncurated_modules(lib), vec!["decision".to_string()]);
}

/// Every Rust file of the repository (all crates, their tests and benches), build outputs aside.
fn workspace_rust_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in [
        "src", "tests", "benches", "analysis", "adapters", "cli", "bindings", "fuzz",
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

// ---------------------------------------------------------------------------------------------
// Circles of files (issue 31, "a house without circles").
//
// File A -> file B when A names an item defined in B: through a `use` path, a qualified path (in
// an expression, a type, a pattern, a trait bound, a macro's arguments) or a bare name brought in
// by a glob import; re-exports (`pub use`, and any `use` a path goes through) are followed to the
// file that defines the item. A `mod` declaration alone is no edge, and neither is naming a module
// (`use crate::pack::spec;` names a namespace; `spec::load` then names `load`, in its file).
// Every crate of the workspace and both binding crates are checked, each crate on its own: a path
// into another crate (`attn_policy::...` from the adapters) leaves the crate, and crates cannot
// form circles (cargo forbids cyclic dependencies), so circles of files live inside one crate.
//
// Library code only: `#[cfg(test)]` modules and items are skipped (unit tests may reach anywhere),
// as are `tests/`, `benches/`, `examples/` and build scripts, which only use a crate's surface.
// Items are what Rust defines by name in a module: `fn`, `struct`, `enum` (with its variants),
// `union`, `trait`, `type`, `const`, `static`, `macro_rules!` (crate root when `#[macro_export]`,
// else found by name) and foreign `extern` items. An `impl` defines nothing by name: `Type::f`
// names `Type`, so it points at the type's file even when the `impl` sits elsewhere, and method
// calls (`x.f()`) name nothing. Feature-gated twins (`#[cfg(feature = "cuda")] mod enabled;` and
// `#[cfg(not(..))] mod disabled;`) are both read: the graph is the union over all configurations.
//
// The parsing is `syn`'s (`full` + `visit`), the parser Rust's own macros use: hand-written line
// matching cannot see groups (`use a::{b, c::d as e}`), nested and inline modules, `#[cfg(test)]`
// items or paths inside expressions reliably, and a wrong graph hides circles or invents them.

mod file_graph {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};
    use syn::visit::{self, Visit};

    /// File -> the files it names items of -> the paths (as written) that name them.
    pub type Graph = BTreeMap<PathBuf, BTreeMap<PathBuf, BTreeSet<String>>>;

    /// Reads a source file (the disk, or a map of synthetic sources in the self-tests).
    pub type Read<'a> = &'a dyn Fn(&Path) -> Option<String>;

    #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
    enum Target {
        Module(usize),
        Item(usize),
    }

    struct Item {
        file: usize,
        /// An enum's variants (a glob import of the enum brings them in by name).
        variants: Vec<String>,
    }

    struct Module {
        parent: Option<usize>,
        /// Items and child modules defined here, by name.
        defs: BTreeMap<String, BTreeSet<Target>>,
        /// `use` bindings: name -> the paths it stands for (resolved from this module).
        uses: BTreeMap<String, Vec<Vec<String>>>,
        /// Glob imports: the paths of the modules (or enums) whose names come in.
        globs: Vec<Vec<String>>,
    }

    /// A path named in a file's code, to resolve in the module it is written in.
    struct Ref {
        file: usize,
        module: usize,
        path: Vec<String>,
        /// A macro invocation's name (found by name in the crate when not in scope:
        /// `macro_rules!` scope is textual).
        is_macro: bool,
    }

    /// One `use` leaf: the path, the name it binds (none for `_` and globs), glob or not.
    struct UseLeaf {
        path: Vec<String>,
        bind: Option<String>,
        glob: bool,
    }

    /// One crate's module tree, items and named paths.
    #[derive(Default)]
    pub struct Crate {
        files: Vec<PathBuf>,
        modules: Vec<Module>,
        items: Vec<Item>,
        macros: BTreeMap<String, BTreeSet<usize>>,
        refs: Vec<Ref>,
        /// Files declared only under `#[cfg(test)]` (not read).
        pub test_only: Vec<PathBuf>,
    }

    fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
        attrs.iter().any(|a| {
            a.path().is_ident("cfg") && {
                let tokens = a
                    .meta
                    .require_list()
                    .map(|l| l.tokens.to_string())
                    .unwrap_or_default();
                // `cfg(test)` and `cfg(all(test, ..))`: compiled for unit tests only.
                tokens == "test" || (tokens.starts_with("all") && tokens.contains("test ,"))
            }
        })
    }

    fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
        attrs.iter().find_map(|a| match &a.meta {
            syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => Some(s.value()),
                _ => None,
            },
            _ => None,
        })
    }

    fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
        use syn::Item::*;
        match item {
            Const(i) => &i.attrs,
            Enum(i) => &i.attrs,
            ExternCrate(i) => &i.attrs,
            Fn(i) => &i.attrs,
            ForeignMod(i) => &i.attrs,
            Impl(i) => &i.attrs,
            Macro(i) => &i.attrs,
            Mod(i) => &i.attrs,
            Static(i) => &i.attrs,
            Struct(i) => &i.attrs,
            Trait(i) => &i.attrs,
            TraitAlias(i) => &i.attrs,
            Type(i) => &i.attrs,
            Union(i) => &i.attrs,
            Use(i) => &i.attrs,
            _ => &[],
        }
    }

    /// The name an item defines (enums, modules, macros and foreign blocks are handled apart).
    fn item_name(item: &syn::Item) -> Option<String> {
        use syn::Item::*;
        let ident = match item {
            Const(i) => &i.ident,
            Fn(i) => &i.sig.ident,
            Static(i) => &i.ident,
            Struct(i) => &i.ident,
            Trait(i) => &i.ident,
            TraitAlias(i) => &i.ident,
            Type(i) => &i.ident,
            Union(i) => &i.ident,
            _ => return None,
        };
        Some(ident.to_string()).filter(|n| n != "_")
    }

    fn flatten_use(mut prefix: Vec<String>, tree: &syn::UseTree, out: &mut Vec<UseLeaf>) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                flatten_use(prefix, &p.tree, out);
            }
            syn::UseTree::Name(n) => {
                let name = n.ident.to_string();
                if name != "self" {
                    prefix.push(name);
                }
                let bind = prefix.last().cloned();
                out.push(UseLeaf {
                    path: prefix,
                    bind,
                    glob: false,
                });
            }
            syn::UseTree::Rename(r) => {
                let name = r.ident.to_string();
                if name != "self" {
                    prefix.push(name);
                }
                let rename = r.rename.to_string();
                out.push(UseLeaf {
                    path: prefix,
                    bind: Some(rename).filter(|n| n != "_"),
                    glob: false,
                });
            }
            syn::UseTree::Glob(_) => out.push(UseLeaf {
                path: prefix,
                bind: None,
                glob: true,
            }),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    flatten_use(prefix.clone(), t, out);
                }
            }
        }
    }

    fn use_leaves(u: &syn::ItemUse) -> Vec<UseLeaf> {
        let prefix = if u.leading_colon.is_some() {
            vec!["::".to_string()]
        } else {
            Vec::new()
        };
        let mut out = Vec::new();
        flatten_use(prefix, &u.tree, &mut out);
        out
    }

    /// `a::b::c` sequences in a token stream (macro bodies that are not expressions).
    fn token_paths(tokens: proc_macro2::TokenStream, out: &mut Vec<Vec<String>>) {
        use proc_macro2::TokenTree;
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                TokenTree::Group(g) => token_paths(g.stream(), out),
                TokenTree::Ident(id) => {
                    let mut path = vec![id.to_string()];
                    while let (
                        Some(TokenTree::Punct(a)),
                        Some(TokenTree::Punct(b)),
                        Some(TokenTree::Ident(next)),
                    ) = (tokens.get(i + 1), tokens.get(i + 2), tokens.get(i + 3))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        path.push(next.to_string());
                        i += 3;
                    }
                    if path.len() > 1 {
                        out.push(path);
                    }
                }
                TokenTree::Punct(_) | TokenTree::Literal(_) => {}
            }
            i += 1;
        }
    }

    /// Collects the paths a module's code names (and the `use`s inside function bodies).
    struct Paths {
        paths: Vec<(Vec<String>, bool)>,
        uses: Vec<UseLeaf>,
    }

    impl<'ast> Visit<'ast> for Paths {
        fn visit_item(&mut self, item: &'ast syn::Item) {
            if is_cfg_test(item_attrs(item)) {
                return;
            }
            match item {
                // Modules are read by the loader (a module in a function body is rare: skipped).
                syn::Item::Mod(_) => {}
                syn::Item::Use(u) => self.uses.extend(use_leaves(u)),
                _ => visit::visit_item(self, item),
            }
        }
        fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
            let attrs: &[syn::Attribute] = match item {
                syn::ImplItem::Fn(f) => &f.attrs,
                syn::ImplItem::Const(c) => &c.attrs,
                syn::ImplItem::Type(t) => &t.attrs,
                _ => &[],
            };
            if !is_cfg_test(attrs) {
                visit::visit_impl_item(self, item);
            }
        }
        // Attributes name derive macros, lints and tools, not this crate's items.
        fn visit_attribute(&mut self, _: &'ast syn::Attribute) {}
        fn visit_path(&mut self, p: &'ast syn::Path) {
            let mut segs: Vec<String> = Vec::new();
            if p.leading_colon.is_some() {
                segs.push("::".into());
            }
            segs.extend(p.segments.iter().map(|s| s.ident.to_string()));
            self.paths.push((segs, false));
            visit::visit_path(self, p);
        }
        fn visit_macro(&mut self, m: &'ast syn::Macro) {
            let mut segs: Vec<String> = Vec::new();
            if m.path.leading_colon.is_some() {
                segs.push("::".into());
            }
            segs.extend(m.path.segments.iter().map(|s| s.ident.to_string()));
            self.paths.push((segs, true));
            // Arguments: expressions (`format!`, `vec!`, `assert!`, `matches!`) when they parse
            // as such, else every `a::b` in the tokens (`macro_rules!` bodies, `vec![x; n]`).
            let parser = syn::punctuated::Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated;
            match m.parse_body_with(parser) {
                Ok(args) => args.iter().for_each(|e| self.visit_expr(e)),
                Err(_) => {
                    let mut found = Vec::new();
                    token_paths(m.tokens.clone(), &mut found);
                    self.paths.extend(found.into_iter().map(|p| (p, false)));
                }
            }
        }
    }

    impl Crate {
        /// Reads the crate whose root file (`lib.rs`, `main.rs`, `bin/x.rs`) is `root`.
        pub fn load(root: &Path, read: Read) -> Result<Crate, String> {
            let mut c = Crate::default();
            c.module_file(root, None, true, read)?;
            Ok(c)
        }

        fn new_module(&mut self, parent: Option<usize>) -> usize {
            self.modules.push(Module {
                parent,
                defs: BTreeMap::new(),
                uses: BTreeMap::new(),
                globs: Vec::new(),
            });
            self.modules.len() - 1
        }

        fn def_item(&mut self, module: usize, file: usize, name: String, variants: Vec<String>) {
            self.items.push(Item { file, variants });
            let id = self.items.len() - 1;
            self.modules[module]
                .defs
                .entry(name)
                .or_default()
                .insert(Target::Item(id));
        }

        fn add_use(&mut self, module: usize, file: usize, leaf: UseLeaf) {
            let m = &mut self.modules[module];
            if leaf.glob {
                m.globs.push(leaf.path.clone());
            } else if let Some(name) = leaf.bind {
                m.uses.entry(name).or_default().push(leaf.path.clone());
            }
            // The `use` names what its path ends at (a glob: the enum it opens, if any).
            self.refs.push(Ref {
                file,
                module,
                path: leaf.path,
                is_macro: false,
            });
        }

        fn module_file(
            &mut self,
            path: &Path,
            parent: Option<usize>,
            is_root: bool,
            read: Read,
        ) -> Result<usize, String> {
            let text = read(path).ok_or_else(|| format!("cannot read {}", path.display()))?;
            let ast = syn::parse_file(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            self.files.push(path.to_path_buf());
            let file = self.files.len() - 1;
            let module = self.new_module(parent);
            let dir = path.parent().unwrap_or(Path::new("")).to_path_buf();
            let stem = path.file_stem().unwrap_or_default();
            // `mod x;` in `a/mod.rs` or a crate root is `a/x.rs`; in `a/b.rs` it is `a/b/x.rs`.
            let child_dir = if is_root || stem == "mod" {
                dir.clone()
            } else {
                dir.join(stem)
            };
            self.module_items(module, file, &ast.items, &child_dir, &dir, read)?;
            Ok(module)
        }

        fn module_items(
            &mut self,
            module: usize,
            file: usize,
            items: &[syn::Item],
            child_dir: &Path,
            file_dir: &Path,
            read: Read,
        ) -> Result<(), String> {
            let mut code = Paths {
                paths: Vec::new(),
                uses: Vec::new(),
            };
            for item in items {
                let attrs = item_attrs(item);
                if is_cfg_test(attrs) {
                    if let syn::Item::Mod(m) = item
                        && m.content.is_none()
                    {
                        self.test_only
                            .push(child_dir.join(format!("{}.rs", m.ident)));
                    }
                    continue;
                }
                match item {
                    syn::Item::Mod(m) => {
                        let name = m.ident.to_string();
                        let child = match &m.content {
                            Some((_, content)) => {
                                let child = self.new_module(Some(module));
                                let dir = child_dir.join(&name);
                                self.module_items(child, file, content, &dir, file_dir, read)?;
                                child
                            }
                            None => {
                                let path = match path_attr(&m.attrs) {
                                    Some(p) => file_dir.join(p),
                                    None => {
                                        let flat = child_dir.join(format!("{name}.rs"));
                                        if read(&flat).is_some() {
                                            flat
                                        } else {
                                            child_dir.join(&name).join("mod.rs")
                                        }
                                    }
                                };
                                self.module_file(&path, Some(module), false, read)?
                            }
                        };
                        self.modules[module]
                            .defs
                            .entry(name)
                            .or_default()
                            .insert(Target::Module(child));
                    }
                    syn::Item::Use(u) => {
                        for leaf in use_leaves(u) {
                            self.add_use(module, file, leaf);
                        }
                    }
                    syn::Item::Enum(e) => {
                        let variants = e.variants.iter().map(|v| v.ident.to_string()).collect();
                        self.def_item(module, file, e.ident.to_string(), variants);
                        code.visit_item(item);
                    }
                    syn::Item::Macro(m) => {
                        if let Some(ident) = &m.ident {
                            self.items.push(Item {
                                file,
                                variants: Vec::new(),
                            });
                            let id = self.items.len() - 1;
                            self.macros.entry(ident.to_string()).or_default().insert(id);
                            if m.attrs.iter().any(|a| a.path().is_ident("macro_export")) {
                                self.modules[0]
                                    .defs
                                    .entry(ident.to_string())
                                    .or_default()
                                    .insert(Target::Item(id));
                            }
                        }
                        code.visit_item(item);
                    }
                    syn::Item::ForeignMod(f) => {
                        for fi in &f.items {
                            let name = match fi {
                                syn::ForeignItem::Fn(f) => Some(&f.sig.ident),
                                syn::ForeignItem::Static(s) => Some(&s.ident),
                                syn::ForeignItem::Type(t) => Some(&t.ident),
                                _ => None,
                            };
                            if let Some(name) = name {
                                self.def_item(module, file, name.to_string(), Vec::new());
                            }
                        }
                        code.visit_item(item);
                    }
                    other => {
                        if let Some(name) = item_name(other) {
                            self.def_item(module, file, name, Vec::new());
                        }
                        code.visit_item(other);
                    }
                }
            }
            // `use`s in function bodies are taken as the module's (a slight over-approximation).
            for leaf in code.uses {
                self.add_use(module, file, leaf);
            }
            for (path, is_macro) in code.paths {
                self.refs.push(Ref {
                    file,
                    module,
                    path,
                    is_macro,
                });
            }
            Ok(())
        }

        /// What `name` stands for in `module`: its items and child modules, its `use`s followed
        /// to their ends, else what its glob imports bring in.
        fn lookup(
            &self,
            module: usize,
            name: &str,
            active: &mut BTreeSet<(usize, String)>,
        ) -> BTreeSet<Target> {
            if !active.insert((module, name.to_string())) {
                return BTreeSet::new();
            }
            let m = &self.modules[module];
            let mut out = m.defs.get(name).cloned().unwrap_or_default();
            for path in m.uses.get(name).into_iter().flatten() {
                out.extend(self.resolve(module, path, active));
            }
            if out.is_empty() {
                for glob in &m.globs {
                    for t in self.resolve(module, glob, active) {
                        match t {
                            Target::Module(g) => out.extend(self.lookup(g, name, active)),
                            Target::Item(i) if self.items[i].variants.iter().any(|v| v == name) => {
                                out.insert(t);
                            }
                            Target::Item(_) => {}
                        }
                    }
                }
            }
            active.remove(&(module, name.to_string()));
            out
        }

        /// What a path written in `module` ends at (empty: outside the crate, or a local name).
        /// Past an item the path stays at the item (`Enum::Variant`, `Type::method`).
        fn resolve(
            &self,
            module: usize,
            path: &[String],
            active: &mut BTreeSet<(usize, String)>,
        ) -> BTreeSet<Target> {
            let Some(first) = path.first() else {
                return BTreeSet::new();
            };
            let mut here: BTreeSet<Target> = match first.as_str() {
                "crate" => [Target::Module(0)].into(),
                "self" => [Target::Module(module)].into(),
                "super" => self.modules[module]
                    .parent
                    .map(Target::Module)
                    .into_iter()
                    .collect(),
                "::" | "Self" => return BTreeSet::new(),
                name => self.lookup(module, name, active),
            };
            for seg in &path[1..] {
                let mut next = BTreeSet::new();
                for t in here {
                    match t {
                        Target::Item(_) => {
                            next.insert(t);
                        }
                        Target::Module(m) if seg == "super" => {
                            next.extend(self.modules[m].parent.map(Target::Module));
                        }
                        Target::Module(_) if seg == "self" => {
                            next.insert(t);
                        }
                        Target::Module(m) => next.extend(self.lookup(m, seg, active)),
                    }
                }
                here = next;
            }
            here
        }

        /// The crate's files, each with the files it names items of.
        pub fn graph(&self) -> Graph {
            let mut g = Graph::new();
            for f in &self.files {
                g.entry(f.clone()).or_default();
            }
            for r in &self.refs {
                let mut targets = self.resolve(r.module, &r.path, &mut BTreeSet::new());
                if r.is_macro && targets.is_empty() && r.path.len() == 1 {
                    // A `macro_rules!` is in scope after its definition: in its own file first.
                    let found: Vec<usize> = self
                        .macros
                        .get(&r.path[0])
                        .into_iter()
                        .flatten()
                        .copied()
                        .collect();
                    let own: Vec<usize> = found
                        .iter()
                        .copied()
                        .filter(|&i| self.items[i].file == r.file)
                        .collect();
                    let pick = if own.is_empty() { found } else { own };
                    targets.extend(pick.into_iter().map(Target::Item));
                }
                for t in targets {
                    if let Target::Item(i) = t
                        && self.items[i].file != r.file
                    {
                        g.entry(self.files[r.file].clone())
                            .or_default()
                            .entry(self.files[self.items[i].file].clone())
                            .or_default()
                            .insert(r.path.join("::"));
                    }
                }
            }
            g
        }

        /// Every file of the crate's module tree.
        pub fn files(&self) -> &[PathBuf] {
            &self.files
        }
    }

    /// Strongly connected components of more than one file (Tarjan's algorithm): the circles.
    pub fn circles(g: &Graph) -> Vec<BTreeSet<PathBuf>> {
        struct Tarjan<'g> {
            g: &'g Graph,
            index: BTreeMap<&'g PathBuf, usize>,
            low: BTreeMap<&'g PathBuf, usize>,
            stack: Vec<&'g PathBuf>,
            on_stack: BTreeSet<&'g PathBuf>,
            out: Vec<BTreeSet<PathBuf>>,
        }
        impl<'g> Tarjan<'g> {
            fn visit(&mut self, v: &'g PathBuf) {
                let i = self.index.len();
                self.index.insert(v, i);
                self.low.insert(v, i);
                self.stack.push(v);
                self.on_stack.insert(v);
                for w in self.g.get(v).into_iter().flat_map(|e| e.keys()) {
                    if !self.index.contains_key(w) {
                        self.visit(w);
                        let lw = self.low[w];
                        let lv = self.low.get_mut(v).expect("visited");
                        *lv = (*lv).min(lw);
                    } else if self.on_stack.contains(w) {
                        let iw = self.index[w];
                        let lv = self.low.get_mut(v).expect("visited");
                        *lv = (*lv).min(iw);
                    }
                }
                if self.low[v] == self.index[v] {
                    let mut scc = BTreeSet::new();
                    while let Some(w) = self.stack.pop() {
                        self.on_stack.remove(w);
                        scc.insert(w.clone());
                        if w == v {
                            break;
                        }
                    }
                    if scc.len() > 1 {
                        self.out.push(scc);
                    }
                }
            }
        }
        let mut t = Tarjan {
            g,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            on_stack: BTreeSet::new(),
            out: Vec::new(),
        };
        for v in g.keys() {
            if !t.index.contains_key(v) {
                t.visit(v);
            }
        }
        t.out.sort();
        t.out
    }
}

/// The crates checked for circles: the workspace's packages and the two binding crates.
const CRATES: [&str; 6] = [
    ".",
    "analysis",
    "adapters",
    "cli",
    "bindings/python",
    "bindings/c",
];

/// The root files of a package's crates: its library, its binary, its `src/bin` programs.
fn crate_roots(package: &Path) -> Vec<PathBuf> {
    let src = package.join("src");
    let mut roots: Vec<PathBuf> = ["lib.rs", "main.rs"]
        .iter()
        .map(|f| src.join(f))
        .filter(|f| f.is_file())
        .collect();
    if let Ok(bins) = std::fs::read_dir(src.join("bin")) {
        for e in bins {
            let p = e.expect("entry").path();
            if p.extension().is_some_and(|x| x == "rs") {
                roots.push(p);
            } else if p.join("main.rs").is_file() {
                roots.push(p.join("main.rs"));
            }
        }
    }
    roots.sort();
    roots
}

/// Circles of files that remain, each the exact set of its files, until their issue is done.
/// The check fails on a circle not listed here and on an entry that is no longer a circle, so
/// this list only shrinks: when a change breaks a circle up, delete its entry. Empty today: the
/// last two (`mdd` and `space`, now in the analysis crate) went the way `diag` did, what the
/// children share moved out of `mod.rs` into files that name none of them (`mdd/store.rs`,
/// `mdd/manager.rs`, ...; `space/model.rs`). Keep it empty: break a new circle, do not list it.
const REMAINING_CIRCLES: &[&[&str]] = &[];

fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root)
        .unwrap_or(p)
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

/// Every circle of files in every crate: (its files, the edges inside it with what names them).
fn repo_circles() -> Vec<(BTreeSet<String>, Vec<String>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    let mut out = Vec::new();
    for package in CRATES {
        let package = root.join(package);
        let roots = crate_roots(&package);
        assert!(!roots.is_empty(), "no crate root in {}", package.display());
        // Each `.rs` file under `src/` belongs to a crate's module tree (else the graph missed code).
        let mut reached: BTreeSet<PathBuf> = BTreeSet::new();
        for crate_root in roots {
            let c = file_graph::Crate::load(&crate_root, &read).unwrap_or_else(|e| panic!("{e}"));
            reached.extend(c.files().iter().cloned());
            reached.extend(c.test_only.iter().cloned());
            let g = c.graph();
            for circle in file_graph::circles(&g) {
                let mut edges = Vec::new();
                for from in &circle {
                    for (to, names) in &g[from] {
                        if circle.contains(to) {
                            let names: Vec<&str> = names.iter().map(String::as_str).collect();
                            edges.push(format!(
                                "{} -> {}: {}",
                                rel(root, from),
                                rel(root, to),
                                names.join(", ")
                            ));
                        }
                    }
                }
                out.push((circle.iter().map(|f| rel(root, f)).collect(), edges));
            }
        }
        let mut files = Vec::new();
        rust_files(&package.join("src"), &mut files);
        let unread: Vec<String> = files
            .iter()
            .filter(|f| !reached.contains(*f))
            .map(|f| rel(root, f))
            .collect();
        assert!(unread.is_empty(), "files in no module tree: {unread:?}");
    }
    out
}

/// Ok, or what differs between the circles found and the ones allowed to remain.
fn compare_circles(
    found: &[(BTreeSet<String>, Vec<String>)],
    remaining: &[&[&str]],
) -> Result<(), String> {
    let allowed: Vec<BTreeSet<String>> = remaining
        .iter()
        .map(|c| c.iter().map(|f| f.to_string()).collect())
        .collect();
    let mut problems = Vec::new();
    for (circle, edges) in found {
        if !allowed.contains(circle) {
            problems.push(format!(
                "circle of {} files: {}\n    {}",
                circle.len(),
                circle.iter().cloned().collect::<Vec<_>>().join(" "),
                edges.join("\n    ")
            ));
        }
    }
    for entry in &allowed {
        if !found.iter().any(|(c, _)| c == entry) {
            problems.push(format!(
                "REMAINING_CIRCLES lists a circle that no longer exists (delete the entry, or \
                 update it to the circle's files now): {entry:?}"
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

#[test]
fn no_circle_of_files_in_any_crate() {
    let found = repo_circles();
    if let Err(e) = compare_circles(&found, REMAINING_CIRCLES) {
        panic!(
            "circles of files (file A -> file B: A names an item defined in B; break each circle \
             by moving what both need into a file that names neither):\n{e}"
        );
    }
}

/// A crate in memory: root `lib.rs` and its files.
fn synthetic(files: &[(&str, &str)]) -> file_graph::Graph {
    let map: BTreeMap<PathBuf, String> = files
        .iter()
        .map(|(p, t)| (PathBuf::from(p), t.to_string()))
        .collect();
    let read = |p: &Path| map.get(p).cloned();
    file_graph::Crate::load(Path::new("lib.rs"), &read)
        .expect("synthetic crate")
        .graph()
}

fn targets(g: &file_graph::Graph, file: &str) -> Vec<String> {
    g[Path::new(file)]
        .keys()
        .map(|p| p.to_string_lossy().into_owned())
        .collect()
}

#[test]
fn the_file_graph_finds_a_planted_circle_and_follows_re_exports() {
    let g = synthetic(&[
        (
            "lib.rs",
            "mod a; mod b; mod c; mod d; mod e;\npub use b::Thing;\npub use c::*;",
        ),
        // Names `Thing` through the root's re-export: the edge goes to b.rs, where it is defined.
        (
            "a.rs",
            "use crate::Thing;\npub fn fa() -> Thing { Thing }\n\
             #[cfg(test)]\nmod tests { use crate::e::Late; }",
        ),
        // The other half of the circle: a qualified path in an expression.
        (
            "b.rs",
            "pub struct Thing;\npub(crate) fn g() { crate::a::fa(); }",
        ),
        (
            "c.rs",
            "pub struct Other;\npub mod inner { pub fn deep() {} }",
        ),
        // A group with a rename and a glob, paths inside a macro's arguments, a nested module
        // file (`d/sub.rs`) that reaches back with `super`.
        (
            "d.rs",
            "use super::{c as cc, *};\nmod sub;\n\
             fn f() -> Thing { println!(\"{:?}\", cc::inner::deep()); Thing }",
        ),
        ("d/sub.rs", "fn h() { super::super::e::late(); }"),
        ("e.rs", "pub struct Late; pub fn late() {}"),
    ]);
    let circles = file_graph::circles(&g);
    let expect: BTreeSet<PathBuf> = ["a.rs", "b.rs"].iter().map(PathBuf::from).collect();
    assert_eq!(circles, vec![expect]);
    assert_eq!(
        targets(&g, "a.rs"),
        ["b.rs"],
        "re-export followed, test module skipped"
    );
    assert_eq!(
        targets(&g, "lib.rs"),
        ["b.rs"],
        "`mod` alone is no edge; a glob of a module neither"
    );
    assert_eq!(targets(&g, "d.rs"), ["b.rs", "c.rs"]);
    assert_eq!(targets(&g, "d/sub.rs"), ["e.rs"]);
    assert!(targets(&g, "e.rs").is_empty());
}

#[test]
fn the_circle_comparison_fails_both_ways() {
    let circle = |fs: &[&str]| -> (BTreeSet<String>, Vec<String>) {
        (fs.iter().map(|f| f.to_string()).collect(), vec![])
    };
    let found = vec![circle(&["a.rs", "b.rs"]), circle(&["c.rs", "d.rs", "e.rs"])];
    assert!(compare_circles(&found, &[&["a.rs", "b.rs"], &["e.rs", "d.rs", "c.rs"]]).is_ok());
    // A circle not on the list.
    let new = compare_circles(&found, &[&["a.rs", "b.rs"]]).unwrap_err();
    assert!(new.contains("c.rs d.rs e.rs"), "{new}");
    // A list entry that is no longer a circle (or not exactly).
    let gone = compare_circles(&found[..1], &[&["a.rs", "b.rs"], &["c.rs", "d.rs", "e.rs"]]);
    assert!(gone.unwrap_err().contains("no longer exists"));
    let changed = compare_circles(&found, &[&["a.rs", "b.rs"], &["c.rs", "d.rs"]]);
    assert!(changed.unwrap_err().contains("no longer exists"));
}

#[test]
fn the_file_graph_sees_the_real_imports() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    let edges = |krate: &str| -> BTreeSet<(String, String)> {
        let c = file_graph::Crate::load(&root.join(krate), &read).expect("crate");
        let mut out = BTreeSet::new();
        for (from, to) in c.graph() {
            out.extend(to.keys().map(|t| (rel(root, &from), rel(root, t))));
        }
        out
    };
    let adapters = edges("adapters/src/lib.rs");
    assert!(adapters.len() > 50, "{adapters:?}");
    for (from, to) in [
        // `use crate::device::{Availability, cuda_devices}`.
        ("adapters/src/chunked/enabled.rs", "adapters/src/device.rs"),
        // `crate::chunked::ChunkedConfig`: the re-export in chunked/mod.rs, followed.
        (
            "adapters/src/fused/enabled.rs",
            "adapters/src/chunked/config.rs",
        ),
        // `super::NAME`, `super::manifest()` in the stand-in: through frost/mod.rs.
        (
            "adapters/src/frost/bridge.rs",
            "adapters/src/frost/rules.rs",
        ),
    ] {
        assert!(
            adapters.contains(&(from.into(), to.into())),
            "{from} -> {to}"
        );
    }
    // Naming a re-export is no edge to the file that re-exports it.
    assert!(!adapters.contains(&(
        "adapters/src/fused/enabled.rs".into(),
        "adapters/src/chunked/mod.rs".into()
    )));
    let analysis = edges("analysis/src/lib.rs");
    for (from, to) in [
        ("analysis/src/matrix/mod.rs", "analysis/src/matrix/grid.rs"),
        (
            "analysis/src/matrix/grid.rs",
            "analysis/src/matrix/specialize.rs",
        ),
    ] {
        assert!(
            analysis.contains(&(from.into(), to.into())),
            "{from} -> {to} missing"
        );
    }
    let cli = edges("cli/src/main.rs");
    assert!(cli.contains(&(
        "cli/src/commands/info.rs".into(),
        "cli/src/commands/exit.rs".into()
    )));
}

// ---------------------------------------------------------------------------------------------
// Function length (issue 31, part 6: "no function over 150 lines outside generated code and
// tables").
//
// Every function of every Rust file of the repository (the workspace's crates, both bindings, the
// fuzz targets; library code, binaries, tests and benches alike) is measured from the line of its
// `fn` keyword to the line of its closing brace: free functions, functions nested in other
// functions or modules, `impl` methods and trait methods with a default body. Attributes and doc
// comments above the `fn` do not count. Functions inside macro invocations (`quote!`, ...) are
// tokens, not items, and are not seen. The parsing is `syn`'s, with `proc-macro2`'s
// `span-locations` for line numbers.

/// The longest a function may be, in lines.
const MAX_FN_LINES: usize = 150;

/// Functions allowed to stay over [`MAX_FN_LINES`]: (file, name as [`long_functions`] gives it,
/// why). Only tables are left: every function with logic has been split (the last three,
/// `RulePlan::build`, `lint` and `why_not`, after the `src/eval/` and analysis rework).
/// The check fails on a long function not listed here and on an entry that is no longer
/// over the limit (or no longer exists), so this list only shrinks: when a function is split,
/// delete its entry.
const LONG_FUNCTIONS: &[(&str, &str, &str)] = &[
    // Tables: long because they list cases, one entry per checked behaviour.
    (
        "tests/frost_checklist.rs",
        "checklist",
        "a table: one `case(..)` per line of FROST's pull-request checklist, no logic",
    ),
];

/// The functions of one file over `max` lines: (name, first line, length in lines). Names are
/// qualified by the `impl`'s type or the trait (`Type::method`), and by the enclosing function
/// for a nested one (`outer::inner`).
fn long_functions(text: &str, max: usize) -> Result<Vec<(String, usize, usize)>, syn::Error> {
    use syn::spanned::Spanned;
    use syn::visit::Visit;

    struct Lengths {
        max: usize,
        scope: Vec<String>,
        out: Vec<(String, usize, usize)>,
    }
    impl Lengths {
        fn measure(&mut self, name: &syn::Ident, fn_token: &syn::token::Fn, block: &syn::Block) {
            let first = fn_token.span.start().line;
            let last = block.brace_token.span.close().end().line;
            let lines = last + 1 - first;
            if lines > self.max {
                let mut path = self.scope.clone();
                path.push(name.to_string());
                self.out.push((path.join("::"), first, lines));
            }
        }
    }
    // An `impl` is named by its type's last path segment; a type that is not a path (`&[T]`, a
    // tuple) by the line it starts on.
    fn type_name(ty: &syn::Type) -> String {
        match ty {
            syn::Type::Path(p) => p
                .path
                .segments
                .last()
                .map_or_else(String::new, |s| s.ident.to_string()),
            other => format!("<type at line {}>", other.span().start().line),
        }
    }
    impl<'ast> Visit<'ast> for Lengths {
        fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
            self.measure(&f.sig.ident, &f.sig.fn_token, &f.block);
            self.scope.push(f.sig.ident.to_string());
            syn::visit::visit_item_fn(self, f);
            self.scope.pop();
        }
        fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
            self.scope.push(type_name(&i.self_ty));
            syn::visit::visit_item_impl(self, i);
            self.scope.pop();
        }
        fn visit_item_trait(&mut self, t: &'ast syn::ItemTrait) {
            self.scope.push(t.ident.to_string());
            syn::visit::visit_item_trait(self, t);
            self.scope.pop();
        }
        fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
            self.measure(&f.sig.ident, &f.sig.fn_token, &f.block);
            self.scope.push(f.sig.ident.to_string());
            syn::visit::visit_impl_item_fn(self, f);
            self.scope.pop();
        }
        fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
            if let Some(block) = &f.default {
                self.measure(&f.sig.ident, &f.sig.fn_token, block);
            }
            self.scope.push(f.sig.ident.to_string());
            syn::visit::visit_trait_item_fn(self, f);
            self.scope.pop();
        }
    }
    let file = syn::parse_file(text)?;
    let mut v = Lengths {
        max,
        scope: Vec::new(),
        out: Vec::new(),
    };
    v.visit_file(&file);
    Ok(v.out)
}

/// Every Rust file the length check reads: [`workspace_rust_files`] plus the root build script.
fn length_checked_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = workspace_rust_files();
    for extra in ["build.rs", "examples"] {
        let p = root.join(extra);
        if p.is_dir() {
            rust_files(&p, &mut files);
        } else if p.is_file() {
            files.push(p);
        }
    }
    files.sort();
    files.dedup();
    files
}

/// Ok, or what differs between the long functions found (file, name, first line, length) and the
/// allowed ones.
fn compare_long_functions(
    found: &[(String, String, usize, usize)],
    allowed: &[(&str, &str, &str)],
) -> Result<(), String> {
    let mut problems = Vec::new();
    for (file, name, line, lines) in found {
        if !allowed.iter().any(|(f, n, _)| f == file && n == name) {
            problems.push(format!(
                "{file}:{line}: `{name}` is {lines} lines (at most {MAX_FN_LINES}): split it"
            ));
        }
    }
    for (file, name, _) in allowed {
        if !found.iter().any(|(f, n, _, _)| f == file && n == name) {
            problems.push(format!(
                "LONG_FUNCTIONS lists {file} `{name}`, which is no longer over {MAX_FN_LINES} \
                 lines (or no longer exists): delete the entry"
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

#[test]
fn no_function_is_over_150_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = length_checked_files();
    assert!(files.len() > 50, "found the sources: {}", files.len());
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read");
        let long =
            long_functions(&text, MAX_FN_LINES).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        found.extend(
            long.into_iter()
                .map(|(name, line, lines)| (rel(root, f), name, line, lines)),
        );
    }
    if let Err(e) = compare_long_functions(&found, LONG_FUNCTIONS) {
        panic!("functions over {MAX_FN_LINES} lines (issue 31, part 6):\n{e}");
    }
}

#[test]
fn the_length_check_counts_from_fn_to_closing_brace() {
    // A function of exactly `n` lines, `fn` line and closing brace included, with an attribute
    // and a doc comment above it that do not count.
    let function = |name: &str, n: usize| {
        let body = "    let _ = 1;\n".repeat(n - 2);
        format!("/// Doc.\n#[inline]\nfn {name}() {{\n{body}}}\n")
    };
    let text = format!(
        "{}\n{}\nstruct S;\nimpl S {{\n{}}}\ntrait T {{\n{}}}\nfn outer() {{\n{}}}\n",
        function("fits", 150),
        function("too_long", 151),
        function("method", 151),
        function("provided", 151),
        function("nested", 151),
    );
    let long = long_functions(&text, 150).expect("parses");
    let names: Vec<(&str, usize)> = long.iter().map(|(n, _, l)| (n.as_str(), *l)).collect();
    assert_eq!(
        names,
        [
            ("too_long", 151),
            ("S::method", 151),
            ("T::provided", 151),
            ("outer", 155),
            ("outer::nested", 151),
        ]
    );
    // The line is the `fn` line: after the 150-line function (3 lines of which come after its
    // doc and attribute), a blank line, then the doc and attribute of the next.
    assert_eq!(long[0].1, 2 + 150 + 1 + 2 + 1);
    assert!(
        long_functions(&function("fits", 150), 150)
            .unwrap()
            .is_empty()
    );
    assert_eq!(long_functions(&function("f", 151), 150).unwrap().len(), 1);
}

#[test]
fn the_length_comparison_fails_both_ways() {
    let found = vec![("a.rs".to_string(), "f".to_string(), 1, 151)];
    assert!(compare_long_functions(&found, &[("a.rs", "f", "a table")]).is_ok());
    let new = compare_long_functions(&found, &[]).unwrap_err();
    assert!(new.contains("a.rs:1: `f` is 151 lines"), "{new}");
    let gone = compare_long_functions(&[], &[("a.rs", "f", "a table")]).unwrap_err();
    assert!(gone.contains("no longer over"), "{gone}");
}
