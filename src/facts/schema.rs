//! Typed fact schemas. A [`Schema`] belongs to a *pack family*: the `te` family (TE's
//! `AttentionParams`, its environment and probes; packs `te` and `native`) has its table in
//! `te.rs`; the `torch` family (PyTorch SDPA's `sdp_params`, the process's SDPA flags and
//! the device; pack `torch`) in `torch.rs`. The families are registered in `families.rs`
//! ([`super::family`]): this file names none of them, so a family's file can build on it.
//! A pack names its family in `pack.yaml` (`family:`, default `te`), and the checker, the
//! decision and the analysis read fact names, types and domains from that pack's schema.
//! A fact's slot is its index in [`Schema::fields`]; `docs/facts.md` is generated from the
//! tables (a test keeps it current).
//!
//! The types a schema is made of live here, [`Facts`] (the values it types) and
//! [`Constraint`] (which reads facts) among them, because they name each other: reading a
//! config into facts is in `input.rs`, checking bounds and constraints in `constraint.rs`,
//! and both build on this file without it naming them back.

use std::collections::HashMap;

use serde_json::{Map, Value as Json};

use super::domains::Domain;
use super::error::InputError;
use super::key::KeyMemo;
use super::value::Value;

/// The type of a fact or expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ty {
    Bool,
    Int,
    Float,
    Version,
    Enum(Domain),
    /// A structured fact (`window_size`, `fp8_recipe`, `inference`): only `== null` / `!= null`
    /// apply to it; its members are facts of their own (`inference.page_size`).
    Object,
}

impl Ty {
    pub fn name(self) -> String {
        match self {
            Ty::Bool => "bool".into(),
            Ty::Int => "int".into(),
            Ty::Float => "float".into(),
            Ty::Version => "version".into(),
            Ty::Enum(d) => format!("enum {}", d.name()),
            Ty::Object => "object".into(),
        }
    }
}

/// Where a fact's value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A field of the input config.
    Input,
    /// Computed from other facts when the input is read (documented in `doc`).
    Derived,
    /// Known only to a live adapter; unknown (three-valued) when not supplied.
    Probe,
}

/// Default of an absent input fact.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DefaultValue {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Enum(&'static str),
    Version(&'static str),
    /// Computed (derived facts) or unknown (probes).
    Computed,
}

/// The domain of one numeric fact beyond its type. `None` accepts every value of the type.
/// What it admits: [`Bound::admits`] (`constraint.rs`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bound {
    None,
    /// `> 0`: a size, a count, a scale (for integers: `>= 1`).
    Positive,
    /// `>= 0`: a count where 0 means "absent" (documented per fact), a soft-cap.
    NonNegative,
    /// An integer `>= n` (`AtLeast(-1)`: -1 means unbounded).
    AtLeast(i64),
    /// A float in `[0, 1]` (a dropout probability).
    Probability,
}

#[derive(Clone, Copy, Debug)]
pub struct FieldDef {
    pub path: &'static str,
    pub ty: Ty,
    pub nullable: bool,
    pub default: DefaultValue,
    pub origin: Origin,
    /// The user cannot change it to make a backend eligible (the GPU): `why-not` reports it as such.
    pub fixed: bool,
    /// Values outside it are refused when the input is read (`docs/facts.md`, "domain").
    pub bound: Bound,
    /// A version fact whose upstream probe reports the raw string (package metadata): text
    /// that does not parse is kept as the third state, present but unparseable
    /// ([`Value::BadVersion`], raw text kept), instead of being refused. Rules must test
    /// `parsed(x)` before comparing such a fact (docs/rule-language.md).
    pub raw_text: bool,
    pub doc: &'static str,
}

pub(crate) const fn f(
    path: &'static str,
    ty: Ty,
    default: DefaultValue,
    doc: &'static str,
) -> FieldDef {
    FieldDef {
        path,
        ty,
        nullable: matches!(default, DefaultValue::Null),
        default,
        origin: Origin::Input,
        fixed: false,
        bound: Bound::None,
        raw_text: false,
        doc,
    }
}

/// The fact with a domain bound (checked when an input is read).
pub(crate) const fn bounded(mut d: FieldDef, bound: Bound) -> FieldDef {
    d.bound = bound;
    d
}

pub(crate) const fn fixed(mut d: FieldDef) -> FieldDef {
    d.fixed = true;
    d
}

pub(crate) const fn derived(path: &'static str, ty: Ty, doc: &'static str) -> FieldDef {
    FieldDef {
        path,
        ty,
        nullable: false,
        default: DefaultValue::Computed,
        origin: Origin::Derived,
        fixed: false,
        bound: Bound::None,
        raw_text: false,
        doc,
    }
}

