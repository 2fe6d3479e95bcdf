//! `gaps` (inputs where no backend is selected) and `diff` (inputs where two packs decide
//! differently), as compact regions with one verified example each.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::{Map, Value as Json};

use attn_policy::Policy;
use attn_policy::eval::program::{Program, Truth};
use attn_policy::facts::{Facts, Schema};
use attn_policy::lang::parse_expr;
use attn_policy::typecheck::Compiler;

use super::mdd::{Bits, Cube, FALSE, Id, Mdd, PolicyDiagrams, TRUE, cube_within};
use super::search::Cond;
use super::space::{Space, SpaceBuilder, mask_of};

/// Node budget of one search or diagram manager (a safety net; the te pack needs far fewer).
pub const DEFAULT_BUDGET: u64 = 50_000_000;

/// How many regions `gaps` lists by default.
pub const DEFAULT_MAX_REGIONS: usize = 10;

/// An error in the analysis inputs (a `--where` expression that does not compile).
#[derive(Debug, thiserror::Error)]
pub enum AnalysisError {
    #[error("--where: {0}")]
    Where(String),
}

/// A restriction of the searched space (`--where EXPR`), compiled in its own program.
pub struct Restriction {
    pub program: Program,
    pub cond: Cond,
    pub source: String,
}

impl Restriction {
    /// Compiles a condition over the te family's facts (pack definitions are not available).
    pub fn parse(text: &str) -> Result<Restriction, AnalysisError> {
        Restriction::parse_for(&attn_policy::facts::te::TE, text)
    }

    /// Compiles a condition over `schema`'s facts (a policy's: `policy.schema`).
    pub fn parse_for(schema: &'static Schema, text: &str) -> Result<Restriction, AnalysisError> {
        let ast = parse_expr(text)
            .map_err(|e| AnalysisError::Where(with_caret(text, e.span, &e.message)))?;
        // A restriction states a set of inputs, not a rule: comparing a version that may be
        // unparseable is false for it, and needs no `parsed(x)` guard.
        let mut c = Compiler::new(schema, BTreeMap::new()).without_version_guards();
        let compiled = c.condition(&ast).map_err(|e| {
            let message = match e.help {
                Some(h) => format!("{} ({h})", e.message),
                None => e.message,
            };
            AnalysisError::Where(with_caret(text, e.span, &message))
        })?;
        Ok(Restriction {
            cond: Cond {
                node: compiled.node,
                mask: mask_of(&compiled.slots),
            },
            program: c.program,
            source: text.to_string(),
        })
    }

    fn truth(&self, vals: &[attn_policy::facts::Value]) -> Truth {
        Truth::of(self.program.eval(self.cond.node, vals))
    }

    /// Whether the condition holds for a concrete input.
    pub fn holds(&self, facts: &Facts) -> bool {
        self.truth(facts.values()) == Truth::True
    }

    /// The conjunction of a region's constraints (as `gaps` / `diff` print them) over the te
    /// family's facts.
    pub fn of_constraints(c: &Map<String, Json>) -> Result<Restriction, AnalysisError> {
        Restriction::of_constraints_for(&attn_policy::facts::te::TE, c)
    }

    /// [`Restriction::of_constraints`] over `schema`'s facts.
    pub fn of_constraints_for(
        schema: &'static Schema,
        c: &Map<String, Json>,
    ) -> Result<Restriction, AnalysisError> {
        let parts: Vec<String> = c
            .values()
            .filter_map(|v| v.as_str().map(|s| format!("({s})")))
            .collect();
        if parts.is_empty() {
            return Restriction::parse_for(schema, "true");
        }
        Restriction::parse_for(schema, &parts.join(" and "))
    }
}

/// A message with the expression and a caret under the span it is about.
fn with_caret(text: &str, span: attn_policy::lang::Span, message: &str) -> String {
    let col = |byte: usize| {
        text.get(..byte.min(text.len()))
            .map_or(0, |s| s.chars().count())
    };
    let (start, end) = (col(span.start), col(span.end.max(span.start)));
    format!(
        "{message}\n  {text}\n  {}{}",
        " ".repeat(start),
        "^".repeat((end - start).max(1))
    )
}

/// Adds every condition of a policy to a space builder.
pub fn add_policy(b: &mut SpaceBuilder, p: &Policy) {
    for r in &p.rules {
        b.root(&p.program, r.when.node);
    }

    for bk in &p.backends {
        for v in &bk.variants {
            if let Some(c) = &v.applicable {
                b.root(&p.program, c.node);
            }
        }
    }
    for pr in &p.preference {
        if let Some(c) = &pr.when {
            b.root(&p.program, c.node);
        }
    }
}

/// Per variable, the classes no valid input falls in: the fact's bound (docs/facts.md) or a
/// searched constraint that reads this fact alone (`sm` in the compute capabilities) excludes
/// every member. A region's constraint may include them freely (it describes the same inputs),
/// so a fact that ranges over all its valid classes needs no constraint.
fn dont_cares(space: &Space) -> Vec<Vec<u32>> {
    let schema = space.schema;
    let single: Vec<Restriction> = schema
        .constraints
        .iter()
        .filter(|c| c.searched && matches!(c.check, attn_policy::facts::Check::Refuse(_)))
        .filter_map(|c| Restriction::parse_for(schema, c.expr).ok())
        .filter(|r| r.cond.mask.count_ones() == 1)
        .collect();
    let base = schema.defaults();
    space
        .vars
        .iter()
        .map(|v| {
            let bit = super::space::slot_bit(v.slot);
            (0..v.classes.len() as u32)
                .filter(|&c| {
                    let value = v.classes[c as usize].value;
                    if !schema.def(v.slot).bound.admits(value) {
                        return true;
                    }
                    let mut vals = base.values().to_vec();
                    vals[v.slot] = value;
                    single
                        .iter()
                        .filter(|r| r.cond.mask == bit)
                        .any(|r| Truth::of(r.program.eval(r.cond.node, &vals)) == Truth::False)
                })
                .collect()
        })
        .collect()
}

