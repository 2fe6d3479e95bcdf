//! Internal names stay inside (issue 30, part 4): every name an output prints is one a user
//! can look up. Over the presets and a sample of the corpora, for every embedded pack (te,
//! native, torch), each output is walked: the explanation's text, its `explain/v1` JSON and
//! TE tuple, why-not (its result, as text and JSON), and the support matrices of the docs
//! (Markdown, the HTML page's text and data, JSON, every cell's explanation).
//!
//! A name is allowed when it is a backend, a variant, a rule id, a layer, a preference entry,
//! an executor, a fact (the first column of `attn-policy facts --pack P`), a public definition
//! (listed by `attn-policy facts --pack P` after the facts, and docs/definitions.md), a
//! function or keyword of the rule language, an enum value of a fact, a matrix axis, or one of
//! the upstream references listed in [`UPSTREAM`]. Conditions (`when`, `applicable`) are
//! parsed and every name in them must be a fact, a public definition or a function; in prose,
//! every backquoted span and every identifier-like word (with `_` or `.`) is checked.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;

use attn_policy::facts::presets::PRESETS;
use attn_policy::facts::schema::Ty;
use attn_policy::lang::parse::MAX_EXPR_LEN;
use attn_policy::lang::{Expr, ExprKind, parse_expr};
use attn_policy::pack::definitions_table;
use attn_policy::{Explanation, Policy};
use attn_policy_analysis::matrix::{DEFAULT_BUDGET, docs};
use attn_policy_analysis::why_not::why_not;
use serde_json::Value as Json;

/// Names of upstream code, options and tools that reasons cite (TransformerEngine's and
/// PyTorch's arguments and functions, the libraries). Reviewed by hand: a pack definition
/// must never be added here.
const UPSTREAM: &[&str] = &[
    // TransformerEngine: arguments and recipe fields a reason tells the user to set, its
    // return values, the cuDNN graph's dimensions and the call that checks a graph
    "score_mod",
    "score_mod_bprop",
    "fp8_dpa",
    "fp8_mha",
    "max_logit",
    "s_q",
    "s_kv",
    "d_qk",
    "d_v",
    "check_support",
    "head_dim",
    "num_heads",
    // PyTorch: the tensor class, its functions and options
    "torch.Tensor",
    "torch.nn.functional.scaled_dot_product_attention",
    "torch.nn.attention.bias",
    "torch.use_deterministic_algorithms",
    "warn_only",
    "repeat_interleave",
    // CUDA's architecture name of the fused kernel
    "sm_90a",
    // this project: the Python module, the cargo features (README, docs/executors.md), the
    // variable that regenerates the docs
    "attn_policy.torch",
    "UPDATE_DOCS",
    "cuda",
    "cudnn",
    "frost",
];

/// Abbreviations of the prose (`e.g.` reads as the word `e.g`).
const PROSE: &[&str] = &["e.g", "i.e"];

/// Everything a reader can look up, for one pack.
struct Known {
    pack: String,
    /// Facts and public definitions: what a condition may name.
    condition: BTreeSet<String>,
    /// Every other name an output may print.
    names: BTreeSet<String>,
    /// Enum values of the facts (values, not names; printed unquoted in some places).
    values: BTreeSet<String>,
    /// A matrix's axes (facts or the aliases docs/matrix.md documents: `head_dim`, `sm`).
    axes: BTreeSet<String>,
}

