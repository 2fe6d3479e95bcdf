//! The YAML shapes of pack files (serde-saphyr keeps each node's position; see
//! docs/rule-language.md for the format). Kept to plain structs: spans inside
//! `flatten`/`untagged` would be lost.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_saphyr::Spanned;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackFile {
    pub name: Spanned<String>,
    /// The pack family whose facts the rules read (`te` when absent).
    #[serde(default)]
    pub family: Option<Spanned<String>>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub defs: BTreeMap<String, Spanned<String>>,
    /// Definitions that explanations show by name, each with what it means (listed by
    /// `attn-policy facts` and docs/definitions.md). Every other definition is shown as the
    /// condition it stands for.
    #[serde(default)]
    pub public_defs: BTreeMap<String, Spanned<String>>,
    pub backends: Vec<Spanned<String>>,
    #[serde(default)]
    pub layers: Vec<Spanned<LayerRef>>,
    pub preference: Vec<Spanned<PreferenceDef>>,
    /// Oldest versions the pack supports (`cudnn_version: 9.12.0`), for obsolete-workaround lints.
    #[serde(default)]
    pub min_versions: BTreeMap<String, Spanned<String>>,
    /// Per backend (and variant), the executors that run its decisions, in order of preference.
    #[serde(default)]
    pub executors: Vec<Spanned<ExecutorsDef>>,
    /// Warning codes `attn-policy check` does not count against the pack (`W-SUBSUMED`).
    #[serde(default)]
    pub allow: Vec<Spanned<String>>,
    /// The upstream release the plain pack name decides as (`te` = `te@2.20.2`); required
    /// with `releases:`.
    #[serde(default)]
    pub release: Option<Spanned<String>>,
    /// The upstream releases this pack mirrors, each addressable as `<name>@<release>`
    /// (docs/packs/releases.md). Rules, backend files and definitions take effect per release.
    #[serde(default)]
    pub releases: BTreeMap<String, Spanned<ReleaseDef>>,
}

/// `releases:` entry of pack.yaml: what differs in one upstream release beyond the rules'
/// own `releases:` bounds.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseDef {
    /// For people reading pack.yaml; accepted so `deny_unknown_fields` allows it, not used.
    #[serde(default, rename = "description")]
    pub _description: Option<String>,
    /// Input fields the release does not have: no rule of the release may read them, and an
    /// explanation says the release does not read them when the input sets them.
    #[serde(default)]
    pub ignores: Vec<Spanned<String>>,
    /// Definitions as this release has them (replace the pack's `defs:` of the same name).
    #[serde(default)]
    pub defs: BTreeMap<String, Spanned<String>>,
}

/// `executors:` entry: `{ backend: FusedAttention, chain: [cudnn, reference] }`, optionally
/// for one `variant:` (a variant's chain overrides its backend's).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutorsDef {
    pub backend: Spanned<String>,
    #[serde(default)]
    pub variant: Option<Spanned<String>>,
    pub chain: Vec<Spanned<String>>,
    /// Entries of `chain` that belong to it only where their executor's manifest admits the
    /// configuration (the catalogue's `admits` condition): elsewhere they are left out, so the
    /// next entry is the backend's own executor rather than a substitute.
    #[serde(default)]
    pub if_admitted: Vec<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerRef {
    pub file: String,
    pub layer: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreferenceDef {
    pub id: Spanned<String>,
    #[serde(default)]
    pub when: Option<Spanned<String>>,
    pub order: Vec<Spanned<String>>,
    #[serde(default)]
    pub refs: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendFile {
    pub backend: Spanned<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub supports: Vec<Spanned<String>>,
    #[serde(default)]
    pub variants: Vec<Spanned<VariantDef>>,
    #[serde(default)]
    pub rules: Vec<Spanned<RuleDef>>,
    /// The releases that have this backend (`">=2.20.2"`); absent: every release.
    #[serde(default)]
    pub releases: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariantDef {
    pub name: Spanned<String>,
    #[serde(default)]
    pub applicable: Option<Spanned<String>>,
    #[serde(default)]
    pub value: Option<Spanned<String>>,
    #[serde(default)]
    pub description: Option<String>,
}

/// A layer file (guards, site overlays): rules that each name their backend.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerFile {
    #[serde(default)]
    pub layer: Option<String>,
    /// For people reading the file; accepted so `deny_unknown_fields` allows it, not used.
    #[serde(default, rename = "description")]
    pub _description: Option<String>,
    pub rules: Vec<Spanned<RuleDef>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleDef {
    pub id: Spanned<String>,
    /// Only in layer files: the backend the rule declines.
    #[serde(default)]
    pub backend: Option<Spanned<String>>,
    /// Only in layer files, instead of `backend:`: several backends the rule declines alike
    /// (TE's "disable every backend" filters).
    #[serde(default)]
    pub backends: Vec<Spanned<String>>,
    pub when: Spanned<String>,
    pub reason: String,
    #[serde(default)]
    pub refs: Vec<String>,
    #[serde(default)]
    pub variants: Vec<Spanned<String>>,
    #[serde(default)]
    pub kind: Option<Spanned<String>>,
    /// Workaround rules: the condition under which the workaround is no longer needed.
    #[serde(default)]
    pub until: Option<Spanned<String>>,
    /// The upstream releases that have this rule (`">=2.19.0"`, `"<2.20.0"`,
    /// `">=2.19.0, <2.20.0"`); absent: every release of the pack.
    #[serde(default)]
    pub releases: Option<Spanned<String>>,
}