fn constraints(space: &Space, sets: &[Option<Vec<u32>>]) -> Map<String, Json> {
    let mut out = Map::new();
    let dont_care = dont_cares(space);
    for (i, s) in sets.iter().enumerate() {
        let Some(s) = s else { continue };
        // With classes no valid input is in, the same region may be said more simply: fill the
        // holes between its classes and extend its ends with such classes (`sm <= 79` rather
        // than every compute capability below 80).
        let dc = &dont_care[i];
        let n = space.vars[i].classes.len() as u32;
        if s.iter()
            .chain(dc)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            >= n as usize
        {
            continue;
        }
        let (lo, hi) = (s.iter().min().copied(), s.iter().max().copied());
        let mut wide: Vec<u32> = s.clone();
        if let (Some(lo), Some(hi)) = (lo, hi) {
            wide.extend(dc.iter().filter(|&&c| lo < c && c < hi));
            let mut c = lo;
            while c > 0 && dc.contains(&(c - 1)) {
                c -= 1;
                wide.push(c);
            }
            let mut c = hi;
            while c + 1 < n && dc.contains(&(c + 1)) {
                c += 1;
                wide.push(c);
            }
        }
        wide.sort_unstable();
        wide.dedup();
        let v = &space.vars[i];
        if let Some(p) = v.parent {
            // Members of an absent object carry no constraint of their own.
            if let Some(ps) = &sets[p]
                && ps.iter().all(|&c| {
                    space.vars[p].classes[c as usize].value == attn_policy::facts::Value::Null
                })
            {
                continue;
            }
        }
        let text = match (space.render(i, s), space.render(i, &wide)) {
            (Some(a), Some(b)) if b.len() < a.len() => Some(b),
            (a, _) => a,
        };
        if let Some(text) = text {
            out.insert(v.path.to_string(), Json::String(text));
        }
    }
    out
}

/// One region of `gaps` output.
#[derive(Clone, Debug, Serialize)]
pub struct GapRegion {
    /// Per fact, an expression its value satisfies throughout the region: a cube of the
    /// cover widened to every value of each fact that does not change the outcome for any
    /// valid input of the region ([`Mdd::widen_inside`]).
    pub constraints: Map<String, Json>,
    /// One configuration of the region (conformance `config` format).
    pub example: Json,
    /// Per backend, the rules that decline everywhere in (part of) the region.
    pub declined_by: BTreeMap<String, Vec<String>>,
    /// Per backend, variants that are not applicable there (e.g. a library not installed).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub not_applicable: BTreeMap<String, Vec<String>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct GapReport {
    /// `--only BACKEND`: the regions are where this backend is the only eligible one (and
    /// so selected); otherwise where no backend is selected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub only: Option<String>,
    /// A cover of the gaps: their union is exactly the set of (valid) inputs where nothing
    /// is selected (regions may overlap), largest first.
    pub regions: Vec<GapRegion>,
    /// More regions exist than `--max-regions` allowed to list.
    pub regions_truncated: bool,
    /// Atom evaluations at class representatives (each condition's own classes).
    pub classes_examined: u64,
    /// Decision-diagram nodes built (the work beyond evaluations).
    pub diagram_nodes: u64,
    /// Diagram operation steps (`Mdd::steps`): a work measure for the CI guard, not output.
    #[serde(skip)]
    pub diagram_steps: u64,
    /// Size of the full cross product of classes (what naive enumeration would visit).
    pub class_product: f64,
    pub facts_enumerated: usize,
    /// The answer is exact: the node budget held and every evaluation was definite.
    pub complete: bool,
    /// Cubes of the cover for which the bounded example search found no input: not listed
    /// (they may be empty, see `Mdd::example`); while any exist the result is not complete.
    pub regions_unverified: usize,
    /// Cubes of the cover that, widened, lay inside a region listed before them: not listed
    /// (the union of the listed regions is still exactly the gaps).
    pub regions_merged: usize,
    /// Some input selects nothing (exact when `complete`).
    pub gaps_exist: bool,
    pub assumptions: Vec<String>,
}

pub fn assumptions() -> Vec<String> {
    assumptions_for(&attn_policy::facts::te::TE)
}

/// What the analysis enumerates of version facts: the third state where the family keeps it.
fn versions_assumption(schema: &Schema) -> String {
    let raw: Vec<&str> = schema
        .fields
        .iter()
        .filter(|d| d.raw_text)
        .map(|d| d.path)
        .collect();
    if raw.is_empty() {
        "versions are parsed (a version string that does not parse is refused when read)".into()
    } else {
        format!(
            "present but unparseable is one more value of {} (other versions are parsed: a \
             string that does not parse is refused when read)",
            raw.join(", ")
        )
    }
}

/// The assumptions of an analysis over `schema`'s facts.
pub fn assumptions_for(schema: &Schema) -> Vec<String> {
    if schema.family != "torch" {
        return vec![
            "probe facts (probe.*) are answered \"supported\" (true)".into(),
            versions_assumption(schema),
            "integer sizes are >= 1 (token counts, shapes >= 0), dropout and softcap >= 0".into(),
        ];
    }
    vec![
        versions_assumption(schema),
        "head counts, head dims and ranks are >= 1, other sizes, strides and lengths >= 0, \
         a mask has at least 2 dimensions, dropout_p >= 0"
            .into(),
    ]
}

