//! Loading a pack, in five stages that each report every problem they find with its
//! `file:line:col` (the pack loads only when no stage found an error):
//!
//! 1. [`read_pack`]: `pack.yaml`, then every file it names (backend files, layer files) and the
//!    overlays, into one [`SourceMap`] (`E-IO`).
//! 2. [`parse_pack`]: the YAML of each file into the shapes of [`super::yaml`] (`E-YAML`).
//! 3. [`typecheck_pack`]: every expression (definitions, variants, rules, preference
//!    conditions, the catalogue's `admits` conditions) compiled against the pack family's facts
//!    into one evaluation program (`E-SYNTAX`, `E-TYPE`, `E-DEF`).
//! 4. [`link_pack`]: names resolved (backends, variants, layers, preference orders, executor
//!    chains) and the [`Policy`] built (`E-NAME`, `E-DUP-*`, `E-RULE`, `E-PREF`, `E-EXECUTOR`).
//! 5. [`lint_pack`]: load-time warnings (`W-REASON`). The exact lints over all inputs are
//!    `attn-policy check` (`attn_policy_analysis::lint`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_saphyr::Spanned;

use super::source::SourceMap;
use super::yaml::{BackendFile, ExecutorsDef, LayerFile, PackFile, RuleDef};
use crate::catalogue::ExecutorCatalogue;
use crate::diag::{Code, Diagnostic, Diagnostics, Loc};
use crate::facts::did_you_mean;
use crate::facts::schema::{Origin, Schema};
use crate::lang::{Version, parse_expr};
use crate::policy::{
    Backend, ChainEntry, Definition, ExecutorChain, Policy, Preference, Rule, RuleKind, Variant,
};
use crate::typecheck::{Compiled, Compiler, TypeError};

/// Where a pack comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
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

/// Loads and type-checks a pack, plus optional overlay files (site policy layers). Executor
/// chains are not checked against a catalogue; [`super::PackSpec`] takes one.
pub fn load_pack(source: PackSource, overlays: &[PathBuf]) -> Result<Policy, LoadError> {
    load_pack_with(source, overlays, None)
}

/// [`load_pack`] with the executor catalogue that chains are checked against.
pub fn load_pack_with(
    source: PackSource,
    overlays: &[PathBuf],
    catalogue: Option<&ExecutorCatalogue>,
) -> Result<Policy, LoadError> {
    let mut l = Loader {
        source,
        sources: SourceMap::default(),
        diags: Diagnostics::default(),
        release: None,
    };
    let policy = read_pack(&mut l, overlays)
        .map(|read| parse_pack(&mut l, read))
        .and_then(|parsed| {
            let schema = family_of(&mut l, &parsed)?;
            let typed = typecheck_pack(&mut l, &parsed, schema, catalogue);
            lint_pack(&mut l, &parsed);
            Some(link_pack(&mut l, parsed, typed, schema, catalogue))
        });
    for d in &mut l.diags.0 {
        d.locate(&l.sources);
    }
    match policy {
        Some(mut policy) if !l.diags.has_errors() => {
            policy.sources = l.sources;
            policy.warnings = l.diags;
            Ok(policy)
        }
        _ => Err(LoadError {
            diagnostics: l.diags,
            sources: l.sources,
        }),
    }
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

/// The state every stage shares: where files come from, what was read, what went wrong.
struct Loader {
    source: PackSource,
    sources: SourceMap,
    diags: Diagnostics,
    /// The upstream release being loaded (`releases:` in pack.yaml), once pack.yaml is read.
    release: Option<SelectedRelease>,
}

/// The release a pack loads as: its name, version and the input fields it does not read.
struct SelectedRelease {
    name: String,
    version: Version,
    ignores: Vec<String>,
}

impl Loader {
    fn display_name(&self, file: &str) -> String {
        match &self.source {
            PackSource::Embedded(p) => {
                format!("rules/{}/{file}", super::release::split_name(p).0)
            }
            PackSource::Dir(d) => d.join(file).display().to_string(),
        }
    }

    /// Reads a file of the pack (embedded or from its folder).
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
                self.diags.push(Diagnostic::new(Code::Io, msg));
                None
            }
        }
    }

    /// Reads a file outside the pack (an overlay), by its own path.
    fn read_outside(&mut self, path: &Path) -> Option<u16> {
        match std::fs::read_to_string(path) {
            Ok(t) => Some(self.sources.add(path.display().to_string(), t)),
            Err(e) => {
                self.diags.push(Diagnostic::new(
                    Code::Io,
                    format!("cannot read overlay {}: {e}", path.display()),
                ));
                None
            }
        }
    }

    fn parse<T: DeserializeOwned>(&mut self, file: u16) -> Option<T> {
        let text = &self.sources.files[file as usize].text;
        match serde_saphyr::from_str::<T>(text) {
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
                let mut d = Diagnostic::new(Code::Yaml, msg);
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

    fn at<T>(&self, file: u16, node: &Spanned<T>) -> Loc {
        self.sources.node_loc(file, node)
    }

    /// Reports an expression's error at its position inside the YAML scalar.
    fn expr_error(&mut self, file: u16, node: &Spanned<String>, e: TypeError) {
        let loc = self.sources.expr_loc(file, node, e.span);
        let one_line = node.value.split_whitespace().collect::<Vec<_>>().join(" ");
        let code = if e.syntax { Code::Syntax } else { Code::Type };
        self.diags.push(
            Diagnostic::new(code, e.message)
                .at(loc)
                .label(format!("in `{one_line}`"))
                .help(e.help),
        );
    }

    /// An unknown name, with a did-you-mean among `known`.
    fn unknown<'a>(
        &mut self,
        code: Code,
        message: String,
        loc: Loc,
        name: &str,
        known: impl IntoIterator<Item = &'a str>,
    ) {
        let hint = did_you_mean(name, known);
        self.diags.push(
            Diagnostic::new(code, message)
                .at(loc)
                .help(hint.map(|h| format!("did you mean `{h}`?"))),
        );
    }
}