impl Known {
    fn of(policy: &Policy) -> Known {
        let schema = policy.schema;
        // What `attn-policy facts --pack P` prints: the facts' table, then the definitions'.
        let first_column = |table: &str| -> Vec<String> {
            table
                .lines()
                .skip(2)
                .filter_map(|l| {
                    let cell = l.strip_prefix("| `")?;
                    Some(cell[..cell.find('`')?].to_string())
                })
                .collect()
        };
        let facts = first_column(&schema.markdown_table());
        assert!(!facts.is_empty(), "{}: no facts listed", policy.name);
        let public = first_column(&definitions_table(policy));
        for d in &policy.definitions {
            assert_eq!(
                public.contains(&d.name),
                d.public.is_some(),
                "{}: `{}`",
                policy.name,
                d.name
            );
        }
        let mut condition: BTreeSet<String> = facts.iter().cloned().collect();
        condition.extend(public);
        let mut names = condition.clone();
        names.extend(
            attn_policy::eval::program::Func::NAMES
                .iter()
                .chain(attn_policy::eval::program::Func::PREDICATES)
                .map(|s| s.to_string()),
        );
        for b in &policy.backends {
            names.insert(b.name.clone());
            names.extend(b.variants.iter().map(|v| v.name.clone()));
        }
        names.insert(policy.name.clone());
        names.extend(policy.rules.iter().map(|r| r.id.clone()));
        names.extend(policy.layers.iter().cloned());
        names.extend(policy.preference.iter().map(|p| p.id.clone()));
        for c in &policy.executor_chains {
            names.extend(c.entries.iter().map(|e| e.executor.clone()));
        }
        names.extend(UPSTREAM.iter().map(|s| s.to_string()));
        let mut values = BTreeSet::new();
        for f in schema.fields {
            if let Ty::Enum(d) = f.ty {
                values.extend(d.values().iter().map(|s| s.to_string()));
            }
        }
        Known {
            pack: policy.name.clone(),
            condition,
            names,
            values,
            axes: BTreeSet::new(),
        }
    }

    /// A name printed on its own: any known name, an environment variable whose fact exists
    /// (`NVTE_FUSED_ATTN` for `env.NVTE_FUSED_ATTN`), or an enum value.
    fn name_ok(&self, w: &str) -> bool {
        self.names.contains(w)
            || self.condition.contains(&format!("env.{w}"))
            || self.values.contains(w)
            || PROSE.contains(&w)
    }
}

/// Collects what is wrong in the outputs of one pack.
struct Check<'a> {
    known: &'a Known,
    offenders: BTreeSet<String>,
}