/// A cube as per-fact constraints: the facts' classes, then the relation variables (keyed
/// by the facts they relate; two on the same facts are joined with `and`).
fn cube_constraints(m: &Mdd, cube: &Cube) -> Map<String, Json> {
    let nv = m.space.vars.len();
    let sets: Vec<Option<Vec<u32>>> = cube[..nv]
        .iter()
        .map(|s| s.as_ref().map(Bits::classes))
        .collect();
    let mut out = constraints(m.space, &sets);
    for (k, set) in cube[nv..].iter().enumerate() {
        let Some(set) = set else { continue };
        let Some((key, text)) = m.rel_constraint(k, &set.classes(), cube) else {
            continue;
        };
        let text = match out.get(&key).and_then(Json::as_str) {
            Some(prev) => format!("({prev}) and ({text})"),
            None => text,
        };
        out.insert(key, Json::String(text));
    }
    out
}

/// A region's example; None when the bounded search found no input in it (the region may be
/// empty: conditions sharing facts, such as `b * h > 64` and `b * h > 40`, are not tied to
/// each other, so a cube can require both to disagree).
pub(crate) fn example_of(m: &mut Mdd, cube: &Cube) -> Option<Json> {
    let schema = m.space.schema;
    let example = m
        .example(cube)
        .map(|(assign, values)| m.space.example_with(&assign, &values))?;
    if schema.read(&example).is_ok() || schema.family != "te" {
        return Some(example);
    }
    // The search does not tie te's head counts (`kv_heads_divide_heads` is not searched):
    // move them to counts TE accepts, staying inside the region.
    let region = Restriction::of_constraints_for(schema, &cube_constraints(m, cube)).ok()?;
    head_count_candidates(&example)
        .into_iter()
        .find(|e| schema.read(e).is_ok_and(|facts| region.holds(&facts)))
}

/// A te example with its head counts moved to counts TE accepts (`num_heads %
/// num_gqa_groups == 0`): the query heads' divisors as KV heads, then multiples of the KV
/// heads as query heads, nearest first. The search does not tie the two counts, so a
/// region's or a matrix cell's example may need this before it reads.
pub(crate) fn head_count_candidates(example: &Json) -> Vec<Json> {
    let int = |k: &str, d: i64| example.get(k).and_then(Json::as_i64).unwrap_or(d);
    let (h, g) = (int("num_heads", 16), int("num_gqa_groups", 16));
    let mut pairs: Vec<(i64, i64)> = (1..=h.min(4096))
        .filter(|d| h % d == 0)
        .map(|d| (h, d))
        .collect();
    pairs.extend((1..=64).map(|k| (g.saturating_mul(k), g)));
    pairs
        .into_iter()
        .map(|(h, g)| {
            let mut e = example.clone();
            e["num_heads"] = h.into();
            e["num_gqa_groups"] = g.into();
            e
        })
        .collect()
}

/// The inputs the packs' family accepts, over the facts the packs (and `--where`) read: each
/// such fact's bound and every constraint the search ties that reads one of them
/// (docs/facts.md). `gaps` and `diff` search only there, so no region consists of inputs that
/// would be refused before any rule ran.
pub fn validity(packs: &[&Policy], restrict: Option<&Restriction>) -> Option<Restriction> {
    validity_with(packs, restrict, false)
}

/// [`validity`]; `every_constraint`: also the constraints the search does not tie (for the
/// small diagrams of a specialised pack, such as a support matrix's).
pub fn validity_with(
    packs: &[&Policy],
    restrict: Option<&Restriction>,
    every_constraint: bool,
) -> Option<Restriction> {
    let schema = packs.first()?.schema;
    // The space's variables are the input facts the conditions read (derived facts map to
    // theirs: `sm` stays `sm`, `window.left` becomes `window_size.*`).
    let mut b = SpaceBuilder::for_schema(schema);
    for p in packs {
        add_policy(&mut b, p);
    }
    if let Some(r) = restrict {
        b.root(&r.program, r.cond.node);
    }
    let space = b.build();
    let vars: std::collections::BTreeSet<&str> = space.vars.iter().map(|v| v.path).collect();
    let mut parts: Vec<String> = schema
        .fields
        .iter()
        .filter(|d| vars.contains(d.path))
        .filter_map(|d| d.bound.expr(d.path, d.nullable))
        .collect();
    for c in schema.constraints {
        if !(c.searched || every_constraint)
            || !matches!(c.check, attn_policy::facts::Check::Refuse(_))
        {
            continue;
        }
        let Ok(r) = Restriction::parse_for(schema, c.expr) else {
            continue;
        };
        let reads = (0..schema.fields.len()).any(|s| {
            r.cond.mask & super::space::slot_bit(s) != 0 && vars.contains(schema.def(s).path)
        });
        if reads {
            parts.push(format!("({})", c.expr));
        }
    }
    if parts.is_empty() {
        return None;
    }
    Some(
        Restriction::parse_for(schema, &parts.join(" and "))
            .expect("the family's constraints compile"),
    )
}