// ---- stage 1: read ---------------------------------------------------------------------------

/// A layer's rules: a layer file of the pack or an overlay.
struct LayerSource {
    /// The layer name pack.yaml gives it (`overlay` for overlays).
    name: String,
    file: u16,
    overlay: bool,
}

/// Every file of the pack, read; `pack.yaml` already parsed (it names the other files).
struct ReadPack {
    pack_file: u16,
    pack: PackFile,
    /// Per entry of `backends:`, its file (None: unreadable).
    backend_files: Vec<Option<u16>>,
    layer_files: Vec<LayerSource>,
}

/// Stage 1: reads `pack.yaml`, every backend and layer file it names, and the overlays.
fn read_pack(l: &mut Loader, overlays: &[PathBuf]) -> Option<ReadPack> {
    let pack_file = l.read("pack.yaml")?;
    let mut pack: PackFile = l.parse(pack_file)?;
    select_release(l, pack_file, &mut pack)?;
    let backend_files = pack.backends.iter().map(|e| l.read(&e.value)).collect();
    let mut layer_files = Vec::new();
    for r in &pack.layers {
        if let Some(file) = l.read(&r.value.file) {
            layer_files.push(LayerSource {
                name: r.value.layer.clone(),
                file,
                overlay: false,
            });
        }
    }
    for path in overlays {
        if let Some(file) = l.read_outside(path) {
            layer_files.push(LayerSource {
                name: "overlay".into(),
                file,
                overlay: true,
            });
        }
    }
    Some(ReadPack {
        pack_file,
        pack,
        backend_files,
        layer_files,
    })
}

/// Picks the release the pack loads as (`te@2.19.0`, else pack.yaml's `release:`) and puts
/// that release's definitions in place of the pack's.
fn select_release(l: &mut Loader, pack_file: u16, pack: &mut PackFile) -> Option<()> {
    let requested = match &l.source {
        PackSource::Embedded(name) => super::release::split_name(name).1.map(str::to_string),
        PackSource::Dir(_) => None,
    };
    if pack.releases.is_empty() {
        if let Some(r) = requested {
            l.diags.push(Diagnostic::new(
                Code::Name,
                format!(
                    "pack `{}` mirrors no upstream releases: there is no `{}@{r}`",
                    pack.name.value, pack.name.value
                ),
            ));
            return None;
        }
        if let Some(r) = &pack.release {
            let loc = l.at(pack_file, r);
            l.diags
                .push(Diagnostic::new(Code::Name, "`release:` needs a `releases:` map").at(loc));
        }
        return Some(());
    }
    let named = requested.is_some();
    let name = match requested.or_else(|| pack.release.as_ref().map(|r| r.value.clone())) {
        Some(n) => n,
        None => {
            let loc = l.at(pack_file, &pack.name);
            l.diags.push(
                Diagnostic::new(
                    Code::Name,
                    "a pack with `releases:` names the release its plain name decides as (`release:`)",
                )
                .at(loc),
            );
            return None;
        }
    };
    let known: Vec<String> = pack.releases.keys().cloned().collect();
    let Some(def) = pack.releases.remove(&name) else {
        let msg = format!(
            "pack `{}` has no release `{name}`; releases: {}",
            pack.name.value,
            known.join(", ")
        );
        let hint = did_you_mean(&name, known.iter().map(String::as_str));
        let mut d =
            Diagnostic::new(Code::Name, msg).help(hint.map(|h| format!("did you mean `{h}`?")));
        if let Some(r) = &pack.release {
            d = d.at(l.at(pack_file, r));
        }
        l.diags.push(d);
        return None;
    };
    let Some(version) = Version::parse(&name) else {
        let loc = l.at(pack_file, &def);
        l.diags.push(
            Diagnostic::new(Code::Name, format!("release `{name}` is not a version")).at(loc),
        );
        return None;
    };
    let def = def.value;
    // The definitions of every newer release, newest first, then this release's own.
    let mut newer: Vec<(Version, BTreeMap<String, Spanned<String>>)> =
        std::mem::take(&mut pack.releases)
            .into_iter()
            .filter_map(|(k, r)| Version::parse(&k).map(|v| (v, r.value.defs)))
            .filter(|(v, _)| *v > version)
            .collect();
    newer.sort_by_key(|b| std::cmp::Reverse(b.0));
    for (k, v) in newer.into_iter().flat_map(|(_, d)| d).chain(def.defs) {
        pack.defs.insert(k, v);
    }
    if named {
        pack.name.value = format!("{}@{name}", pack.name.value);
    }
    l.release = Some(SelectedRelease {
        name,
        version,
        ignores: def.ignores.into_iter().map(|s| s.value).collect(),
    });
    Some(())
}