impl Check<'_> {
    /// One offender per name and place (the first output it was seen in).
    fn bad(&mut self, name: &str, what: &str, output: &str) {
        let key = format!("[{}] `{name}` ({what})", self.known.pack);
        if !self.offenders.iter().any(|o| o.starts_with(&key)) {
            self.offenders.insert(format!(
                "{key} in: {}",
                output.chars().take(300).collect::<String>()
            ));
        }
    }

    /// A condition: every name in it a fact or a public definition, every call a function.
    fn condition(&mut self, src: &str) {
        let mut paths = Vec::new();
        if src.len() > MAX_EXPR_LEN {
            // A written-out public definition may be longer than the parser takes
            // (`fu_python_declined` in the te pack): its names are read token by token.
            paths = names_lexically(src);
        } else {
            let Ok(e) = parse_expr(src) else {
                self.bad(src, "a condition that does not parse", src);
                return;
            };
            walk(&e, &mut paths);
            // The token reading above must agree with the parser wherever both apply.
            let set = |v: &[(String, bool)]| v.iter().cloned().collect::<BTreeSet<_>>();
            assert_eq!(set(&names_lexically(src)), set(&paths), "{src}");
        }
        for (p, call) in paths {
            let ok = if call {
                attn_policy::eval::program::Func::lookup(&p).is_some()
                    || attn_policy::eval::program::Func::PREDICATES.contains(&p.as_str())
            } else {
                self.known.condition.contains(&p)
            };
            if !ok {
                self.bad(&p, "in a condition", src);
            }
        }
    }

    /// Prose: backquoted spans are conditions or names; outside them, identifier-like words
    /// (with `_` or `.`) are names. Double-quoted text (values) and file locations are skipped.
    fn prose(&mut self, text: &str) {
        // Markdown code blocks (the docs' commands) read as prose.
        let unfenced = text.replace("```sh", " ").replace("```", " ");
        let mut rest = unfenced.as_str();
        let mut outside = String::new();
        while let Some(a) = rest.find('`') {
            outside.push_str(&rest[..a]);
            outside.push(' ');
            let after = &rest[a + 1..];
            let Some(b) = after.find('`') else {
                rest = after;
                break;
            };
            self.span(&after[..b], text);
            rest = &after[b + 1..];
        }
        outside.push_str(rest);
        let mut unquoted = String::new();
        for (i, part) in outside.split('"').enumerate() {
            if i % 2 == 0 {
                unquoted.push_str(part);
                unquoted.push(' ');
            }
        }
        for word in unquoted.split(|c: char| !(c.is_ascii_alphanumeric() || "_./:+-".contains(c))) {
            if file_like(word) {
                continue;
            }
            // A name with `-` or `+` in it (`chunked.head-dim`, `a2a+p2p`), else its parts.
            if self.known.name_ok(word.trim_matches('.')) {
                continue;
            }
            for w in word.split(['+', '-']) {
                let w = w.trim_matches('.');
                if identifier_like(w) && !self.known.name_ok(w) {
                    self.bad(w, "an identifier in prose", text);
                }
            }
        }
    }

    /// A backquoted span: a known name, or a condition.
    fn span(&mut self, s: &str, context: &str) {
        let s = s.trim();
        if s.is_empty() || self.known.name_ok(s) {
            return;
        }
        if file_like(s) {
            return;
        }
        // `attn-policy matrix ...`, `--pack te`, `UPDATE_DOCS=1 cargo test`: command lines.
        if s.starts_with("attn-policy ") || s.starts_with("--") || s.contains("cargo ") {
            return self.prose(&s.replace(['=', '`'], " "));
        }
        if parse_expr(s).is_ok() {
            self.condition(s);
        } else {
            self.bad(s, "a backquoted name", context);
        }
    }

    /// The human text of `explain`: the preference's condition, the values lines, prose.
    fn explain_text(&mut self, text: &str) {
        for line in text.lines() {
            if let Some(i) = line.find("(preference `") {
                let pref = &line[i + "(preference `".len()..];
                let end = pref.find('`').expect("closing backquote");
                self.span(&pref[..end], line);
                if let Some(cond) = pref[end + 1..].strip_prefix(": ") {
                    self.condition(cond.strip_suffix(')').expect("closing parenthesis"));
                }
                self.prose(&line[..i]);
                continue;
            }
            self.prose(line);
        }
    }

    /// A key of a map from facts (or input keys) to values; an object value is a nested
    /// config object (`flash_attn_versions`: `{"v2": ...}`), whose keys are checked as paths.
    fn fact_key(&mut self, k: &str, v: &Json, doc: &str) {
        if !self.known.condition.contains(k) && !self.known.names.contains(k) && !input_key(k) {
            self.bad(k, "a key of a fact map", doc);
        }
        if let Json::Object(m) = v {
            for (member, x) in m {
                self.fact_key(&format!("{k}.{member}"), x, doc);
            }
        }
    }

    /// A JSON document: every field by what it holds; a key not classified here fails, so a
    /// new field is classified before it is trusted.
    fn json(&mut self, key: &str, v: &Json, doc: &str) {
        match v {
            Json::Object(m) => {
                for (k, x) in m {
                    match key {
                        // maps from facts (or, for provenance and a cell's config, input keys)
                        "values" | "input" | "provenance" | "config" | "fixed" => {
                            self.fact_key(k, x, doc)
                        }
                        // a matrix cell: its axes' values by axis (a fact or an alias)
                        _ if self.known.axes.contains(k) => self.fact_key(k, x, doc),
                        _ => self.json(k, x, doc),
                    }
                }
            }
            Json::Array(a) => {
                for x in a {
                    self.json(key, x, doc);
                }
            }
            Json::String(s) => match key {
                "when" | "applicable" => self.condition(s),
                // names
                "name" | "selected" | "outranked_by" | "order" | "id" | "layer"
                | "layers_disabled" | "variants" | "variant" | "pack" | "backend" | "by"
                | "unavailable" | "pref" | "probes" | "pending_probes" | "executor"
                | "preference" | "ahead" | "fact" | "depends_on" | "dep" | "free" | "axis" => {
                    if !self.known.name_ok(s) {
                        self.bad(s, &format!("a name in `{key}`"), doc);
                    }
                }
                // prose
                "reason" | "text" | "title" | "label" | "unchangeable" | "declined_by" | "set" => {
                    self.prose(s)
                }
                // values, words of the format, locations and upstream references
                "value"
                | "from"
                | "to"
                | "values"
                | "changes"
                | "schema"
                | "status"
                | "kind"
                | "location"
                | "refs"
                | "outcome"
                | "flash_attention_backend"
                | "fused_attention_backend" => {}
                other => panic!("classify JSON key `{other}` (string {s:?})"),
            },
            Json::Null | Json::Bool(_) | Json::Number(_) => {}
        }
    }
}