/// Builds the diagram manager, the diagram of the searched inputs (valid, within `--where`)
/// and that of the valid inputs alone.
fn manager<'s>(
    space: &'s Space,
    packs: &[&Policy],
    restrict: Option<&Restriction>,
    valid: Option<&Restriction>,
    budget: u64,
) -> (Mdd<'s>, Id, Id) {
    let mut m = Mdd::for_policies(space, packs);
    m.budget = usize::try_from(budget).unwrap_or(usize::MAX);
    let (mut acc, mut valid_id) = (TRUE, TRUE);
    for (r, is_valid) in restrict
        .into_iter()
        .map(|r| (r, false))
        .chain(valid.map(|r| (r, true)))
    {
        let rp = m.program(&r.program);
        let c = m.condition(rp, r.cond.node);
        acc = m.and(acc, c);
        if is_valid {
            valid_id = c;
        }
    }
    (m, acc, valid_id)
}

/// Finds every region of the space where no backend is selected: the diagram of "nothing
/// selected" (within `--where`), listed as a cover of at most `max_regions` regions.
pub fn gaps(
    policy: &Policy,
    restrict: Option<&Restriction>,
    budget: u64,
    max_regions: usize,
) -> (GapReport, Space) {
    gaps_only(policy, restrict, budget, max_regions, None)
}

/// [`gaps`], or with `only: Some(b)` every region where backend `b` is the only eligible
/// backend (so the pack selects it, and nothing else could serve): "only math serves: ...".
pub fn gaps_only(
    policy: &Policy,
    restrict: Option<&Restriction>,
    budget: u64,
    max_regions: usize,
    only: Option<usize>,
) -> (GapReport, Space) {
    let mut b = SpaceBuilder::for_schema(policy.schema);
    add_policy(&mut b, policy);
    let valid = validity(&[policy], restrict);
    for r in restrict.into_iter().chain(&valid) {
        b.root(&r.program, r.cond.node);
    }
    let space = b.build();
    let nb = policy.backends.len();
    let (mut m, acc, valid_id) = manager(&space, &[policy], restrict, valid.as_ref(), budget);
    let d = PolicyDiagrams::build(&mut m, policy);
    let none = match only {
        Some(b) => d.only_within(&mut m, b, acc),
        None => d.none_within(&mut m, policy, acc),
    };
    // Listed regions are widened cubes ([`Mdd::widen_inside`]); a widened region may hold
    // cubes the cover lists after it. So the cover runs in rounds over what no listed region
    // holds yet, until `max_regions` are listed or the cover is complete.
    let (mut unverified, mut merged) = (0, 0);
    let mut listed: Vec<Cube> = Vec::new();
    let mut regions: Vec<GapRegion> = Vec::new();
    let mut rest = none;
    let listed_all = loop {
        if m.exhausted {
            regions.clear();
            break true;
        }
        let room = max_regions.saturating_sub(regions.len());
        let (cubes, all) = m.cover(rest, room);
        let before = regions.len();
        for cube in &cubes {
            let Some(example) = example_of(&mut m, cube) else {
                unverified += 1;
                let c = m.cube(cube);
                rest = m.minus(rest, c);
                continue;
            };
            // Widened where `none or not valid` (inputs the family refuses do not count).
            let wide = m.widen_inside(none, valid_id, cube);
            // Inside a region listed before: it adds no gap to the union (left out, counted).
            if listed.iter().any(|l| cube_within(&wide, l)) {
                merged += 1;
                continue;
            }
            let mut declined_by = BTreeMap::new();
            let mut not_applicable = BTreeMap::new();
            for bk in (0..nb).filter(|&bk| Some(bk) != only) {
                let rules: Vec<usize> = (0..policy.rules.len())
                    .filter(|&r| policy.rules[r].backend as usize == bk)
                    .collect();
                // Rules declining everywhere in the cube; else those declining in part of it.
                let mut ids: Vec<String> = rules
                    .iter()
                    .filter(|&&r| m.holds_on(d.rule[r], cube))
                    .map(|&r| policy.rules[r].id.clone())
                    .collect();
                if ids.is_empty() {
                    ids = rules
                        .iter()
                        .filter(|&&r| m.meets(d.rule[r], cube))
                        .map(|&r| policy.rules[r].id.clone())
                        .collect();
                }
                if !ids.is_empty() {
                    declined_by.insert(policy.backends[bk].name.clone(), ids);
                }
                let na: Vec<String> = d.app[bk]
                    .iter()
                    .enumerate()
                    .filter(|&(_, &a)| !m.meets(a, cube))
                    .filter_map(|(v, _)| policy.backends[bk].variants.get(v))
                    .map(|v| v.name.clone())
                    .collect();
                if !na.is_empty() {
                    not_applicable.insert(policy.backends[bk].name.clone(), na);
                }
            }
            let c = m.cube(&wide);
            rest = m.minus(rest, c);
            regions.push(GapRegion {
                constraints: cube_constraints(&m, &wide),
                example,
                declined_by,
                not_applicable,
            });
            listed.push(wide);
        }
        // Complete, or the listing is full, or a round listed nothing new (every cube was
        // inside a listed region or unverified, and the cover was cut: another round then
        // makes progress, since each of them left `rest`).
        if all {
            break true;
        }
        if regions.len() >= max_regions || (cubes.is_empty() && regions.len() == before) {
            break false;
        }
    };
    let gaps_exist = !m.exhausted && (!regions.is_empty() || !listed_all);
    let report = GapReport {
        only: only.map(|b| policy.backends[b].name.clone()),
        regions,
        regions_truncated: !listed_all,
        classes_examined: m.evaluations,
        diagram_nodes: m.size() as u64,
        diagram_steps: m.steps,
        class_product: space.product(),
        facts_enumerated: space.vars.len(),
        complete: !m.exhausted && m.unknown == 0 && unverified == 0,
        regions_unverified: unverified,
        regions_merged: merged,
        // A feasible path was found (listed, or cut by --max-regions).
        gaps_exist,
        assumptions: assumptions_for(policy.schema),
    };
    (report, space)
}