/// Whether the `releases:` bound of a rule or backend file admits the release being loaded
/// (a bad bound is reported and counts as admitting, so the rest is still checked).
fn in_release(l: &mut Loader, file: u16, bound: Option<&Spanned<String>>) -> bool {
    let Some(bound) = bound else {
        return true;
    };
    let at = l.at(file, bound);
    match super::release::ReleaseRange::parse(&bound.value) {
        Ok(range) => match &l.release {
            Some(r) => range.contains(&r.version),
            None => {
                l.diags.push(
                    Diagnostic::new(
                        Code::Name,
                        "`releases:` bound in a pack that has no `releases:` map",
                    )
                    .at(at),
                );
                true
            }
        },
        Err(msg) => {
            l.diags.push(Diagnostic::new(Code::Syntax, msg).at(at));
            true
        }
    }
}

// ---- stage 2: parse --------------------------------------------------------------------------

/// A rule before linking: where it was written, its YAML, its layer and (in a backend file)
/// the index of its backend among the parsed backend files.
struct RuleSource {
    file: u16,
    def: Spanned<RuleDef>,
    layer: String,
    backend_file: Option<usize>,
}

/// Every file of the pack parsed into its YAML shape.
struct ParsedPack {
    pack_file: u16,
    pack: PackFile,
    /// Backend files that read and parsed, in `backends:` order.
    backends: Vec<(u16, BackendFile)>,
    /// Some backend file did not read or parse: names it would define are not reported as
    /// unknown (its own error says why).
    broken_backend_files: bool,
    /// Every rule: backend files' rules first, then layer files' and overlays', in order.
    rules: Vec<RuleSource>,
}

/// Stage 2: parses the backend and layer files.
fn parse_pack(l: &mut Loader, read: ReadPack) -> ParsedPack {
    let mut read = read;
    let mut backends = Vec::new();
    let mut broken_backend_files = false;
    // Backends the release does not have: left out, with their places in preference orders
    // and executor chains.
    let mut absent: Vec<String> = Vec::new();
    for file in read.backend_files {
        match file.and_then(|f| l.parse::<BackendFile>(f).map(|b| (f, b))) {
            Some((f, b)) => {
                if in_release(l, f, b.releases.as_ref()) {
                    backends.push((f, b));
                } else {
                    absent.push(b.backend.value.clone());
                }
            }
            None => broken_backend_files = true,
        }
    }
    if !absent.is_empty() {
        for p in &mut read.pack.preference {
            p.value.order.retain(|b| !absent.contains(&b.value));
        }
        read.pack
            .executors
            .retain(|e| !absent.contains(&e.value.backend.value));
    }
    let mut rules = Vec::new();
    for (i, (file, bf)) in backends.iter_mut().enumerate() {
        for def in std::mem::take(&mut bf.rules) {
            if !in_release(l, *file, def.value.releases.as_ref()) {
                continue;
            }
            rules.push(RuleSource {
                file: *file,
                def,
                layer: "capability".into(),
                backend_file: Some(i),
            });
        }
    }
    for layer in read.layer_files {
        let Some(lf) = l.parse::<LayerFile>(layer.file) else {
            continue;
        };
        // An overlay may name its own layer; pack layers take the name pack.yaml gives.
        let name = match (layer.overlay, lf.layer) {
            (true, Some(own)) => own,
            _ => layer.name,
        };
        for mut def in lf.rules {
            if !in_release(l, layer.file, def.value.releases.as_ref()) {
                continue;
            }
            // A layer rule for several backends applies to those the release has.
            if !absent.is_empty() {
                if def
                    .value
                    .backend
                    .as_ref()
                    .is_some_and(|b| absent.contains(&b.value))
                {
                    continue;
                }
                let named = def.value.backends.len();
                def.value.backends.retain(|b| !absent.contains(&b.value));
                if named > 0 && def.value.backends.is_empty() {
                    continue;
                }
            }
            rules.push(RuleSource {
                file: layer.file,
                def,
                layer: name.clone(),
                backend_file: None,
            });
        }
    }
    ParsedPack {
        pack_file: read.pack_file,
        pack: read.pack,
        backends,
        broken_backend_files,
        rules,
    }
}

/// The pack family pack.yaml names (`te` when absent).
fn family_of(l: &mut Loader, parsed: &ParsedPack) -> Option<&'static Schema> {
    let Some(name) = &parsed.pack.family else {
        return Some(&crate::facts::te::TE);
    };
    if let Some(schema) = crate::facts::family(&name.value) {
        return Some(schema);
    }
    let known: Vec<&str> = crate::facts::families().iter().map(|s| s.family).collect();
    let loc = l.at(parsed.pack_file, name);
    l.unknown(
        Code::Family,
        format!(
            "unknown pack family `{}`; families: {}",
            name.value,
            known.join(", ")
        ),
        loc,
        &name.value,
        known.iter().copied(),
    );
    None
}

// ---- stage 3: type-check ---------------------------------------------------------------------

/// Every expression of the pack, compiled into `compiler.program` (None: it had an error).
struct TypedPack {
    compiler: Compiler,
    defs: Vec<(String, Compiled)>,
    /// Per parsed backend file, per variant: (`applicable`, `value`).
    variants: Vec<Vec<(Option<Compiled>, Option<Compiled>)>>,
    /// Per rule of `ParsedPack::rules`: (`when`, `until`).
    rules: Vec<(Option<Compiled>, Option<Compiled>)>,
    /// Per preference entry: its `when`.
    preference: Vec<Option<Compiled>>,
    /// Per catalogue entry that states a condition for this family: (name, condition).
    admits: Vec<(String, Compiled)>,
}