/// A top-level key of a config object that is not itself a fact path (the facts derived from
/// it are): `device_compute_capability` gives `sm`.
fn input_key(k: &str) -> bool {
    matches!(k, "device_compute_capability")
}

/// A file, a path or a location (`rules/te/flash_attention.yaml:12:11`, `tests/docs.rs`,
/// `support-matrix.html`) or an upstream citation (`U:1895`): not a name.
fn file_like(w: &str) -> bool {
    let w = w.trim_matches('.');
    w.contains('/')
        || w.contains(':')
        || [".md", ".html", ".rs", ".yaml", ".json", ".svg", ".gz"]
            .iter()
            .any(|x| w.ends_with(x))
}

/// A word that names something: an identifier (or a dotted path) with `_` or `.` in it.
fn identifier_like(w: &str) -> bool {
    let ident = |p: &str| {
        let mut c = p.chars();
        c.next()
            .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
            && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
    };
    (w.contains('_') || w.contains('.')) && w.split('.').all(ident)
}

/// Every name a condition reads, and every function it calls (`true`).
fn walk(e: &Expr, out: &mut Vec<(String, bool)>) {
    match &e.kind {
        ExprKind::Path(p) => out.push((p.clone(), false)),
        ExprKind::Call(f, args) => {
            out.push((f.clone(), true));
            args.iter().for_each(|a| walk(a, out));
        }
        ExprKind::List(xs) => xs.iter().for_each(|a| walk(a, out)),
        ExprKind::Not(x) | ExprKind::Neg(x) | ExprKind::Group(x) => walk(x, out),
        ExprKind::And(a, b) | ExprKind::Or(a, b) | ExprKind::Arith(_, a, b) => {
            walk(a, out);
            walk(b, out);
        }
        ExprKind::Compare(first, links) => {
            walk(first, out);
            links.iter().for_each(|(_, _, x)| walk(x, out));
        }
        _ => {}
    }
}

/// Every name a condition reads and every function it calls (`true`), from its tokens: what
/// [`walk`] gives, for a condition too long to parse. Words in string literals, keywords and
/// numbers (versions included) are not names.
fn names_lexically(src: &str) -> Vec<(String, bool)> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'"' || c == b'\'' {
            let end = src[i + 1..]
                .find(c as char)
                .expect("a closed string literal");
            i += end + 2;
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.' || b[i] == b'_') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.' || b[i] == b'_') {
                i += 1;
            }
            let word = &src[start..i];
            if !["and", "or", "not", "in", "true", "false", "null"].contains(&word) {
                let call = src[i..].trim_start().starts_with('(');
                out.push((word.to_string(), call));
            }
        } else {
            i += 1;
        }
    }
    out
}