#[derive(Clone, Debug, Serialize)]
pub struct DiffRegion {
    /// Per fact, an expression its value satisfies throughout the region: a cube of the
    /// disjoint cover (no two regions' `constraints` share an input).
    pub constraints: Map<String, Json>,
    /// `constraints` without the facts whose value does not change the decisions there: the
    /// cube widened to every value of such a fact as long as every valid input of it is
    /// decided `old` -> `new` ([`Mdd::widen_inside`]). What the text prints; widened regions
    /// may overlap each other (the same pair of outcomes on both).
    pub widened: Map<String, Json>,
    pub example: Json,
    /// The backend the old pack selects (TE's name; null: none).
    pub old: Option<String>,
    pub new: Option<String>,
    /// The variant (sub-backend: flash version, fused sub-backend) each pack runs, when the
    /// backend has variants.
    pub old_variant: Option<String>,
    pub new_variant: Option<String>,
    /// Rules that fire in one pack and not in the other there (and changed preference entries).
    pub rules: Vec<String>,
    /// What changed for the inputs of the region: `gained` (a backend serves them that did
    /// not), `lost` (none serves them now), `switched` (both serve, another backend or variant
    /// is chosen).
    pub kind: ChangeKind,
    /// The rule ids of `rules` responsible on the old side: they fire in the old pack and not
    /// in the new one there (and the old pack's preference entries of `rules`).
    pub old_rules: Vec<String>,
    /// The rule ids of `rules` that fire in the new pack and not in the old one there.
    pub new_rules: Vec<String>,
    /// With `--corpus`: how many of the corpus's configurations fall in this region (each
    /// configuration the packs decide differently falls in exactly one listed region, or in
    /// none when the listing was cut).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub corpus_count: Option<u64>,
    /// With `--corpus`: the id of the corpus's first configuration in this region.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub corpus_example_id: Option<String>,
}

/// How a region's decision changed from the old pack to the new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    /// The old pack selects no backend, the new one selects one.
    Gained,
    /// The old pack selects a backend, the new one none.
    Lost,
    /// Both select one, and they differ (backend or variant).
    Switched,
}

impl ChangeKind {
    fn of(old: Option<&str>, new: Option<&str>) -> ChangeKind {
        match (old, new) {
            (None, _) => ChangeKind::Gained,
            (_, None) => ChangeKind::Lost,
            _ => ChangeKind::Switched,
        }
    }

    /// `gained`, `lost` or `switched`, as in the JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Gained => "gained",
            ChangeKind::Lost => "lost",
            ChangeKind::Switched => "switched",
        }
    }
}

/// One configuration of a corpus as each pack reads it (`diff --corpus`).
#[derive(Clone, Debug)]
pub struct CorpusConfig {
    /// The record's id.
    pub id: String,
    /// The configuration read for the old pack.
    pub old: Facts,
    /// The configuration read for the new pack.
    pub new: Facts,
    /// The record's configuration as given (a region's example when its search finds none).
    pub config: Json,
}

/// What `diff --corpus` found in the corpus as a whole.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CorpusSummary {
    /// Configurations read (input errors excluded).
    pub configurations: u64,
    /// Records that are not a valid configuration (structurally invalid: refused as input
    /// errors by a pack), excluded from every count (filled by the caller that read them).
    pub input_errors: u64,
    /// Of those, how many the two packs decide differently.
    pub decided_differently: u64,
    /// Of those, how many fall in no listed region (the listing was cut: raise --max-regions).
    pub outside_listed_regions: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct DiffReport {
    /// A disjoint cover of the inputs decided differently (at most `--max-regions`).
    pub regions: Vec<DiffRegion>,
    /// More regions exist than `--max-regions` allowed to list.
    pub regions_truncated: bool,
    /// Atom evaluations at class representatives (as for `gaps`).
    pub classes_examined: u64,
    /// Decision-diagram nodes built.
    pub diagram_nodes: u64,
    /// As for `gaps` (not output).
    #[serde(skip)]
    pub diagram_steps: u64,
    /// The diagrams were built within budget with every evaluation definite.
    pub complete: bool,
    /// As for `gaps`: cubes without a found example, not listed.
    pub regions_unverified: usize,
    /// Rules (id@backend) whose condition differs between the packs, or that exist in one
    /// only: decisions can differ only where one of them fires.
    pub changed_rules: Vec<String>,
    pub assumptions: Vec<String>,
    /// With `--corpus`: the corpus as a whole (regions are then sorted by `corpus_count`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub corpus: Option<CorpusSummary>,
}

/// A structural fingerprint of a compiled condition, comparable across packs.
fn fp(p: &Program, c: &attn_policy::typecheck::Compiled) -> String {
    p.fingerprint(c.node, false)
}

/// Everything of a pack except its rules, as a comparable string.
fn skeleton(p: &Policy) -> String {
    let mut s = String::new();
    for b in &p.backends {
        s.push_str(&b.name);
        for v in &b.variants {
            s.push_str(&format!(
                "|{}:{}",
                v.name,
                v.applicable
                    .as_ref()
                    .map(|a| fp(&p.program, a))
                    .unwrap_or_default()
            ));
        }
        s.push(';');
    }
    for e in &p.preference {
        let order: Vec<&str> = e
            .order
            .iter()
            .map(|&b| p.backends[b as usize].name.as_str())
            .collect();
        s.push_str(&format!(
            "{}:{}:{:?};",
            e.id,
            e.when
                .as_ref()
                .map(|a| fp(&p.program, a))
                .unwrap_or_default(),
            order
        ));
    }
    s
}