/// Stage 3: compiles every expression against the family's facts.
fn typecheck_pack(
    l: &mut Loader,
    parsed: &ParsedPack,
    schema: &'static Schema,
    catalogue: Option<&ExecutorCatalogue>,
) -> TypedPack {
    let pack_file = parsed.pack_file;
    let pack = &parsed.pack;
    // Definitions: compiled on first use; each is also checked on its own below.
    for (name, node) in &pack.defs {
        if schema.slot(name).is_some() {
            let loc = l.at(pack_file, node);
            l.diags.push(
                Diagnostic::new(
                    Code::Def,
                    format!("definition `{name}` shadows a fact of the same name"),
                )
                .at(loc),
            );
        }
    }
    let defs_src: BTreeMap<String, String> = pack
        .defs
        .iter()
        .map(|(k, v)| (k.clone(), v.value.clone()))
        .collect();
    let mut compiler = Compiler::new(schema, defs_src);
    let mut defs = Vec::new();
    for (name, node) in &pack.defs {
        match compiler.compile_def(name) {
            Ok(c) => defs.push((name.clone(), c)),
            Err(e) => l.expr_error(pack_file, node, e),
        }
    }
    let mut compile = |l: &mut Loader, file: u16, node: &Spanned<String>, boolean: bool| {
        let compiled = parse_expr(&node.value)
            .map_err(TypeError::from)
            .and_then(|ast| {
                if boolean {
                    compiler.condition(&ast)
                } else {
                    compiler.expr(&ast)
                }
            });
        compiled.map_err(|e| l.expr_error(file, node, e)).ok()
    };
    let variants = parsed
        .backends
        .iter()
        .map(|(file, bf)| {
            bf.variants
                .iter()
                .map(|v| {
                    let applicable = v
                        .value
                        .applicable
                        .as_ref()
                        .and_then(|n| compile(l, *file, n, true));
                    let value = v
                        .value
                        .value
                        .as_ref()
                        .and_then(|n| compile(l, *file, n, false));
                    (applicable, value)
                })
                .collect()
        })
        .collect();
    let rules = parsed
        .rules
        .iter()
        .map(|r| {
            let when = compile(l, r.file, &r.def.value.when, true);
            let until = r
                .def
                .value
                .until
                .as_ref()
                .and_then(|n| compile(l, r.file, n, true));
            (when, until)
        })
        .collect();
    let preference = pack
        .preference
        .iter()
        .map(|p| {
            let node = p.value.when.as_ref()?;
            let c = compile(l, pack_file, node, true)?;
            if c.slots
                .iter()
                .any(|&s| schema.def(s as usize).origin == Origin::Probe)
            {
                let at = l.at(pack_file, node);
                l.diags.push(
                    Diagnostic::new(Code::Pref, "preference conditions cannot read probe facts")
                        .at(at),
                );
            }
            Some(c)
        })
        .collect();
    // The catalogue's conditions are the adapters' code, not the pack's: an error there has
    // no location in the pack, and names the executor.
    let mut admits = Vec::new();
    for entry in catalogue.map_or(&[][..], |c| c.entries()) {
        let Some(src) = entry.admits_for(schema.family) else {
            continue;
        };
        match parse_expr(src)
            .map_err(TypeError::from)
            .and_then(|ast| compiler.condition(&ast))
        {
            Ok(c) => admits.push((entry.name.clone(), c)),
            Err(e) => l.diags.push(Diagnostic::new(
                Code::Executor,
                format!(
                    "executor `{}`: its `admits` condition for family `{}` is invalid: {} (in `{src}`)",
                    entry.name, schema.family, e.message
                ),
            )),
        }
    }
    TypedPack {
        compiler,
        defs,
        variants,
        rules,
        preference,
        admits,
    }
}

// ---- stage 4: link ---------------------------------------------------------------------------

/// Stage 4: resolves every name and builds the policy.
fn link_pack(
    l: &mut Loader,
    parsed: ParsedPack,
    typed: TypedPack,
    schema: &'static Schema,
    catalogue: Option<&ExecutorCatalogue>,
) -> Policy {
    let ParsedPack {
        pack_file,
        pack,
        backends: backend_files,
        broken_backend_files,
        rules: rule_sources,
    } = parsed;
    let TypedPack {
        compiler,
        defs,
        variants: typed_variants,
        rules: typed_rules,
        preference: typed_preference,
        admits,
    } = typed;

    let (def_sources, public) = link_public_defs(l, &pack, pack_file);
    let mut shower = super::shown::Shower::new(&def_sources, &public);
    let definitions = link_definitions(&pack, &def_sources, &public, &mut shower);
    let (backends, backend_of) = link_backends(l, &backend_files, typed_variants, &mut shower);
    let (layers, rules) = link_rules(
        l,
        rule_sources.into_iter().zip(typed_rules),
        &backends,
        &backend_of,
        broken_backend_files,
        schema,
        &mut shower,
    );

    let preference = link_preference(
        l,
        &pack,
        pack_file,
        typed_preference,
        &backends,
        broken_backend_files,
        &mut shower,
    );
    let executor_chains =
        link_executors(l, &pack.executors, pack_file, &backends, catalogue, &admits);
    let min_versions = link_min_versions(l, &pack, pack_file, schema);
    let allow = link_allow(l, &pack, pack_file);

    let release = link_release(l, schema, &rules, &backends, &preference);
    let hot =
        crate::policy::HotPath::build(&compiler.program, schema, &rules, &backends, &preference);
    Policy {
        name: pack.name.value.clone(),
        description: pack.description.clone(),
        schema,
        sources: SourceMap::default(),
        program: compiler.program,
        backends,
        rules,
        preference,
        layers,
        defs,
        definitions,
        min_versions,
        executor_chains,
        executor_admits: admits,
        warnings: Diagnostics::default(),
        allow,
        release,
        auto: None,
        disabled_layers: 0,
        hot,
    }
}

