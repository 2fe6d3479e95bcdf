//! Commands that describe the tool itself: `presets`, `facts`, `explain-code`,
//! `completions`, `man`, and the `--version` text.

use clap::Args;
use serde_json::{Value as Json, json};

use attn_policy::Code;
use attn_policy::facts::presets;
use attn_policy::facts::schema::Origin;

#[derive(Args, Debug)]
#[command(after_help = concat!("\
Examples:
  attn-policy presets
  attn-policy presets --show gemma4-global        # every fact and probe answer it decides on
  attn-policy explain --preset gemma4-global --sm 90
  attn-policy explain --pack torch --preset sdpa-h100-gqa-causal-train

Each preset belongs to a pack family (column 2): te presets serve packs te and native,
torch presets the torch pack.

", crate::exit_codes!()))]
pub struct PresetsArgs {
    /// Print one preset resolved: the config it sets, every fact as decided on, probe answers.
    #[arg(long, value_name = "NAME")]
    pub show: Option<String>,
    /// Print as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn presets(a: PresetsArgs) -> i32 {
    let Some(name) = a.show else {
        if a.json {
            let list: Vec<Json> = presets::all()
                .map(|p| {
                    json!({"name": p.name, "family": p.family, "about": p.about, "config": (p.config)()})
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&list).expect("json"));
        } else {
            for p in presets::all() {
                println!("{:<30} {:<6} {}", p.name, p.family, p.about);
            }
        }
        return super::EXIT_OK;
    };
    let Some(p) = presets::find(&name) else {
        let hint = attn_policy::facts::did_you_mean(&name, presets::names())
            .map(|h| format!(" (did you mean `{h}`?)"))
            .unwrap_or_default();
        return super::fail(format!(
            "--show: unknown preset `{name}`{hint}; see `attn-policy presets`"
        ));
    };
    let config = (p.config)();
    let schema = attn_policy::facts::family(p.family).expect("presets name a family");
    let facts = match schema.read(&config) {
        Ok(f) => f,
        Err(e) => return super::fail(e.at(Some(format!("preset `{name}`")))),
    };
    let resolved: serde_json::Map<String, Json> = attn_policy::Explanation::input_of(&facts)
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_json()))
        .collect();
    let set_by_preset = |path: &str| {
        let pointer = format!("/{}", path.replace('.', "/"));
        config.pointer(&pointer).is_some()
            || path
                .split_once('.')
                .is_some_and(|(top, _)| config.get(top).is_some_and(|v| !v.is_object()))
    };
    if a.json {
        let probes: serde_json::Map<String, Json> = schema
            .fields
            .iter()
            .filter(|d| d.origin == Origin::Probe)
            .map(|d| (d.path.to_string(), resolved[d.path].clone()))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "name": p.name, "family": p.family, "about": p.about, "config": config,
                "facts": resolved, "probes": probes,
            }))
            .expect("json")
        );
        return super::EXIT_OK;
    }
    println!("{}: {}", p.name, p.about);
    println!("(* = set by the preset; the rest are defaults or derived)\n");
    let width = schema
        .fields
        .iter()
        .map(|d| d.path.len())
        .max()
        .unwrap_or(0);
    for d in schema.fields {
        if d.origin == Origin::Probe {
            continue;
        }
        let mark = if set_by_preset(d.path) { "*" } else { " " };
        println!(
            "{mark} {:<width$}  {}",
            d.path,
            serde_json::to_string(&resolved[d.path]).expect("json")
        );
    }
    let mut probes = schema
        .fields
        .iter()
        .filter(|d| d.origin == Origin::Probe)
        .peekable();
    if probes.peek().is_some() {
        println!("\nprobe answers (a live adapter's; --probe NAME=... overrides):");
    }
    for d in probes {
        let answer = match &resolved[d.path] {
            Json::Bool(b) => b.to_string(),
            other => other.as_str().unwrap_or("unknown").to_string(),
        };
        println!("  {:<width$}  {answer}", d.path);
    }
    super::EXIT_OK
}