fn rule_keys(p: &Policy) -> Vec<String> {
    p.rules
        .iter()
        .map(|r| {
            format!(
                "{}@{}|{}|{:?}|{}",
                r.id,
                p.backends[r.backend as usize].name,
                fp(&p.program, &r.when),
                r.variant_names,
                p.layer_enabled(r.layer)
            )
        })
        .collect()
}

/// Every region where `old` and `new` select a different backend or a different variant:
/// per pack, the diagram of each outcome, and a disjoint cover of every pair of differing
/// outcomes that meet.
///
/// When both packs have the same backends, variants and preference (compared structurally),
/// decisions can differ only where a rule that differs between them fires; the outcomes are
/// then built only there, which keeps `diff` of two versions of a large pack small.
pub fn diff(
    old: &Policy,
    new: &Policy,
    restrict: Option<&Restriction>,
    budget: u64,
    max_regions: usize,
) -> (DiffReport, Space) {
    diff_over_corpus(old, new, restrict, budget, max_regions, None)
}

/// [`diff`], and with a corpus, each listed region's `corpus_count` and `corpus_example_id`,
/// regions sorted by count (most first; ties keep their order).
pub fn diff_over_corpus(
    old: &Policy,
    new: &Policy,
    restrict: Option<&Restriction>,
    budget: u64,
    max_regions: usize,
    corpus: Option<&[CorpusConfig]>,
) -> (DiffReport, Space) {
    let mut b = SpaceBuilder::for_schema(old.schema);
    add_policy(&mut b, old);
    add_policy(&mut b, new);
    let valid = validity(&[old, new], restrict);
    for r in restrict.into_iter().chain(&valid) {
        b.root(&r.program, r.cond.node);
    }
    let space = b.build();
    let (ko, kn) = (rule_keys(old), rule_keys(new));
    let same_skeleton = skeleton(old) == skeleton(new);
    let so: BTreeSet<&String> = ko.iter().collect();
    let sn: BTreeSet<&String> = kn.iter().collect();
    let (mut m, mut acc, valid_id) = manager(&space, &[old, new], restrict, valid.as_ref(), budget);
    let dold = PolicyDiagrams::build(&mut m, old);
    let dnew = PolicyDiagrams::build(&mut m, new);
    // Rules present in one pack only (or changed).
    let mut changed: Vec<Id> = Vec::new();
    let mut changed_names: Vec<String> = Vec::new();
    for (p, d, keys, other) in [(old, &dold, &ko, &sn), (new, &dnew, &kn, &so)] {
        for (i, k) in keys.iter().enumerate() {
            if !other.contains(k) {
                let r = &p.rules[i];
                changed_names.push(format!("{}@{}", r.id, p.backends[r.backend as usize].name));
                changed.push(d.rule[i]);
            }
        }
    }
    changed_names.sort();
    changed_names.dedup();
    if same_skeleton {
        let any = m.any(changed);
        acc = m.and(acc, any);
    }
    let (rule_diffs, side_diffs) = firing_differences(&mut m, (old, &dold), (new, &dnew));
    let outcomes_old = dold.outcomes_within(&mut m, old, acc);
    let outcomes_new = dnew.outcomes_within(&mut m, new, acc);
    let mut regions = Vec::new();
    let mut cubes_listed: Vec<Cube> = Vec::new();
    let mut listed_all = true;
    let mut unverified = 0;
    let pairs = differing_pairs((old, &outcomes_old), (new, &outcomes_new));
    let mut meet: Vec<Option<Id>> = vec![None; pairs.len()];
    // With a corpus: regions grown from it, most-hit first, then the rest. Without one: each
    // pair covered in turn.
    let placed = corpus.map(|c| {
        for (i, p) in pairs.iter().enumerate() {
            meet[i] = Some(m.and(p.2, p.3));
        }
        let with: Vec<(NamedOutcome, NamedOutcome, Id)> = (pairs.iter().zip(&meet))
            .map(|(p, both)| (p.0.clone(), p.1.clone(), both.unwrap_or(FALSE)))
            .collect();
        corpus_cubes(&mut m, (old, new), &with, c, (valid_id, max_regions))
    });
    let batches: Vec<(usize, Option<Cube>, Option<Json>)> = match &placed {
        Some(p) => (p.cubes.iter())
            .map(|(i, c, _, id)| {
                let config = id
                    .as_ref()
                    .and_then(|id| corpus?.iter().find(|x| &x.id == id));
                (*i, Some(c.clone()), config.map(|x| x.config.clone()))
            })
            .collect(),
        None => (0..pairs.len()).map(|i| (i, None, None)).collect(),
    };
    if let Some(p) = &placed {
        listed_all = p.listed_all;
    }
    for (pair, seed, seed_example) in batches {
        if m.exhausted {
            break;
        }
        let (na, nb, da, db) = pairs[pair].clone();
        let both = *meet[pair].get_or_insert_with(|| m.and(da, db));
        if both == FALSE {
            continue;
        }
        {
            let room = max_regions.saturating_sub(regions.len());
            let (cubes, all) = match seed {
                Some(cube) => (vec![cube], true),
                None => m.cover_disjoint(both, room),
            };
            listed_all &= all;
            for cube in &cubes {
                let [rules, old_rules, new_rules] = region_rules(
                    &mut m,
                    (&rule_diffs, &side_diffs),
                    (old, new),
                    (&dold, &dnew),
                    cube,
                );
                let (o, ov) = na.clone().map_or((None, None), |(n, v)| (Some(n), v));
                let (n, nv) = nb.clone().map_or((None, None), |(n, v)| (Some(n), v));
                // A region grown from a corpus configuration has that one as its example when
                // the search finds none (it is in the region, decided old -> new).
                let Some(example) = example_of(&mut m, cube).or_else(|| seed_example.clone())
                else {
                    unverified += 1;
                    continue;
                };
                let wide = m.widen_inside(both, valid_id, cube);
                let kind = ChangeKind::of(o.as_deref(), n.as_deref());
                regions.push(DiffRegion {
                    constraints: cube_constraints(&m, cube),
                    widened: cube_constraints(&m, &wide),
                    example,
                    old: o,
                    new: n,
                    old_variant: ov,
                    new_variant: nv,
                    rules: rules.into_iter().collect(),
                    kind,
                    old_rules: old_rules.into_iter().collect(),
                    new_rules: new_rules.into_iter().collect(),
                    corpus_count: None,
                    corpus_example_id: None,
                });
                cubes_listed.push(cube.clone());
            }
            if !all {
                break;
            }
        }
    }
    let corpus = placed.map(|p| attach_counts(&mut regions, &cubes_listed, p));
    let report = DiffReport {
        regions,
        regions_truncated: !listed_all,
        classes_examined: m.evaluations,
        diagram_nodes: m.size() as u64,
        diagram_steps: m.steps,
        complete: !m.exhausted && m.unknown == 0 && unverified == 0,
        regions_unverified: unverified,
        changed_rules: changed_names,
        assumptions: assumptions_for(old.schema),
        corpus,
    };
    (report, space)
}