/// The release the pack loaded as, its ignored fields resolved to slots; reports every rule,
/// variant or preference condition of the release that reads a field the release ignores.
fn link_release(
    l: &mut Loader,
    schema: &'static Schema,
    rules: &[Rule],
    backends: &[Backend],
    preference: &[Preference],
) -> Option<crate::policy::Release> {
    let r = l.release.as_ref()?;
    let mut ignores = Vec::new();
    for field in &r.ignores {
        match schema.slot(field) {
            Some(slot) => ignores.push((field.clone(), slot)),
            None => l.diags.push(Diagnostic::new(
                Code::Name,
                format!(
                    "release `{}` ignores `{field}`, which is not a fact of family `{}`",
                    r.name, schema.family
                ),
            )),
        }
    }
    let reads = |c: &Compiled| -> Option<&str> {
        ignores
            .iter()
            .find(|(_, s)| c.slots.contains(&(*s as u16)))
            .map(|(f, _)| f.as_str())
    };
    let mut errors = Vec::new();
    for rule in rules {
        if let Some(f) = reads(&rule.when) {
            errors.push(
                Diagnostic::new(
                    Code::Rule,
                    format!(
                        "rule `{}` reads `{f}`, which release {} does not have (`ignores:`); bound the rule with `releases:`",
                        rule.id, r.name
                    ),
                )
                .at(rule.when_loc),
            );
        }
    }
    for b in backends {
        for v in &b.variants {
            if let Some(f) = [&v.applicable, &v.value]
                .into_iter()
                .flatten()
                .find_map(reads)
            {
                errors.push(Diagnostic::new(
                    Code::Rule,
                    format!(
                        "variant `{}` of `{}` reads `{f}`, which release {} does not have",
                        v.name, b.name, r.name
                    ),
                ));
            }
        }
    }
    for p in preference {
        if let Some(f) = p.when.as_ref().and_then(reads) {
            errors.push(Diagnostic::new(
                Code::Pref,
                format!(
                    "preference `{}` reads `{f}`, which release {} does not have",
                    p.id, r.name
                ),
            ));
        }
    }
    l.diags.0.extend(errors);
    Some(crate::policy::Release {
        name: r.name.clone(),
        ignores,
    })
}

/// The pack's definitions, in name order, each with its source on one line and as shown.
fn link_definitions(
    pack: &PackFile,
    def_sources: &BTreeMap<String, String>,
    public: &BTreeSet<String>,
    shower: &mut super::shown::Shower<'_>,
) -> Vec<Definition> {
    def_sources
        .iter()
        .map(|(name, source)| Definition {
            name: name.clone(),
            source: super::shown::one_line(source),
            shown: shower.show(source),
            public: pack
                .public_defs
                .get(name)
                .filter(|_| public.contains(name))
                .map(|d| d.value.trim().to_string()),
        })
        .collect()
}

/// Backends, in the listed order, and `backend_of[i]`: the backend of parsed file i (`None` for
/// a file that defines a backend again).
fn link_backends(
    l: &mut Loader,
    backend_files: &[(u16, BackendFile)],
    typed_variants: Vec<Vec<(Option<Compiled>, Option<Compiled>)>>,
    shower: &mut super::shown::Shower<'_>,
) -> (Vec<Backend>, Vec<Option<u16>>) {
    let mut backends: Vec<Backend> = Vec::new();
    let mut backend_of: Vec<Option<u16>> = Vec::new();
    for ((file, bf), compiled) in backend_files.iter().zip(typed_variants) {
        let loc = l.at(*file, &bf.backend);
        if backends.iter().any(|b| b.name == bf.backend.value) {
            l.diags.push(
                Diagnostic::new(
                    Code::DupBackend,
                    format!("backend `{}` is defined twice", bf.backend.value),
                )
                .at(loc),
            );
            backend_of.push(None);
            continue;
        }
        if bf.variants.len() > 63 {
            l.diags.push(
                Diagnostic::new(Code::Variants, "a backend may have at most 63 variants").at(loc),
            );
        }
        let variants = bf
            .variants
            .iter()
            .zip(compiled)
            .map(|(v, (applicable, value))| Variant {
                name: v.value.name.value.clone(),
                description: v.value.description.clone(),
                applicable,
                applicable_src: v
                    .value
                    .applicable
                    .as_ref()
                    .map(|s| s.value.trim().to_string()),
                applicable_shown: v.value.applicable.as_ref().map(|s| shower.show(&s.value)),
                value,
            })
            .collect();
        backend_of.push(Some(backends.len() as u16));
        backends.push(Backend {
            name: bf.backend.value.clone(),
            description: bf.description.clone(),
            supports: bf.supports.iter().map(|s| s.value.clone()).collect(),
            variants,
            loc,
        });
    }
    (backends, backend_of)
}