#[derive(Args, Debug)]
#[command(after_help = concat!("\
Examples:
  attn-policy facts                       # the te family, as a Markdown table (docs/facts.md)
  attn-policy facts --pack torch          # PyTorch SDPA's facts
  attn-policy facts --json | jq '.facts[] | select(.path == \"head_dim_qk\")'

", crate::exit_codes!()))]
pub struct FactsArgs {
    /// Print as JSON: every fact (path, type, nullable, domain, default, origin, fixed, doc),
    /// the constraints across facts, the facts that choose the pack (`selection`:
    /// te_version) and the pack's public definitions (name, meaning, stands_for).
    #[arg(long)]
    pub json: bool,
    /// The facts of this pack's family (`--pack torch`: PyTorch SDPA's).
    #[command(flatten)]
    pub pack: super::args::PackArgs,
}

pub fn facts(a: FactsArgs) -> i32 {
    let policy = match a.pack.load(false) {
        Ok(policy) => policy,
        Err(code) => return code,
    };
    let schema = policy.schema;
    if !a.json {
        print!("{}", schema.markdown_table());
        if !schema.selection.is_empty() {
            // `te_version`: read like a fact, but it chooses the pack (`te@auto`).
            println!(
                "\nFacts that choose the pack (no rule reads them; docs/packs/releases.md):\n"
            );
            print!("{}", schema.selection_table());
        }
        println!("\nConstraints across facts:\n");
        print!("{}", schema.constraints_table());
        // The definitions explanations name (every other one is shown written out).
        println!("\nPublic definitions of pack `{}`:\n", policy.name);
        print!("{}", attn_policy::pack::definitions_table(&policy));
        return super::EXIT_OK;
    }
    let definitions: Vec<Json> = policy
        .definitions
        .iter()
        .filter_map(|d| {
            let meaning = d.public.as_ref()?;
            Some(json!({"name": d.name, "meaning": meaning, "stands_for": d.shown}))
        })
        .collect();
    let fields: Vec<Json> = schema
        .fields
        .iter()
        .map(|d| {
            json!({
                "path": d.path,
                "type": d.ty.name(),
                "nullable": d.nullable,
                "domain": d.bound.text(),
                "default": format!("{:?}", d.default),
                "origin": match d.origin {
                    Origin::Input => "input",
                    Origin::Derived => "derived",
                    Origin::Probe => "probe",
                },
                "fixed": d.fixed,
                "doc": d.doc,
            })
        })
        .collect();
    let selection: Vec<Json> = schema
        .selection
        .iter()
        .map(|f| json!({"path": f.path, "type": f.ty.name(), "doc": f.doc}))
        .collect();
    let constraints: Vec<Json> = schema
        .constraints
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "facts": c.facts,
                "enforced": match c.check {
                    attn_policy::facts::Check::Refuse(_) => "refused",
                    attn_policy::facts::Check::DecidedBySelector => "rules",
                },
                "expr": c.expr,
                "doc": c.doc,
            })
        })
        .collect();
    println!(
        "{}",
        serde_json::to_string_pretty(
            &json!({"family": schema.family, "facts": fields, "constraints": constraints,
                    "selection": selection, "pack": policy.name, "definitions": definitions})
        )
        .expect("json")
    );
    super::EXIT_OK
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  attn-policy explain-code E-TYPE\n  attn-policy explain-code w-subsumed\n\n\
                  Exit codes: 0 printed, 2 an unknown code (the known ones are listed)."
)]
pub struct ExplainCodeArgs {
    /// A diagnostic code as `check` and load errors print it (case does not matter).
    pub code: String,
}

pub fn explain_code(a: ExplainCodeArgs) -> i32 {
    use strum::IntoEnumIterator;
    let Some(code) = Code::parse(&a.code) else {
        let names: Vec<&str> = Code::iter().map(Code::name).collect();
        let hint = attn_policy::facts::did_you_mean(&a.code.to_ascii_uppercase(), names.clone())
            .map(|h| format!(" (did you mean `{h}`?)"))
            .unwrap_or_default();
        return super::fail(format!(
            "unknown diagnostic code `{}`{hint}; codes: {}",
            a.code,
            names.join(", ")
        ));
    };
    println!(
        "{} ({}, reported by {}): {}\n",
        code.name(),
        code.severity().word(),
        code.reported_by(),
        code.summary()
    );
    println!("{}", textwrap(code.long(), 96));
    super::EXIT_OK
}

