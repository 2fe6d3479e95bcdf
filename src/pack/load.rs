//! Loading a pack: read the YAML files, parse and type-check every expression, resolve names,
//! and report every problem at once with its `file:line:col`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_saphyr::Spanned;

use super::source::SourceMap;
use super::yaml::{BackendFile, LayerFile, PackFile, RuleDef};
use crate::diag::{Diagnostic, Diagnostics, Loc};
use crate::facts::did_you_mean;
use crate::facts::schema::{Origin, Schema};
use crate::lang::{Version, parse_expr};
use crate::policy::{Backend, Policy, Preference, Rule, RuleKind, Variant};
use crate::typecheck::{Compiled, Compiler, TypeError};

/// Where a pack comes from.
#[derive(Clone, Debug)]
pub enum PackSource {
    /// A pack compiled into the binary (`te`, `native`).
    Embedded(String),
    /// A folder holding `pack.yaml`.
    Dir(PathBuf),
}

/// A pack that failed to load: every diagnostic, and the sources to render them against.
#[derive(Debug, thiserror::Error)]
#[error("rule pack failed to load ({} problem(s))", diagnostics.0.len())]
pub struct LoadError {
    pub diagnostics: Diagnostics,
    pub sources: SourceMap,
}

impl LoadError {
    pub fn render(&self, color: bool) -> String {
        self.diagnostics.render(&self.sources, color)
    }
}

struct Loader {
    source: PackSource,
    sources: SourceMap,
    diags: Diagnostics,
}

impl Loader {
    fn display_name(&self, file: &str) -> String {
        match &self.source {
            PackSource::Embedded(p) => format!("rules/{p}/{file}"),
            PackSource::Dir(d) => d.join(file).display().to_string(),
        }
    }

    fn read(&mut self, file: &str) -> Option<u16> {
        let text = match &self.source {
            PackSource::Embedded(p) => super::embedded::file(p, file)
                .map(str::to_string)
                .ok_or_else(|| format!("embedded pack `{p}` has no file `{file}`")),
            PackSource::Dir(d) => std::fs::read_to_string(d.join(file))
                .map_err(|e| format!("cannot read {}: {e}", d.join(file).display())),
        };
        match text {
            Ok(t) => Some(self.sources.add(self.display_name(file), t)),
            Err(msg) => {
                self.diags.push(Diagnostic::error("E-IO", msg));
                None
            }
        }
    }

    fn parse<T: DeserializeOwned>(&mut self, file: u16) -> Option<T> {
        let text = self.sources.files[file as usize].text.clone();
        match serde_saphyr::from_str::<T>(&text) {
            Ok(v) => Some(v),
            Err(e) => {
                let loc = e.location().map(|l| {
                    let start = self.sources.files[file as usize].offset_of(l.line(), l.column());
                    Loc {
                        file,
                        start,
                        end: start,
                    }
                });
                let mut msg = e.without_snippet().to_string();
                if let Some(i) = msg.find(" at line ") {
                    msg.truncate(i);
                }
                let mut d = Diagnostic::error("E-YAML", msg);
                if let Some(loc) = loc {
                    d = d.at(loc);
                } else {
                    d.location = Some(self.sources.files[file as usize].name.clone());
                }
                self.diags.push(d);
                None
            }
        }
    }
}

fn syntax(e: crate::lang::SyntaxError) -> TypeError {
    TypeError {
        message: format!("syntax: {}", e.message),
        span: e.span,
        help: None,
    }
}

fn type_diag(
    sources: &SourceMap,
    file: u16,
    node: &Spanned<String>,
    e: TypeError,
    code: &'static str,
) -> Diagnostic {
    let loc = sources.expr_loc(file, node, e.span);
    let one_line = node.value.split_whitespace().collect::<Vec<_>>().join(" ");
    let (code, message) = match e.message.strip_prefix("syntax: ") {
        Some(m) => ("E-SYNTAX", m.to_string()),
        None => (code, e.message),
    };
    Diagnostic::error(code, message)
        .at(loc)
        .label(format!("in `{one_line}`"))
        .help(e.help)
}