/// Layers (`capability`, index 0, holds the backend files' rules; the others in order of first
/// use) and the rules, each once per backend it targets. `sources`: each rule's source with its
/// compiled (`when`, `until`); `backend_of`: as [`link_backends`] returns it.
fn link_rules(
    l: &mut Loader,
    sources: impl IntoIterator<Item = (RuleSource, (Option<Compiled>, Option<Compiled>))>,
    backends: &[Backend],
    backend_of: &[Option<u16>],
    broken_backend_files: bool,
    schema: &'static Schema,
    shower: &mut super::shown::Shower<'_>,
) -> (Vec<String>, Vec<Rule>) {
    let mut layers = vec!["capability".to_string()];
    let mut rules: Vec<Rule> = Vec::new();
    let mut seen: HashMap<String, Loc> = HashMap::new();
    for (src, (when, until)) in sources {
        let own_backend = match src.backend_file {
            // The rules of a duplicate backend file were reported with it.
            Some(i) => match backend_of[i] {
                Some(b) => Some(b),
                None => continue,
            },
            None => None,
        };
        let layer = match layers.iter().position(|x| *x == src.layer) {
            Some(i) => i,
            None => {
                layers.push(src.layer.clone());
                layers.len() - 1
            }
        };
        let file = src.file;
        let loc = l.at(file, &src.def);
        let def = src.def.value;
        let id_loc = l.at(file, &def.id);
        if let Some(prev) = seen.get(&def.id.value) {
            let first = l.sources.describe(*prev);
            l.diags.push(
                Diagnostic::new(
                    Code::DupRule,
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
        let Some(targets) = rule_targets(
            l,
            file,
            &def,
            id_loc,
            own_backend,
            backends,
            broken_backend_files,
        ) else {
            continue;
        };
        let backend = targets[0];
        let mask = rule_variant_mask(l, file, &def, &backends[backend as usize], targets.len());
        let kind = rule_kind(l, file, &def);
        // A condition that did not compile was reported in stage 3.
        let Some(when) = when else { continue };
        let when_loc = l.at(file, &def.when);
        let probes: Vec<u16> = when
            .slots
            .iter()
            .copied()
            .filter(|&s| schema.def(s as usize).origin == Origin::Probe)
            .collect();
        let when_shown = shower.show(&def.when.value);
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
                layer: layer as u8,
                when_src: def.when.value.trim().to_string(),
                when_shown: when_shown.clone(),
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
    (layers, rules)
}

/// The variants of backend `b` a rule's `variants:` names, as a mask (all of them when it names
/// none); `targets`: how many backends the rule targets (`variants:` needs one).
fn rule_variant_mask(l: &mut Loader, file: u16, def: &RuleDef, b: &Backend, targets: usize) -> u64 {
    let mut mask = 0u64;
    for v in &def.variants {
        match b.variants.iter().position(|x| x.name == v.value) {
            Some(i) => mask |= 1 << i,
            None => {
                let at = l.at(file, v);
                l.unknown(
                    Code::Name,
                    format!("backend `{}` has no variant `{}`", b.name, v.value),
                    at,
                    &v.value,
                    b.variants.iter().map(|x| x.name.as_str()),
                );
            }
        }
    }
    if def.variants.is_empty() {
        mask = b.all_variants();
    } else if targets > 1 {
        let at = l.at(file, &def.variants[0]);
        l.diags
            .push(Diagnostic::new(Code::Rule, "`variants:` needs a single `backend:`").at(at));
    }
    mask
}

/// A rule's `kind:` (`decline` when absent or unknown; an unknown one is reported).
fn rule_kind(l: &mut Loader, file: u16, def: &RuleDef) -> RuleKind {
    match def.kind.as_ref().map(|k| k.value.as_str()) {
        None | Some("decline") => RuleKind::Decline,
        Some("switch") => RuleKind::Switch,
        Some(other) => {
            let at = l.at(file, def.kind.as_ref().expect("kind present"));
            l.diags.push(
                Diagnostic::new(
                    Code::Rule,
                    format!("unknown rule kind `{other}`; expected `decline` or `switch`"),
                )
                .at(at),
            );
            RuleKind::Decline
        }
    }
}

/// `min_versions:`: (fact, version) for each entry that names a fact and a version.
fn link_min_versions(
    l: &mut Loader,
    pack: &PackFile,
    pack_file: u16,
    schema: &'static Schema,
) -> Vec<(String, Version)> {
    let mut min_versions = Vec::new();
    for (fact, v) in &pack.min_versions {
        let at = l.at(pack_file, v);
        match (schema.slot(fact), Version::parse(&v.value)) {
            (Some(_), Some(ver)) => min_versions.push((fact.clone(), ver)),
            (None, _) => l.diags.push(
                Diagnostic::new(Code::Name, format!("min_versions: unknown fact `{fact}`")).at(at),
            ),
            (_, None) => l.diags.push(
                Diagnostic::new(
                    Code::Type,
                    format!("min_versions: `{}` is not a version", v.value),
                )
                .at(at),
            ),
        }
    }
    min_versions
}

/// `allow:`: the warning codes the pack allows (an error code or an unknown name is reported).
fn link_allow(l: &mut Loader, pack: &PackFile, pack_file: u16) -> Vec<Code> {
    let mut allow = Vec::new();
    for name in &pack.allow {
        let at = l.at(pack_file, name);
        match Code::parse(&name.value) {
            Some(code) if code.severity() == crate::diag::Severity::Warning => allow.push(code),
            Some(code) => l.diags.push(
                Diagnostic::new(
                    Code::Name,
                    format!("allow: `{code}` is an error; only warnings (W-...) can be allowed"),
                )
                .at(at),
            ),
            None => {
                use strum::IntoEnumIterator;
                let names: Vec<&str> = Code::iter()
                    .filter(|c| c.severity() == crate::diag::Severity::Warning)
                    .map(Code::name)
                    .collect();
                l.diags.push(
                    Diagnostic::new(Code::Name, format!("allow: unknown code `{}`", name.value))
                        .at(at)
                        .help(
                            crate::facts::did_you_mean(&name.value.to_ascii_uppercase(), names)
                                .map(|s| format!("did you mean `{s}`?")),
                        ),
                );
            }
        }
    }
    allow
}

/// The definitions' sources by name, and the names of the public ones (`public_defs:`); each
/// public entry must name a definition and say what it means.
fn link_public_defs(
    l: &mut Loader,
    pack: &PackFile,
    pack_file: u16,
) -> (BTreeMap<String, String>, BTreeSet<String>) {
    let sources: BTreeMap<String, String> = pack
        .defs
        .iter()
        .map(|(k, v)| (k.clone(), v.value.clone()))
        .collect();
    let mut public = BTreeSet::new();
    for (name, doc) in &pack.public_defs {
        let at = l.at(pack_file, doc);
        if !sources.contains_key(name) {
            l.unknown(
                Code::Name,
                format!("public_defs: no definition `{name}` under `defs:`"),
                at,
                name,
                sources.keys().map(String::as_str),
            );
        } else if doc.value.trim().is_empty() {
            l.diags.push(
                Diagnostic::new(
                    Code::Def,
                    format!("public definition `{name}` needs a description of what it means"),
                )
                .at(at),
            );
        } else {
            public.insert(name.clone());
        }
    }
    (sources, public)
}

/// The backends a rule declines: its own (a backend file's rule) or the one(s) a layer rule
/// names. `None`: the rule is malformed (reported).
fn rule_targets(
    l: &mut Loader,
    file: u16,
    def: &RuleDef,
    id_loc: Loc,
    own_backend: Option<u16>,
    backends: &[Backend],
    broken_backend_files: bool,
) -> Option<Vec<u16>> {
    let resolve = |l: &mut Loader, name: &Spanned<String>| -> Option<u16> {
        match backends.iter().position(|b| b.name == name.value) {
            Some(b) => Some(b as u16),
            None if broken_backend_files => None,
            None => {
                let at = l.at(file, name);
                l.unknown(
                    Code::Name,
                    format!("unknown backend `{}`", name.value),
                    at,
                    &name.value,
                    backends.iter().map(|b| b.name.as_str()),
                );
                None
            }
        }
    };
    match (own_backend, &def.backend, def.backends.is_empty()) {
        (Some(b), None, true) => Some(vec![b]),
        (Some(_), _, _) => {
            let extra = def
                .backend
                .as_ref()
                .or(def.backends.first())
                .expect("given");
            let at = l.at(file, extra);
            l.diags.push(
                Diagnostic::new(
                    Code::Rule,
                    "`backend:` belongs in layer files; a backend file's rules apply to its own backend",
                )
                .at(at),
            );
            None
        }
        (None, Some(name), true) => resolve(l, name).map(|b| vec![b]),
        (None, None, false) => {
            let mut out = Vec::new();
            for name in &def.backends {
                if let Some(b) = resolve(l, name)
                    && !out.contains(&b)
                {
                    out.push(b);
                }
            }
            (out.len() == def.backends.len()).then_some(out)
        }
        (None, Some(name), false) => {
            let at = l.at(file, name);
            l.diags.push(
                Diagnostic::new(
                    Code::Rule,
                    format!(
                        "rule `{}` names both `backend:` and `backends:`",
                        def.id.value
                    ),
                )
                .at(at),
            );
            None
        }
        (None, None, true) => {
            l.diags.push(
                Diagnostic::new(
                    Code::Rule,
                    format!(
                        "rule `{}` in a layer file must name its `backend:`",
                        def.id.value
                    ),
                )
                .at(id_loc),
            );
            None
        }
    }
}

/// The preference entries with their orders resolved.
fn link_preference(
    l: &mut Loader,
    pack: &PackFile,
    pack_file: u16,
    typed: Vec<Option<Compiled>>,
    backends: &[Backend],
    broken_backend_files: bool,
    shower: &mut super::shown::Shower<'_>,
) -> Vec<Preference> {
    let mut preference = Vec::new();
    for (p, when) in pack.preference.iter().zip(typed) {
        let loc = l.at(pack_file, p);
        let def = &p.value;
        let mut order = Vec::new();
        for name in &def.order {
            match backends.iter().position(|b| b.name == name.value) {
                Some(i) if !order.contains(&(i as u16)) => order.push(i as u16),
                Some(_) => {
                    let at = l.at(pack_file, name);
                    l.diags.push(
                        Diagnostic::new(
                            Code::Pref,
                            format!("`{}` appears twice in this order", name.value),
                        )
                        .at(at),
                    );
                }
                // A backend whose file failed to load already has its own error.
                None if broken_backend_files => {}
                None => {
                    let at = l.at(pack_file, name);
                    l.unknown(
                        Code::Name,
                        format!(
                            "unknown backend `{}` in preference `{}`",
                            name.value, def.id.value
                        ),
                        at,
                        &name.value,
                        backends.iter().map(|b| b.name.as_str()),
                    );
                }
            }
        }
        preference.push(Preference {
            id: def.id.value.clone(),
            when_src: def.when.as_ref().map(|w| w.value.trim().to_string()),
            when_shown: def.when.as_ref().map(|w| shower.show(&w.value)),
            when,
            order,
            refs: def.refs.clone(),
            loc,
        });
    }
    if preference.is_empty() {
        l.diags.push(
            Diagnostic::new(Code::Pref, "a pack needs at least one preference entry").at(Loc {
                file: pack_file,
                start: 0,
                end: 0,
            }),
        );
    }
    preference
}

/// The executor chains of `executors:`, names checked against the catalogue when one is given.
fn link_executors(
    l: &mut Loader,
    defs: &[Spanned<ExecutorsDef>],
    pack_file: u16,
    backends: &[Backend],
    catalogue: Option<&ExecutorCatalogue>,
    admits: &[(String, Compiled)],
) -> Vec<ExecutorChain> {
    let mut chains: Vec<ExecutorChain> = Vec::new();
    for d in defs {
        let loc = l.at(pack_file, d);
        let def = &d.value;
        let Some(b) = backends.iter().position(|b| b.name == def.backend.value) else {
            let at = l.at(pack_file, &def.backend);
            l.unknown(
                Code::Executor,
                format!("executors: unknown backend `{}`", def.backend.value),
                at,
                &def.backend.value,
                backends.iter().map(|b| b.name.as_str()),
            );
            continue;
        };
        let backend = &backends[b];
        let variant = match &def.variant {
            None => None,
            Some(v) => match backend.variants.iter().position(|x| x.name == v.value) {
                Some(i) => Some(i as u8),
                None => {
                    let at = l.at(pack_file, v);
                    l.unknown(
                        Code::Executor,
                        format!(
                            "executors: backend `{}` has no variant `{}`",
                            backend.name, v.value
                        ),
                        at,
                        &v.value,
                        backend.variants.iter().map(|x| x.name.as_str()),
                    );
                    continue;
                }
            },
        };
        if chains
            .iter()
            .any(|c| c.backend == b as u16 && c.variant == variant)
        {
            l.diags.push(
                Diagnostic::new(
                    Code::Executor,
                    format!(
                        "executors: `{}`{} has two chains",
                        backend.name,
                        def.variant
                            .as_ref()
                            .map(|v| format!(" variant `{}`", v.value))
                            .unwrap_or_default()
                    ),
                )
                .at(loc),
            );
            continue;
        }
        let mut entries: Vec<ChainEntry> = Vec::new();
        for name in &def.chain {
            let at = l.at(pack_file, name);
            if entries.iter().any(|e| e.executor == name.value) {
                l.diags.push(
                    Diagnostic::new(
                        Code::Executor,
                        format!("executor `{}` appears twice in this chain", name.value),
                    )
                    .at(at),
                );
                continue;
            }
            if let Some(cat) = catalogue
                && cat.get(&name.value).is_none()
            {
                l.unknown(
                    Code::Executor,
                    format!(
                        "unknown executor `{}`; the catalogue has: {}",
                        name.value,
                        cat.names().collect::<Vec<_>>().join(", ")
                    ),
                    at,
                    &name.value,
                    cat.names(),
                );
                continue;
            }
            entries.push(ChainEntry {
                executor: name.value.clone(),
                admits: admits.iter().position(|(n, _)| *n == name.value),
                if_admitted: false,
                loc: at,
            });
        }
        for name in &def.if_admitted {
            let at = l.at(pack_file, name);
            let Some(e) = entries.iter_mut().find(|e| e.executor == name.value) else {
                l.unknown(
                    Code::Executor,
                    format!(
                        "if_admitted: `{}` is not an entry of this chain ({})",
                        name.value,
                        def.chain
                            .iter()
                            .map(|c| c.value.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    at,
                    &name.value,
                    def.chain.iter().map(|c| c.value.as_str()),
                );
                continue;
            };
            // Without a catalogue nothing runs executors, so there is nothing to check against;
            // with one, the entry's condition must exist or the entry would be kept everywhere.
            if catalogue.is_some() && e.admits.is_none() {
                l.diags.push(
                    Diagnostic::new(
                        Code::Executor,
                        format!(
                            "if_admitted: executor `{}` states no `admits` condition for this \
                             pack's family, so where it is admitted cannot be known",
                            name.value
                        ),
                    )
                    .at(at),
                );
                continue;
            }
            e.if_admitted = true;
        }
        chains.push(ExecutorChain {
            backend: b as u16,
            variant,
            entries,
            loc,
        });
    }
    chains
}

// ---- stage 5: lint ---------------------------------------------------------------------------

/// Stage 5: warnings that need no analysis.
fn lint_pack(l: &mut Loader, parsed: &ParsedPack) {
    for r in &parsed.rules {
        let def = &r.def.value;
        if def.reason.trim().is_empty() {
            let at = l.at(r.file, &def.id);
            l.diags.push(
                Diagnostic::new(
                    Code::Reason,
                    format!("rule `{}` has an empty reason", def.id.value),
                )
                .at(at),
            );
        }
    }
}