/// An outcome (backend and variant index; None: none selected) and where the pack has it.
type Outcome = (Option<(u16, usize)>, Id);

/// Every pair of outcomes with different names: (old name, new name, old's diagram, new's);
/// their intersection is built when first needed (a listing cut short builds no more).
fn differing_pairs(
    (old, outcomes_old): (&Policy, &[Outcome]),
    (new, outcomes_new): (&Policy, &[Outcome]),
) -> Vec<(NamedOutcome, NamedOutcome, Id, Id)> {
    let name = |p: &Policy, s: Option<(u16, usize)>| {
        s.map(|(b, v)| {
            let bk = &p.backends[b as usize];
            (bk.name.clone(), bk.variants.get(v).map(|x| x.name.clone()))
        })
    };
    let mut pairs = Vec::new();
    for &(a, da) in outcomes_old {
        for &(bn, db) in outcomes_new {
            let (na, nb) = (name(old, a), name(new, bn));
            if na != nb {
                pairs.push((na, nb, da, db));
            }
        }
    }
    pairs
}

/// Per rule id, where it fires in one pack and not in the other.
type RuleDiff = (String, Id);
/// Per rule id, where it fires in the old pack only, and in the new pack only.
type SideDiff = (String, Id, Id);

/// The rule ids whose firing differs between the packs: where (either side), and per side.
fn firing_differences(
    m: &mut Mdd,
    (old, dold): (&Policy, &PolicyDiagrams),
    (new, dnew): (&Policy, &PolicyDiagrams),
) -> (Vec<RuleDiff>, Vec<SideDiff>) {
    let fires = |m: &mut Mdd, p: &Policy, d: &PolicyDiagrams| {
        let mut by_id: BTreeMap<String, Id> = BTreeMap::new();
        for (i, r) in p.rules.iter().enumerate() {
            let e = by_id.entry(r.id.clone()).or_insert(FALSE);
            *e = m.or(*e, d.rule[i]);
        }
        by_id
    };
    let (fo, fnew) = (fires(m, old, dold), fires(m, new, dnew));
    let (mut either, mut sides) = (Vec::new(), Vec::new());
    for id in fo.keys().chain(fnew.keys()).collect::<BTreeSet<_>>() {
        let (x, y) = (
            fo.get(id).copied().unwrap_or(FALSE),
            fnew.get(id).copied().unwrap_or(FALSE),
        );
        if x != y {
            let (a, b) = (m.minus(x, y), m.minus(y, x));
            let or = m.or(a, b);
            either.push((id.clone(), or));
            sides.push((id.clone(), a, b));
        }
    }
    (either, sides)
}

/// The rules responsible for a region: `[all, old side, new side]`. All: the rule ids whose
/// firing differs everywhere in the region (else somewhere in it), and `preference:<id>` where
/// the packs apply different preference entries; a side: those of them that fire there in that
/// pack only (its preference entry).
fn region_rules(
    m: &mut Mdd,
    (rule_diffs, side_diffs): (&[RuleDiff], &[SideDiff]),
    (old, new): (&Policy, &Policy),
    (dold, dnew): (&PolicyDiagrams, &PolicyDiagrams),
    cube: &Cube,
) -> [BTreeSet<String>; 3] {
    let ids = |m: &Mdd, everywhere: bool| -> BTreeSet<String> {
        rule_diffs
            .iter()
            .filter(|(_, x)| {
                if everywhere {
                    m.holds_on(*x, cube)
                } else {
                    m.meets(*x, cube)
                }
            })
            .map(|(id, _)| id.clone())
            .collect()
    };
    let mut rules = ids(m, true);
    if rules.is_empty() {
        rules = ids(m, false);
    }
    let (mut old_rules, mut new_rules) = (BTreeSet::new(), BTreeSet::new());
    for (id, a, b) in side_diffs {
        if rules.contains(id) {
            if m.meets(*a, cube) {
                old_rules.insert(id.clone());
            }
            if m.meets(*b, cube) {
                new_rules.insert(id.clone());
            }
        }
    }
    for (i, eo) in old.preference.iter().enumerate() {
        for (j, en) in new.preference.iter().enumerate() {
            if eo.id != en.id {
                let here = m.and(dold.first_pref[i], dnew.first_pref[j]);
                if m.meets(here, cube) {
                    rules.insert(format!("preference:{}", eo.id));
                    rules.insert(format!("preference:{}", en.id));
                    old_rules.insert(format!("preference:{}", eo.id));
                    new_rules.insert(format!("preference:{}", en.id));
                }
            }
        }
    }
    [rules, old_rules, new_rules]
}