/// A version fact whose probe reports the raw string: see [`FieldDef::raw_text`].
pub(crate) const fn raw_text(mut d: FieldDef) -> FieldDef {
    d.raw_text = true;
    d
}

pub(crate) const fn opt(mut d: FieldDef) -> FieldDef {
    d.nullable = true;
    d
}

pub(crate) const fn probe(path: &'static str, doc: &'static str) -> FieldDef {
    FieldDef {
        path,
        ty: Ty::Bool,
        nullable: false,
        default: DefaultValue::Computed,
        origin: Origin::Probe,
        fixed: true,
        bound: Bound::None,
        raw_text: false,
        doc,
    }
}

/// A fact that chooses the pack rather than feeding its rules (`te_version`: the installed
/// TransformerEngine release `te@auto` resolves against, docs/packs/releases.md). It is read
/// from the same config object and flags as the other facts and listed with them
/// (`attn-policy facts`), but it has no slot: no rule, decision or analysis reads it (a rule
/// that names it is an unknown fact), and a config holding it decides as one without it.
#[derive(Clone, Copy, Debug)]
pub struct SelectionFact {
    /// The config key (`te_version`).
    pub path: &'static str,
    /// Always [`Ty::Version`] today; a string (or a number such as `2.19`) in a config.
    pub ty: Ty,
    /// What it is and what it chooses (`attn-policy facts`, docs/facts.md).
    pub doc: &'static str,
}

/// Reads the family's structured config keys (`window_size`, `device_compute_capability`, ...)
/// into facts that start at their defaults. Returns `Ok(false)` for a plain scalar key, which
/// the generic reader then types against the schema.
pub(crate) type ReadKey = fn(&mut Facts, &str, &Json) -> Result<bool, InputError>;

/// Computes the family's derived facts once the input is read; `given` is the config object
/// (some derivations depend on whether a key was given at all).
pub(crate) type Derive = fn(&mut Facts, given: &Map<String, Json>);

/// Checks a config object as a whole before it is read (keys that name the same fact twice,
/// shorthands whose values the derivation will expand). `Ok` for families without such keys.
pub(crate) type CheckConfig = fn(given: &Map<String, Json>) -> Result<(), InputError>;

/// The facts of one pack family: names, types, domains, defaults, origins, and how a config
/// object of that family is read. Immutable and `'static` (families are compiled in).
pub struct Schema {
    /// Family name as packs write it (`family: te`).
    pub family: &'static str,
    /// One line: whose selector's inputs these are.
    pub about: &'static str,
    /// Every fact; index = slot.
    pub fields: &'static [FieldDef],
    by_path: HashMap<&'static str, usize>,
    pub(crate) read_key: ReadKey,
    pub(crate) derive: Derive,
    /// Constraints across facts (checked after the derivations; see [`Constraint`]).
    pub constraints: &'static [Constraint],
    pub(crate) check: CheckConfig,
    /// Default of a member of a structured fact once the object is present (`inference.page_size`).
    pub(crate) member_default: fn(object: &str, member: &str) -> Value,
    /// Facts that choose the pack (see [`SelectionFact`]); no slots.
    pub selection: &'static [SelectionFact],
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Schema({})", self.family)
    }
}

impl PartialEq for Schema {
    /// Families are singletons: two schemas are the same family or different ones.
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

/// How a [`Constraint`] is enforced.
#[derive(Clone, Copy)]
pub enum Check {
    /// Refused before any rule runs: `Some(message)` when the facts break the constraint.
    Refuse(fn(&Facts) -> Option<String>),
    /// Structurally odd, but the family's selector decides such inputs itself (with a backend
    /// or an error of its own); they reach the rules, which must decline them with a reason.
    DecidedBySelector,
}

/// A constraint across facts, declared by a family (docs/facts.md lists each family's).
#[derive(Clone, Copy)]
pub struct Constraint {
    /// Stable name (`kv_heads_divide_heads`).
    pub name: &'static str,
    /// What it requires and whose rule it is, for docs.
    pub doc: &'static str,
    /// The facts it reads. An error points at the first of them the input gave (or the first).
    pub facts: &'static [&'static str],
    pub check: Check,
    /// The same constraint in the rule language (true for a valid input); a test checks that
    /// it agrees with `check`. `gaps` and `diff` search only where it holds when `searched`.
    pub expr: &'static str,
    /// Whether `gaps` and `diff` tie it (false where the decision diagrams would grow too
    /// large; a listed region may then hold inputs that break it, but its example does not).
    pub searched: bool,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Constraint({})", self.name)
    }
}