/// The configurations of a pack: the presets (te family) and every `step`-th corpus record.
fn configs(policy: &Policy, step: usize) -> Vec<Json> {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let (corpus, presets) = match policy.schema.family {
        "torch" => ("torch-2.11-sdpa-corpus-a.jsonl.gz", false),
        _ => ("te-2.20.2-corpus-a.jsonl.gz", true),
    };
    let mut out: Vec<Json> = Vec::new();
    if presets {
        out.extend(PRESETS.iter().map(|p| (p.config)()));
    }
    // Every `step`-th line only: parsing all 20,000 records would dominate the test.
    let file = std::fs::File::open(root.join("tests/corpora").join(corpus)).expect("corpus");
    let lines = BufReader::new(flate2::read::GzDecoder::new(file)).lines();
    for line in lines.step_by(step) {
        let record: Json = serde_json::from_str(&line.expect("a line")).expect("a record");
        out.push(record["config"].clone());
    }
    out
}

/// Walks the explanation outputs and why-not of one pack over its configurations.
fn check_decisions(policy: &Policy, step: usize, why_not_step: usize) -> BTreeSet<String> {
    let known = Known::of(policy);
    let mut c = Check {
        known: &known,
        offenders: BTreeSet::new(),
    };
    let mut decided = 0;
    for (i, config) in configs(policy, step).iter().enumerate() {
        // Structurally invalid records are refused before any decision (nothing is printed).
        let Ok(facts) = policy.read_facts(config) else {
            continue;
        };
        let d = policy.decide(&facts);
        let ex = Explanation::new(policy, &facts, &d);
        c.explain_text(&ex.to_text(false));
        let doc = ex.to_json();
        c.json("", &doc, &ex.to_json_string(false));
        c.json("", &ex.to_te(), "--format te");
        decided += 1;
        if i % why_not_step == 0 {
            for b in &policy.backends {
                let r = why_not(policy, &b.name, config).expect("why-not");
                let doc = serde_json::to_value(&r).expect("serialisable");
                c.json("", &doc, &doc.to_string());
            }
        }
    }
    assert!(
        decided > 20,
        "{}: only {decided} configurations",
        policy.name
    );
    c.offenders
}