/// Wraps a paragraph at `width` columns (the long texts are single lines).
fn textwrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = 0;
    for word in text.split_whitespace() {
        if line > 0 && line + 1 + word.len() > width {
            out.push('\n');
            line = 0;
        } else if line > 0 {
            out.push(' ');
            line += 1;
        }
        out.push_str(word);
        line += word.len();
    }
    out
}

#[derive(Args, Debug)]
#[command(after_help = "\
Examples:
  attn-policy completions bash > /etc/bash_completion.d/attn-policy
  attn-policy completions zsh > \"${fpath[1]}/_attn-policy\"
  attn-policy completions fish > ~/.config/fish/completions/attn-policy.fish

Exit codes: 0 printed, 2 an unknown shell.")]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `cmd`: the whole command line (`Cli::command()`, passed in by `mod.rs`, which defines it).
pub fn completions(a: CompletionsArgs, mut cmd: clap::Command) -> i32 {
    clap_complete::generate(a.shell, &mut cmd, "attn-policy", &mut std::io::stdout());
    super::EXIT_OK
}

/// `cmd`: the whole command line, as for [`completions`].
pub fn man(cmd: clap::Command) -> i32 {
    let mut out = Vec::new();
    if let Err(e) = clap_mangen::Man::new(cmd).render(&mut out) {
        return super::fail(format!("cannot render the man page: {e}"));
    }
    use std::io::Write;
    let _ = std::io::stdout().write_all(&out);
    super::EXIT_OK
}

/// `--version` (see [`long_version`]).
pub static LONG_VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(long_version);

/// `--version`: the crate version, the embedded packs (with the TransformerEngine version a
/// pack mirrors), and the features this build was compiled with.
fn long_version() -> String {
    use attn_policy::lang::Version;
    let mut out = format!("{}\n", env!("CARGO_PKG_VERSION"));
    out.push_str("embedded packs:\n");
    for name in attn_policy::pack::embedded_pack_names() {
        let text = attn_policy::pack::embedded_file(name, "pack.yaml").unwrap_or_default();
        // The selector a pack mirrors, as its pack.yaml names it ("TransformerEngine 2.20.2",
        // "PyTorch 2.11"); a pack that mirrors none describes this project's executors.
        let upstream = ["TransformerEngine", "PyTorch"]
            .into_iter()
            .find_map(|who| {
                text.split(&format!("{who} "))
                    .skip(1)
                    .filter_map(|rest| rest.split_whitespace().next())
                    .find(|v| v.chars().next().is_some_and(|c| c.is_ascii_digit()))
                    .map(|v| format!("{who} {v}"))
            });
        // The releases embedded with it (`--pack te@2.19.0`, `te@auto`), which it also answers to.
        let mut releases = attn_policy::pack::embedded_release_names(name);
        releases.sort_by_key(|r| r.split_once('@').and_then(|(_, v)| Version::parse(v)));
        let releases = if releases.is_empty() {
            String::new()
        } else {
            format!(
                "; releases {} ({name}@auto: the installed one's)",
                releases.join(", ")
            )
        };
        match upstream {
            Some(u) => out.push_str(&format!("  {name:<8} {u}{releases}\n")),
            None => out.push_str(&format!(
                "  {name:<8} (this project's executors){releases}\n"
            )),
        }
    }
    let features: Vec<&str> = [
        ("cuda", cfg!(feature = "cuda")),
        ("cudnn", cfg!(feature = "cudnn")),
        ("frost", cfg!(feature = "frost")),
    ]
    .into_iter()
    .filter(|(_, on)| *on)
    .map(|(f, _)| f)
    .collect();
    out.push_str(&format!(
        "features: {}",
        if features.is_empty() {
            "none (CPU reference executor only)".to_string()
        } else {
            features.join(", ")
        }
    ));
    out
}