/// The facts of one attention call, one [`Value`] per slot of its family's [`Schema`]. Read by
/// [`Schema::read`] (`input.rs`), which also has its accessors.
#[derive(Clone, Debug, PartialEq)]
pub struct Facts {
    pub(crate) schema: &'static Schema,
    pub(crate) values: Vec<Value>,
    /// Raw text of version facts that did not parse, for explanations.
    pub(crate) raw_versions: Vec<(usize, String)>,
    /// The decision cache's key of these facts, taken on first use (`crate::cache`); every
    /// method that changes the facts clears it, and a clone starts without it. Code in this
    /// crate that writes `values` directly must do so before the facts meet a cache.
    pub(crate) key: KeyMemo,
}

impl Schema {
    pub(crate) fn new(
        family: &'static str,
        about: &'static str,
        fields: &'static [FieldDef],
        read_key: ReadKey,
        derive: Derive,
        member_default: fn(&str, &str) -> Value,
    ) -> Schema {
        Schema {
            family,
            about,
            fields,
            by_path: fields
                .iter()
                .enumerate()
                .map(|(i, d)| (d.path, i))
                .collect(),
            read_key,
            derive,
            constraints: &[],
            check: |_| Ok(()),
            member_default,
            selection: &[],
        }
    }

    /// The same family with facts that choose the pack (see [`SelectionFact`]).
    pub(crate) fn with_selection(mut self, selection: &'static [SelectionFact]) -> Schema {
        self.selection = selection;
        self
    }