fn assert_none(offenders: BTreeSet<String>) {
    assert!(
        offenders.is_empty(),
        "{} name(s) a user cannot look up:\n{}",
        offenders.len(),
        offenders.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn te_outputs_name_only_what_a_user_can_look_up() {
    let policy = Policy::embedded("te").expect("te");
    assert_none(check_decisions(&policy, 200, 30));
}

#[test]
fn te_parity_outputs_name_only_what_a_user_can_look_up() {
    let policy = attn_policy::PackSpec::embedded("te")
        .with_parity(true)
        .load()
        .expect("te --parity");
    assert!((0..policy.layers.len() as u8).any(|l| !policy.layer_enabled(l)));
    assert_none(check_decisions(&policy, 400, 1000));
}

#[test]
fn native_outputs_name_only_what_a_user_can_look_up() {
    let policy = Policy::embedded("native").expect("native");
    assert_none(check_decisions(&policy, 200, 10));
}

#[test]
fn torch_outputs_name_only_what_a_user_can_look_up() {
    let policy = Policy::embedded("torch").expect("torch");
    assert_none(check_decisions(&policy, 200, 10));
}

/// The support matrices of the docs (every embedded pack has questions there): Markdown, the
/// HTML page (its text and the data its script shows), JSON, and every cell's explanation.
#[test]
fn support_matrices_name_only_what_a_user_can_look_up() {
    let mut offenders = BTreeSet::new();
    let mut packs = BTreeSet::new();
    for q in docs::QUESTIONS {
        let (pack, _) = q.query().expect("question");
        packs.insert(pack.clone());
        let policy = Policy::embedded(&pack).expect("pack");
        let mut known = Known::of(&policy);
        let m = q.build(DEFAULT_BUDGET).expect("matrix");
        // Axes are facts or the aliases docs/matrix.md documents (`head_dim`, `sm`).
        for axis in [&m.rows.name, &m.cols.name] {
            known.names.insert(axis.clone());
            known.axes.insert(axis.clone());
        }
        let mut c = Check {
            known: &known,
            offenders: BTreeSet::new(),
        };
        let built = [(q, m)];
        let m = &built[0].1;
        c.prose(&docs::markdown(&built));
        c.json("", &m.to_json(), "matrix --format json");
        for cell in &m.cells {
            c.explain_text(&cell.explanation.to_text(false));
            c.json("", &cell.explanation.to_json(), "a cell's explanation");
        }
        let page = docs::html(&built);
        let (a, b) = (
            page.find("id=\"matrix-data\">").expect("data") + "id=\"matrix-data\">".len(),
            page.find("</script>").expect("end of data"),
        );
        let data: Json = serde_json::from_str(&page[a..b]).expect("the page's data is JSON");
        c.json("", &data, "the HTML page's data");
        let body = &page[page.find("<body>").expect("body")..a];
        c.prose(&strip_tags(body));
        offenders.extend(c.offenders);
    }
    assert_eq!(
        packs,
        ["native", "te", "torch"].map(String::from).into(),
        "questions of every embedded pack"
    );
    assert_none(offenders);
}

/// The text of an HTML fragment (tags dropped, entities of the page decoded).
fn strip_tags(html: &str) -> String {
    let mut out = String::new();
    let mut tag = false;
    for ch in html.chars() {
        match ch {
            '<' => tag = true,
            '>' => {
                tag = false;
                out.push(' ');
            }
            _ if !tag => out.push(ch),
            _ => {}
        }
    }
    out.replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// What explanations show is what the pack decides with: every rule's, variant's and
/// preference entry's shown condition, compiled again, evaluates as the condition as written,
/// on every configuration of the sample (for every embedded pack), and names no internal
/// definition.
#[test]
fn shown_conditions_mean_what_the_written_ones_mean() {
    use attn_policy::typecheck::Compiler;
    for pack in ["te", "native", "torch"] {
        let policy = Policy::embedded(pack).expect("pack");
        let sources = policy
            .definitions
            .iter()
            .map(|d| (d.name.clone(), d.source.clone()))
            .collect();
        let mut compiler = Compiler::new(policy.schema, sources);
        let mut pairs = Vec::new();
        for r in &policy.rules {
            pairs.push((r.id.clone(), &r.when_shown, r.when.node));
        }
        for b in &policy.backends {
            for v in &b.variants {
                if let (Some(shown), Some(c)) = (&v.applicable_shown, &v.applicable) {
                    pairs.push((format!("{}/{}", b.name, v.name), shown, c.node));
                }
            }
        }
        for p in &policy.preference {
            if let (Some(shown), Some(c)) = (&p.when_shown, &p.when) {
                pairs.push((p.id.clone(), shown, c.node));
            }
        }
        let known = Known::of(&policy);
        let mut check = Check {
            known: &known,
            offenders: BTreeSet::new(),
        };
        for d in policy.definitions.iter().filter(|d| d.public.is_some()) {
            check.condition(&d.shown);
        }
        let compiled: Vec<_> = pairs
            .iter()
            .map(|(what, shown, node)| {
                check.condition(shown);
                let ast = parse_expr(shown).unwrap_or_else(|e| panic!("{what}: {shown}: {e:?}"));
                let c = compiler
                    .condition(&ast)
                    .unwrap_or_else(|e| panic!("{what}: {shown}: {e:?}"));
                (what, c.node, *node)
            })
            .collect();
        assert_none(check.offenders);
        let mut n = 0;
        for config in configs(&policy, 100) {
            let Ok(facts) = policy.read_facts(&config) else {
                continue;
            };
            for (what, shown, written) in &compiled {
                assert_eq!(
                    compiler.program.eval(*shown, facts.values()),
                    policy.program.eval(*written, facts.values()),
                    "{pack} {what} on {config}"
                );
            }
            n += 1;
        }
        assert!(n > 50, "{pack}: {n} configurations");
    }
}