/// Loads and type-checks a pack, plus optional overlay files (site policy layers).
pub fn load_pack(source: PackSource, overlays: &[PathBuf]) -> Result<Policy, LoadError> {
    let mut l = Loader {
        source,
        sources: SourceMap::default(),
        diags: Diagnostics::default(),
    };
    let fail = |l: Loader| LoadError {
        diagnostics: l.diags,
        sources: l.sources,
    };
    let Some(pack_file) = l.read("pack.yaml") else {
        return Err(fail(l));
    };
    let Some(pack) = l.parse::<PackFile>(pack_file) else {
        return Err(fail(l));
    };

    // The family: which facts the pack's expressions read.
    let schema: &'static Schema = match &pack.family {
        None => &crate::facts::te::TE,
        Some(name) => match crate::facts::family(&name.value) {
            Some(s) => s,
            None => {
                let known: Vec<&str> = crate::facts::families().iter().map(|s| s.family).collect();
                let loc = l.sources.node_loc(pack_file, name);
                l.diags.push(
                    Diagnostic::error(
                        "E-FAMILY",
                        format!(
                            "unknown pack family `{}`; families: {}",
                            name.value,
                            known.join(", ")
                        ),
                    )
                    .at(loc)
                    .help(
                        did_you_mean(&name.value, known.iter().copied())
                            .map(|s| format!("did you mean `{s}`?")),
                    ),
                );
                return Err(fail(l));
            }
        },
    };

    // Definitions: compiled on first use; each is also checked on its own below.
    let defs_src: BTreeMap<String, String> = pack
        .defs
        .iter()
        .map(|(k, v)| (k.clone(), v.value.clone()))
        .collect();
    for name in defs_src.keys() {
        if schema.slot(name).is_some() {
            let node = &pack.defs[name];
            let loc = l.sources.node_loc(pack_file, node);
            l.diags.push(
                Diagnostic::error(
                    "E-DEF",
                    format!("definition `{name}` shadows a fact of the same name"),
                )
                .at(loc),
            );
        }
    }
    let mut compiler = Compiler::new(schema, defs_src);
    let mut defs = Vec::new();
    for (name, node) in &pack.defs {
        match compiler.compile_def(name) {
            Ok(c) => defs.push((name.clone(), c)),
            Err(e) => {
                let d = type_diag(&l.sources, pack_file, node, e, "E-TYPE");
                l.diags.push(d);
            }
        }
    }

    // Backends, in the listed order.
    let mut backends: Vec<Backend> = Vec::new();
    let mut rules: Vec<Rule> = Vec::new();
    let mut pending_rules: Vec<(u16, Spanned<RuleDef>, u8, Option<u16>)> = Vec::new();
    let mut broken_backend_files = 0;
    for entry in &pack.backends {
        let Some(file) = l.read(&entry.value) else {
            broken_backend_files += 1;
            continue;
        };
        let Some(bf) = l.parse::<BackendFile>(file) else {
            broken_backend_files += 1;
            continue;
        };
        let loc = l.sources.node_loc(file, &bf.backend);
        if backends.iter().any(|b| b.name == bf.backend.value) {
            l.diags.push(
                Diagnostic::error(
                    "E-DUP-BACKEND",
                    format!("backend `{}` is defined twice", bf.backend.value),
                )
                .at(loc),
            );
            continue;
        }
        let mut variants = Vec::new();
        for v in &bf.variants {
            let v = &v.value;
            let mut compile = |src: &Option<Spanned<String>>,
                               boolean: bool,
                               l: &mut Loader|
             -> Option<Compiled> {
                let node = src.as_ref()?;
                let parsed = parse_expr(&node.value).map_err(syntax);
                let r = parsed.and_then(|ast| {
                    if boolean {
                        compiler.condition(&ast)
                    } else {
                        compiler.expr(&ast)
                    }
                });
                match r {
                    Ok(c) => Some(c),
                    Err(e) => {
                        let d = type_diag(&l.sources, file, node, e, "E-TYPE");
                        l.diags.push(d);
                        None
                    }
                }
            };
            let applicable = compile(&v.applicable, true, &mut l);
            let value = compile(&v.value, false, &mut l);
            variants.push(Variant {
                name: v.name.value.clone(),
                description: v.description.clone(),
                applicable,
                applicable_src: v.applicable.as_ref().map(|s| s.value.trim().to_string()),
                value,
            });
        }
        if variants.len() > 63 {
            l.diags.push(
                Diagnostic::error("E-VARIANTS", "a backend may have at most 63 variants").at(loc),
            );
        }
        let index = backends.len() as u16;
        backends.push(Backend {
            name: bf.backend.value.clone(),
            description: bf.description.clone(),
            supports: bf.supports.iter().map(|s| s.value.clone()).collect(),
            variants,
            loc,
        });
        for r in bf.rules {
            pending_rules.push((file, r, 0, Some(index)));
        }
    }

    let mut layers = vec!["capability".to_string()];
    let mut layer_files: Vec<(String, PathBuf, bool)> = pack
        .layers
        .iter()
        .map(|r| (r.value.layer.clone(), PathBuf::from(&r.value.file), false))
        .collect();
    layer_files.extend(
        overlays
            .iter()
            .map(|p| ("overlay".to_string(), p.clone(), true)),
    );
    for (layer_name, path, is_overlay) in layer_files {
        let file = if is_overlay {
            match std::fs::read_to_string(&path) {
                Ok(t) => Some(l.sources.add(path.display().to_string(), t)),
                Err(e) => {
                    l.diags.push(Diagnostic::error(
                        "E-IO",
                        format!("cannot read overlay {}: {e}", path.display()),
                    ));
                    None
                }
            }
        } else {
            l.read(&path.display().to_string())
        };
        let Some(file) = file else { continue };
        let Some(lf) = l.parse::<LayerFile>(file) else {
            continue;
        };
        let name = if is_overlay {
            lf.layer.clone().unwrap_or(layer_name)
        } else {
            layer_name
        };
        let layer = match layers.iter().position(|x| *x == name) {
            Some(i) => i,
            None => {
                layers.push(name);
                layers.len() - 1
            }
        };
        for r in lf.rules {
            pending_rules.push((file, r, layer as u8, None));
        }
    }

    let mut seen: HashMap<String, Loc> = HashMap::new();
    for (file, r, layer, backend) in pending_rules {
        let loc = l.sources.node_loc(file, &r);
        let def = r.value;
        let id_loc = l.sources.node_loc(file, &def.id);
        if let Some(prev) = seen.get(&def.id.value) {
            let first = l.sources.describe(*prev);
            l.diags.push(
                Diagnostic::error(
                    "E-DUP-RULE",
                    format!(
                        "duplicate rule id `{}` (first defined at {first})",
                        def.id.value
                    ),
                )
                .at(id_loc),
            );
            continue;
        }
        seen.insert(def.id.value.clone(), id_loc);
        let resolve = |l: &mut Loader, name: &Spanned<String>| -> Option<u16> {
            match backends.iter().position(|b| b.name == name.value) {
                Some(b) => Some(b as u16),
                None if broken_backend_files > 0 => None,
                None => {
                    let at = l.sources.node_loc(file, name);
                    let hint = did_you_mean(&name.value, backends.iter().map(|b| b.name.as_str()));
                    l.diags.push(
                        Diagnostic::error("E-NAME", format!("unknown backend `{}`", name.value))
                            .at(at)
                            .help(hint.map(|h| format!("did you mean `{h}`?"))),
                    );
                    None
                }
            }
        };
        let targets: Vec<u16> = match (backend, &def.backend, def.backends.is_empty()) {
            (Some(b), None, true) => vec![b],
            (Some(_), _, _) => {
                let extra = def
                    .backend
                    .as_ref()
                    .or(def.backends.first())
                    .expect("given");
                let at = l.sources.node_loc(file, extra);
                l.diags.push(Diagnostic::error("E-RULE", "`backend:` belongs in layer files; a backend file's rules apply to its own backend").at(at));
                continue;
            }
            (None, Some(name), true) => match resolve(&mut l, name) {
                Some(b) => vec![b],
                None => continue,
            },
            (None, None, false) => {
                let mut out = Vec::new();
                for name in &def.backends {
                    if let Some(b) = resolve(&mut l, name)
                        && !out.contains(&b)
                    {
                        out.push(b);
                    }
                }
                if out.len() != def.backends.len() {
                    continue;
                }
                out
            }
            (None, Some(name), false) => {
                let at = l.sources.node_loc(file, name);
                l.diags.push(
                    Diagnostic::error(
                        "E-RULE",
                        format!(
                            "rule `{}` names both `backend:` and `backends:`",
                            def.id.value
                        ),
                    )
                    .at(at),
                );
                continue;
            }
            (None, None, true) => {
                l.diags.push(
                    Diagnostic::error(
                        "E-RULE",
                        format!(
                            "rule `{}` in a layer file must name its `backend:`",
                            def.id.value
                        ),
                    )
                    .at(id_loc),
                );
                continue;
            }
        };
        let backend = targets[0];
        let b = &backends[backend as usize];
        let mut mask = 0u64;
        for v in &def.variants {
            match b.variants.iter().position(|x| x.name == v.value) {
                Some(i) => mask |= 1 << i,
                None => {
                    let at = l.sources.node_loc(file, v);
                    let hint = did_you_mean(&v.value, b.variants.iter().map(|x| x.name.as_str()));
                    l.diags.push(
                        Diagnostic::error(
                            "E-NAME",
                            format!("backend `{}` has no variant `{}`", b.name, v.value),
                        )
                        .at(at)
                        .help(hint.map(|h| format!("did you mean `{h}`?"))),
                    );
                }
            }
        }
        if def.variants.is_empty() {
            mask = b.all_variants();
        } else if targets.len() > 1 {
            let at = l.sources.node_loc(file, &def.variants[0]);
            l.diags
                .push(Diagnostic::error("E-RULE", "`variants:` needs a single `backend:`").at(at));
        }
        let kind = match def.kind.as_ref().map(|k| k.value.as_str()) {
            None | Some("decline") => RuleKind::Decline,
            Some("switch") => RuleKind::Switch,
            Some(other) => {
                let at = l
                    .sources
                    .node_loc(file, def.kind.as_ref().expect("kind present"));
                l.diags.push(
                    Diagnostic::error(
                        "E-RULE",
                        format!("unknown rule kind `{other}`; expected `decline` or `switch`"),
                    )
                    .at(at),
                );
                RuleKind::Decline
            }
        };
        let when_loc = l.sources.node_loc(file, &def.when);
        let when = match parse_expr(&def.when.value)
            .map_err(syntax)
            .and_then(|ast| compiler.condition(&ast))
        {
            Ok(c) => c,
            Err(e) => {
                let d = type_diag(&l.sources, file, &def.when, e, "E-TYPE");
                l.diags.push(d);
                continue;
            }
        };
        let until = match &def.until {
            None => None,
            Some(node) => match parse_expr(&node.value)
                .map_err(syntax)
                .and_then(|ast| compiler.condition(&ast))
            {
                Ok(c) => Some(c),
                Err(e) => {
                    let d = type_diag(&l.sources, file, node, e, "E-TYPE");
                    l.diags.push(d);
                    None
                }
            },
        };
        let probes: Vec<u16> = when
            .slots
            .iter()
            .copied()
            .filter(|&s| schema.def(s as usize).origin == Origin::Probe)
            .collect();
        if def.reason.trim().is_empty() {
            l.diags.push(
                Diagnostic::warning(
                    "W-REASON",
                    format!("rule `{}` has an empty reason", def.id.value),
                )
                .at(id_loc),
            );
        }
        for &target in &targets {
            rules.push(Rule {
                id: def.id.value.clone(),
                backend: target,
                variants: if target == backend {
                    mask
                } else {
                    backends[target as usize].all_variants()
                },
                variant_names: def.variants.iter().map(|v| v.value.clone()).collect(),
                kind,
                layer,
                when_src: def.when.value.trim().to_string(),
                when: when.clone(),
                until_src: def.until.as_ref().map(|u| u.value.trim().to_string()),
                until: until.clone(),
                reason: def.reason.trim().to_string(),
                refs: def.refs.clone(),
                loc,
                when_loc,
                probes: probes.clone(),
            });
        }
    }

    let mut preference = Vec::new();
    for p in &pack.preference {
        let loc = l.sources.node_loc(pack_file, p);
        let def = &p.value;
        let when = def.when.as_ref().and_then(|node| {
            match parse_expr(&node.value)
                .map_err(syntax)
                .and_then(|ast| compiler.condition(&ast))
            {
                Ok(c) => {
                    if c.slots
                        .iter()
                        .any(|&s| schema.def(s as usize).origin == Origin::Probe)
                    {
                        let at = l.sources.node_loc(pack_file, node);
                        l.diags.push(
                            Diagnostic::error(
                                "E-PREF",
                                "preference conditions cannot read probe facts",
                            )
                            .at(at),
                        );
                    }
                    Some(c)
                }
                Err(e) => {
                    let d = type_diag(&l.sources, pack_file, node, e, "E-TYPE");
                    l.diags.push(d);
                    None
                }
            }
        });
        let mut order = Vec::new();
        for name in &def.order {
            match backends.iter().position(|b| b.name == name.value) {
                Some(i) if !order.contains(&(i as u16)) => order.push(i as u16),
                Some(_) => {
                    let at = l.sources.node_loc(pack_file, name);
                    l.diags.push(
                        Diagnostic::error(
                            "E-PREF",
                            format!("`{}` appears twice in this order", name.value),
                        )
                        .at(at),
                    );
                }
                // A backend whose file failed to load already has its own error.
                None if broken_backend_files > 0 => {}
                None => {
                    let at = l.sources.node_loc(pack_file, name);
                    let hint = did_you_mean(&name.value, backends.iter().map(|b| b.name.as_str()));
                    l.diags.push(
                        Diagnostic::error(
                            "E-NAME",
                            format!(
                                "unknown backend `{}` in preference `{}`",
                                name.value, def.id.value
                            ),
                        )
                        .at(at)
                        .help(hint.map(|h| format!("did you mean `{h}`?"))),
                    );
                }
            }
        }
        preference.push(Preference {
            id: def.id.value.clone(),
            when_src: def.when.as_ref().map(|w| w.value.trim().to_string()),
            when,
            order,
            refs: def.refs.clone(),
            loc,
        });
    }
    if preference.is_empty() {
        l.diags.push(
            Diagnostic::error("E-PREF", "a pack needs at least one preference entry").at(Loc {
                file: pack_file,
                start: 0,
                end: 0,
            }),
        );
    }

    let mut min_versions = Vec::new();
    for (fact, v) in &pack.min_versions {
        let at = l.sources.node_loc(pack_file, v);
        match (schema.slot(fact), Version::parse(&v.value)) {
            (Some(_), Some(ver)) => min_versions.push((fact.clone(), ver)),
            (None, _) => l.diags.push(
                Diagnostic::error("E-NAME", format!("min_versions: unknown fact `{fact}`")).at(at),
            ),
            (_, None) => l.diags.push(
                Diagnostic::error(
                    "E-TYPE",
                    format!("min_versions: `{}` is not a version", v.value),
                )
                .at(at),
            ),
        }
    }

    if l.diags.has_errors() {
        for d in &mut l.diags.0 {
            d.locate(&l.sources);
        }
        return Err(fail(l));
    }
    let mut warnings = l.diags;
    for d in &mut warnings.0 {
        d.locate(&l.sources);
    }
    let hot = crate::policy::HotPath::build(&compiler.program, &rules, &backends, &preference);
    Ok(Policy {
        name: pack.name.value.clone(),
        description: pack.description.clone(),
        schema,
        sources: l.sources,
        program: compiler.program,
        backends,
        rules,
        preference,
        layers,
        defs,
        min_versions,
        warnings,
        disabled_layers: 0,
        hot,
    })
}

impl Policy {
    /// Loads an embedded pack by name (`te`, `native`).
    pub fn embedded(name: &str) -> Result<Policy, LoadError> {
        load_pack(PackSource::Embedded(name.to_string()), &[])
    }

    /// Loads a pack from a folder holding `pack.yaml`.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Policy, LoadError> {
        load_pack(PackSource::Dir(dir.as_ref().to_path_buf()), &[])
    }
}