    /// The fact that chooses the pack at `path` (`te_version`), if the family has one.
    pub fn selection_fact(&self, path: &str) -> Option<&'static SelectionFact> {
        self.selection.iter().find(|f| f.path == path)
    }

    /// The value of selection fact `path` in a config object, as text (`"2.19.0"`; a number
    /// such as `2.19` as written). `Ok(None)`: absent or null; an error for any other type.
    pub fn selection_value(&self, config: &Json, path: &str) -> Result<Option<String>, InputError> {
        match config.get(path) {
            None | Some(Json::Null) => Ok(None),
            Some(Json::String(s)) => Ok(Some(s.trim().to_string())),
            Some(Json::Number(n)) => Ok(Some(n.to_string())),
            Some(_) => Err(InputError::new(
                path,
                "expected a release version such as \"2.19.0\" (a string) or null",
            )
            .kind(super::error::InputErrorKind::Type)),
        }
    }

    /// The facts that choose the pack as a markdown table (`attn-policy facts`, docs/facts.md).
    pub fn selection_table(&self) -> String {
        let mut out = String::from("| fact | type | meaning |\n|---|---|---|\n");
        for f in self.selection {
            out.push_str(&format!(
                "| `{}` | {}? | {} |\n",
                f.path,
                f.ty.name(),
                f.doc.replace('|', "\\|")
            ));
        }
        out
    }

    /// The same family with constraints across its facts (see [`Constraint`]).
    pub(crate) fn with_constraints(mut self, constraints: &'static [Constraint]) -> Schema {
        self.constraints = constraints;
        self
    }

    /// The same family with a whole-config check run before reading (see [`CheckConfig`]).
    pub(crate) fn with_check(mut self, check: CheckConfig) -> Schema {
        self.check = check;
        self
    }

    /// Slot of a fact path.
    pub fn slot(&self, path: &str) -> Option<usize> {
        self.by_path.get(path).copied()
    }

    /// Slot of a fact path that the family's own code relies on.
    pub(crate) fn known_slot(&self, path: &str) -> usize {
        self.slot(path)
            .unwrap_or_else(|| panic!("schema `{}` lacks built-in fact {path}", self.family))
    }

    /// The definition of a slot.
    pub fn def(&self, slot: usize) -> &'static FieldDef {
        &self.fields[slot]
    }

    /// Top-level input keys (the `config` object), for did-you-mean.
    pub fn input_keys(&self) -> Vec<&'static str> {
        let mut keys: Vec<&'static str> = self
            .fields
            .iter()
            .filter(|d| d.origin == Origin::Input)
            .map(|d| d.path.split('.').next().unwrap_or(d.path))
            .collect();
        keys.push("id");
        keys.push("probe");
        keys.dedup();
        keys
    }

    /// Names usable in expressions, for did-you-mean.
    pub fn expression_names(&self) -> impl Iterator<Item = &'static str> {
        self.fields.iter().map(|d| d.path)
    }

    /// Probe facts (`probe.NAME`).
    pub fn probe_names(&self) -> impl Iterator<Item = &'static str> {
        self.fields
            .iter()
            .filter(|d| d.origin == Origin::Probe)
            .map(|d| d.path)
    }

    /// The fact catalogue as a markdown table (`attn-policy facts`, docs/facts.md).
    pub fn markdown_table(&self) -> String {
        let mut out = String::from(
            "| fact | type | domain | default | origin | meaning |\n|---|---|---|---|---|---|\n",
        );
        for d in self.fields {
            let ty = if d.nullable {
                format!("{}?", d.ty.name())
            } else {
                d.ty.name()
            };
            let default = match d.default {
                DefaultValue::Null => "null".to_string(),
                DefaultValue::Bool(b) => b.to_string(),
                DefaultValue::Int(i) => i.to_string(),
                DefaultValue::Float(x) => format!("{x:?}"),
                DefaultValue::Enum(e) => format!("`{e}`"),
                DefaultValue::Version(v) => v.to_string(),
                DefaultValue::Computed => match d.origin {
                    Origin::Probe => "unknown".to_string(),
                    _ => "computed".to_string(),
                },
            };
            let origin = match d.origin {
                Origin::Input => {
                    if d.fixed {
                        "input (fixed)"
                    } else {
                        "input"
                    }
                }
                Origin::Derived => "derived",
                Origin::Probe => "probe",
            };
            let domain = if d.raw_text {
                "unparseable text kept".to_string()
            } else {
                d.bound.text()
            };
            out.push_str(&format!(
                "| `{}` | {ty} | {domain} | {default} | {origin} | {} |\n",
                d.path,
                d.doc.replace('|', "\\|")
            ));
        }
        out
    }

    /// docs/facts.md for this family: the fact table, then the constraints across facts.
    pub fn markdown_page(&self) -> String {
        format!(
            "# Facts: the input schema\n\n\
             Generated from `src/facts/` (family `{family}`: {about}; `attn-policy facts` prints \
             the same table, and a test keeps this file current: `UPDATE_DOCS=1 cargo test --test \
             docs` rewrites it).\n\
             Input is the `config` object of conformance records (JSON or YAML). Absent keys take \
             the default shown. Nullable types end in `?`; `fixed` facts describe the machine and \
             are never proposed as changes by `why-not`. Probe facts are unknown until a live \
             adapter answers them (`--probe NAME=true`); then rules that read them are \
             three-valued.\n\n\
             ## Facts\n\n\
             `domain` is checked when an input is read, before any rule runs: a value outside it \
             is an input error (exit 2) that names the key and where it was given \
             (`file:line:col`, the flag, the preset or the environment variable). Versions must \
             parse as versions, except those whose domain says `unparseable text kept`: their \
             probe reports the raw string, so a version fact has three states, absent (null), \
             parsed, and present but unparseable (the raw text is kept and shown in \
             explanations; rules test it with `parsed(x)`, docs/rule-language.md). Numbers \
             must fit their type, and a key given twice in one object is an error.\n\n{}\n{}\
             ## Constraints across facts\n\n\
             Checked after the facts are read. `refused when read`: the framework refuses such \
             an input before its selector runs, so it is an input error here too; `decided by \
             the rules`: the selector judges such inputs itself, and the pack's rules must \
             decline them with a reason.\n\n{}",
            self.markdown_table(),
            self.selection_section(),
            self.constraints_table(),
            family = self.family,
            about = self.about,
        )
    }

    /// docs/facts.md's section on the facts that choose the pack; empty when the family has
    /// none.
    fn selection_section(&self) -> String {
        if self.selection.is_empty() {
            return String::new();
        }
        format!(
            "## Facts that choose the pack\n\n\
             Read from the same config and flags as the facts above, but no rule reads them: \
             they choose which pack decides (docs/packs/releases.md), and a config that holds \
             one decides as one without it.\n\n{}\n",
            self.selection_table()
        )
    }

    /// The family's constraints across facts as a markdown table (docs/facts.md).
    pub fn constraints_table(&self) -> String {
        let mut out =
            String::from("| constraint | facts | enforced | requires |\n|---|---|---|---|\n");
        for c in self.constraints {
            let facts: Vec<String> = c.facts.iter().map(|f| format!("`{f}`")).collect();
            let enforced = match c.check {
                Check::Refuse(_) => "refused when read",
                Check::DecidedBySelector => "decided by the rules",
            };
            out.push_str(&format!(
                "| `{}` | {} | {enforced} | {} |\n",
                c.name,
                facts.join(", "),
                c.doc.replace('|', "\\|")
            ));
        }
        out
    }
}