/// Gives each listed region its count and first configuration from the placement (regions
/// are listed in the placement's order; one without an example was skipped) and returns the
/// corpus summary.
fn attach_counts(regions: &mut [DiffRegion], listed: &[Cube], placed: Placed) -> CorpusSummary {
    for (r, cube) in regions.iter_mut().zip(listed) {
        let (_, _, n, id) = placed
            .cubes
            .iter()
            .find(|(_, c, _, _)| c == cube)
            .expect("a listed cube is a placed one");
        r.corpus_count = Some(*n);
        r.corpus_example_id = id.clone();
    }
    let counted: u64 = regions.iter().filter_map(|r| r.corpus_count).sum();
    CorpusSummary {
        outside_listed_regions: placed.summary.decided_differently - counted,
        ..placed.summary
    }
}

/// How many regions `diff --corpus` grows from the corpus's configurations before it sorts
/// them and keeps `--max-regions` (configurations past it count as outside the listing).
const CORPUS_SEED_REGIONS: usize = 2_000;

/// The cubes `diff --corpus` lists: per cube its pair, count and first configuration's id.
struct Placed {
    cubes: Vec<(usize, Cube, u64, Option<String>)>,
    listed_all: bool,
    summary: CorpusSummary,
}

/// Regions grown from the corpus, then the rest. Each configuration the packs decide
/// differently that no region so far holds seeds one: the path of its pair's not-yet-listed
/// part that it follows, widened inside that part ([`Mdd::widen_inside`]), so regions stay
/// disjoint and each holds the configurations counted in it. The `max_regions` most-hit are
/// kept (most first; ties in corpus order); room left goes to a cover of what remains.
fn corpus_cubes(
    m: &mut Mdd,
    (old, new): (&Policy, &Policy),
    pairs: &[(NamedOutcome, NamedOutcome, Id)],
    corpus: &[CorpusConfig],
    (valid, max_regions): (Id, usize),
) -> Placed {
    let mut rest: Vec<Id> = pairs.iter().map(|p| p.2).collect();
    let mut cubes: Vec<(usize, Cube, u64, Option<String>)> = Vec::new();
    let mut summary = CorpusSummary {
        configurations: corpus.len() as u64,
        ..CorpusSummary::default()
    };
    for c in corpus {
        let (o, n) = (outcome_names(old, &c.old), outcome_names(new, &c.new));
        if o == n {
            continue;
        }
        summary.decided_differently += 1;
        let Some(i) = pairs
            .iter()
            .position(|(a, b, _)| named_eq(a, &o) && named_eq(b, &n))
        else {
            continue;
        };
        let vals = c.new.values();
        if let Some(hit) = cubes
            .iter_mut()
            .find(|(j, cube, _, _)| *j == i && m.holds_point(cube, vals))
        {
            hit.2 += 1;
            continue;
        }
        if cubes.len() >= CORPUS_SEED_REGIONS || m.exhausted {
            continue;
        }
        let Some(path) = m.point_cube(vals).and_then(|p| m.path_cube(rest[i], &p)) else {
            continue;
        };
        let cube = m.widen_inside(rest[i], valid, &path);
        let x = m.cube(&cube);
        rest[i] = m.minus(rest[i], x);
        cubes.push((i, cube, 1, Some(c.id.clone())));
    }
    cubes.sort_by_key(|c| std::cmp::Reverse(c.2));
    let mut listed_all = cubes.len() <= max_regions;
    cubes.truncate(max_regions);
    for (i, r) in rest.into_iter().enumerate() {
        if r == FALSE || m.exhausted {
            continue;
        }
        let room = max_regions.saturating_sub(cubes.len());
        let (found, all) = m.cover_disjoint(r, room);
        listed_all &= all;
        cubes.extend(found.into_iter().map(|c| (i, c, 0, None)));
    }
    Placed {
        cubes,
        listed_all,
        summary,
    }
}

/// A selected backend and variant by name (None: none selected).
type NamedOutcome = Option<(String, Option<String>)>;

/// `(backend, variant)` names as `outcome_names` gives them.
type Names = (Option<String>, Option<String>);

fn named_eq(a: &NamedOutcome, (b, v): &Names) -> bool {
    match a {
        None => b.is_none(),
        Some((an, av)) => b.as_ref() == Some(an) && av == v,
    }
}

/// The selected backend and variant names of `p` for `facts`.
fn outcome_names(p: &Policy, facts: &Facts) -> Names {
    let d = p.decide(facts);
    match d.selected {
        None => (None, None),
        Some(b) => {
            let bk = &p.backends[b as usize];
            let v = d.backends[b as usize]
                .variant
                .and_then(|v| bk.variants.get(v as usize));
            (Some(bk.name.clone()), v.map(|v| v.name.clone()))
        }
    }
}

/// Decides an example config with probes answered "supported" (verification helper).
pub fn decide_example(policy: &Policy, example: &Json) -> Result<Option<String>, String> {
    let facts = Facts::from_json(example).map_err(|e| e.to_string())?;
    Ok(policy
        .decide(&facts)
        .selected
        .map(|b| policy.backends[b as usize].name.clone()))
}
