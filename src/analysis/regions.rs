//! `gaps` (inputs where no backend is selected) and `diff` (inputs where two packs decide
//! differently), as compact regions with one verified example each.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::{Map, Value as Json};

use crate::eval::program::{Program, Truth};
use crate::facts::{Facts, Schema};
use crate::lang::parse_expr;
use crate::policy::Policy;
use crate::typecheck::Compiler;

use super::mdd::{Bits, Cube, FALSE, Id, Mdd, PolicyDiagrams, TRUE};
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
        Restriction::parse_for(&crate::facts::te::TE, text)
    }

    /// Compiles a condition over `schema`'s facts (a policy's: `policy.schema`).
    pub fn parse_for(schema: &'static Schema, text: &str) -> Result<Restriction, AnalysisError> {
        let ast = parse_expr(text).map_err(|e| AnalysisError::Where(e.message))?;
        let mut c = Compiler::new(schema, BTreeMap::new());
        let compiled = c.condition(&ast).map_err(|e| {
            AnalysisError::Where(match e.help {
                Some(h) => format!("{} ({h})", e.message),
                None => e.message,
            })
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

    fn truth(&self, vals: &[crate::facts::Value]) -> Truth {
        Truth::of(self.program.eval(self.cond.node, vals))
    }

    /// Whether the condition holds for a concrete input.
    pub fn holds(&self, facts: &Facts) -> bool {
        self.truth(facts.values()) == Truth::True
    }

    /// The conjunction of a region's constraints (as `gaps` / `diff` print them).
    pub fn of_constraints(c: &Map<String, Json>) -> Result<Restriction, AnalysisError> {
        let parts: Vec<String> = c
            .values()
            .filter_map(|v| v.as_str().map(|s| format!("({s})")))
            .collect();
        Restriction::parse(if parts.is_empty() {
            "true"
        } else {
            return Restriction::parse(&parts.join(" and "));
        })
    }
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

fn constraints(space: &Space, sets: &[Option<Vec<u32>>]) -> Map<String, Json> {
    let mut out = Map::new();
    for (i, s) in sets.iter().enumerate() {
        let Some(s) = s else { continue };
        let v = &space.vars[i];
        if let Some(p) = v.parent {
            // Members of an absent object carry no constraint of their own.
            if let Some(ps) = &sets[p]
                && ps
                    .iter()
                    .all(|&c| space.vars[p].classes[c as usize].value == crate::facts::Value::Null)
            {
                continue;
            }
        }
        if let Some(text) = space.render(i, s) {
            out.insert(v.path.to_string(), Json::String(text));
        }
    }
    out
}

/// One region of `gaps` output.
#[derive(Clone, Debug, Serialize)]
pub struct GapRegion {
    /// Per fact, an expression its value satisfies throughout the region.
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
    /// A cover of the gaps: their union is exactly the set of inputs where nothing is
    /// selected (regions may overlap), largest first.
    pub regions: Vec<GapRegion>,
    /// More regions exist than `--max-regions` allowed to list.
    pub regions_truncated: bool,
    /// Atom evaluations at class representatives (each condition's own classes).
    pub classes_examined: u64,
    /// Decision-diagram nodes built (the work beyond evaluations).
    pub diagram_nodes: u64,
    /// Size of the full cross product of classes (what naive enumeration would visit).
    pub class_product: f64,
    pub facts_enumerated: usize,
    /// The answer is exact: the node budget held and every evaluation was definite.
    pub complete: bool,
    /// Cubes of the cover for which the bounded example search found no input: not listed
    /// (they may be empty, see `Mdd::example`); while any exist the result is not complete.
    pub regions_unverified: usize,
    /// Some input selects nothing (exact when `complete`).
    pub gaps_exist: bool,
    pub assumptions: Vec<String>,
}

pub fn assumptions() -> Vec<String> {
    vec![
        "probe facts (probe.*) are answered \"supported\" (true)".into(),
        "unparseable version strings are not enumerated".into(),
        "integer sizes are >= 1 (token counts, shapes >= 0), dropout and softcap >= 0".into(),
    ]
}

/// The assumptions of an analysis over `schema`'s facts.
pub fn assumptions_for(schema: &Schema) -> Vec<String> {
    if schema.family != "torch" {
        return assumptions();
    }
    vec![
        "unparseable version strings are not enumerated".into(),
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
fn example_of(m: &mut Mdd, cube: &Cube) -> Option<Json> {
    m.example(cube)
        .map(|(assign, values)| m.space.example_with(&assign, &values))
}

/// Builds the diagram manager and a restriction's diagram for some packs.
fn manager<'s>(
    space: &'s Space,
    packs: &[&Policy],
    restrict: Option<&Restriction>,
    budget: u64,
) -> (Mdd<'s>, Id) {
    let mut m = Mdd::for_policies(space, packs);
    m.budget = usize::try_from(budget).unwrap_or(usize::MAX);
    let acc = restrict.map_or(TRUE, |r| {
        let rp = m.program(&r.program);
        m.condition(rp, r.cond.node)
    });
    (m, acc)
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
    if let Some(r) = restrict {
        b.root(&r.program, r.cond.node);
    }
    let space = b.build();
    let nb = policy.backends.len();
    let (mut m, acc) = manager(&space, &[policy], restrict, budget);
    let d = PolicyDiagrams::build(&mut m, policy);
    let none = match only {
        Some(b) => d.only_within(&mut m, b, acc),
        None => d.none_within(&mut m, policy, acc),
    };
    let (cubes, listed_all) = if m.exhausted {
        (Vec::new(), true)
    } else {
        m.cover(none, max_regions)
    };
    let mut unverified = 0;
    let regions: Vec<GapRegion> = cubes
        .iter()
        .filter_map(|cube| {
            let Some(example) = example_of(&mut m, cube) else {
                unverified += 1;
                return None;
            };
            let mut declined_by = BTreeMap::new();
            let mut not_applicable = BTreeMap::new();
            for bk in (0..nb).filter(|&bk| Some(bk) != only) {
                let rules: Vec<usize> = (0..policy.rules.len())
                    .filter(|&r| policy.rules[r].backend as usize == bk)
                    .collect();
                // Rules declining everywhere in the region; else those declining in part of it.
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
            Some(GapRegion {
                constraints: cube_constraints(&m, cube),
                example,
                declined_by,
                not_applicable,
            })
        })
        .collect();
    let gaps_exist = !m.exhausted && (!regions.is_empty() || !listed_all);
    let report = GapReport {
        only: only.map(|b| policy.backends[b].name.clone()),
        regions,
        regions_truncated: !listed_all,
        classes_examined: m.evaluations,
        diagram_nodes: m.size() as u64,
        class_product: space.product(),
        facts_enumerated: space.vars.len(),
        complete: !m.exhausted && m.unknown == 0 && unverified == 0,
        regions_unverified: unverified,
        // A feasible path was found (listed, or cut by --max-regions).
        gaps_exist,
        assumptions: assumptions_for(policy.schema),
    };
    (report, space)
}

#[derive(Clone, Debug, Serialize)]
pub struct DiffRegion {
    pub constraints: Map<String, Json>,
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
    /// The diagrams were built within budget with every evaluation definite.
    pub complete: bool,
    /// As for `gaps`: cubes without a found example, not listed.
    pub regions_unverified: usize,
    /// Rules (id@backend) whose condition differs between the packs, or that exist in one
    /// only: decisions can differ only where one of them fires.
    pub changed_rules: Vec<String>,
    pub assumptions: Vec<String>,
}

/// A structural fingerprint of a compiled condition, comparable across packs.
fn fp(p: &Program, c: &crate::typecheck::Compiled) -> String {
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
    let mut b = SpaceBuilder::for_schema(old.schema);
    add_policy(&mut b, old);
    add_policy(&mut b, new);
    if let Some(r) = restrict {
        b.root(&r.program, r.cond.node);
    }
    let space = b.build();
    let (ko, kn) = (rule_keys(old), rule_keys(new));
    let same_skeleton = skeleton(old) == skeleton(new);
    let so: BTreeSet<&String> = ko.iter().collect();
    let sn: BTreeSet<&String> = kn.iter().collect();
    let (mut m, mut acc) = manager(&space, &[old, new], restrict, budget);
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
    // Per rule id, where it fires in one pack and not in the other.
    let fires = |m: &mut Mdd, p: &Policy, d: &PolicyDiagrams| {
        let mut by_id: BTreeMap<String, Id> = BTreeMap::new();
        for (i, r) in p.rules.iter().enumerate() {
            let e = by_id.entry(r.id.clone()).or_insert(FALSE);
            *e = m.or(*e, d.rule[i]);
        }
        by_id
    };
    let (fo, fnew) = (fires(&mut m, old, &dold), fires(&mut m, new, &dnew));
    let mut rule_diffs: Vec<(String, Id)> = Vec::new();
    for id in fo.keys().chain(fnew.keys()).collect::<BTreeSet<_>>() {
        let (x, y) = (
            fo.get(id).copied().unwrap_or(FALSE),
            fnew.get(id).copied().unwrap_or(FALSE),
        );
        if x != y {
            let (a, b) = (m.minus(x, y), m.minus(y, x));
            let either = m.or(a, b);
            rule_diffs.push((id.clone(), either));
        }
    }
    let outcomes_old = dold.outcomes_within(&mut m, old, acc);
    let outcomes_new = dnew.outcomes_within(&mut m, new, acc);
    let name = |p: &Policy, s: Option<(u16, usize)>| {
        s.map(|(b, v)| {
            let bk = &p.backends[b as usize];
            (bk.name.clone(), bk.variants.get(v).map(|x| x.name.clone()))
        })
    };
    let mut regions = Vec::new();
    let mut listed_all = true;
    let mut unverified = 0;
    'pairs: for &(a, da) in &outcomes_old {
        for &(bn, db) in &outcomes_new {
            if m.exhausted {
                break 'pairs;
            }
            let (na, nb) = (name(old, a), name(new, bn));
            if na == nb {
                continue;
            }
            let both = m.and(da, db);
            if both == FALSE {
                continue;
            }
            let room = max_regions.saturating_sub(regions.len());
            let (cubes, all) = m.cover_disjoint(both, room);
            listed_all &= all;
            for cube in &cubes {
                // Rules differing everywhere in the region; else those differing in part of it.
                let mut rules: BTreeSet<String> = rule_diffs
                    .iter()
                    .filter(|(_, x)| m.holds_on(*x, cube))
                    .map(|(id, _)| id.clone())
                    .collect();
                if rules.is_empty() {
                    rules = rule_diffs
                        .iter()
                        .filter(|(_, x)| m.meets(*x, cube))
                        .map(|(id, _)| id.clone())
                        .collect();
                }
                for (i, eo) in old.preference.iter().enumerate() {
                    for (j, en) in new.preference.iter().enumerate() {
                        if eo.id != en.id {
                            let here = m.and(dold.first_pref[i], dnew.first_pref[j]);
                            if m.meets(here, cube) {
                                rules.insert(format!("preference:{}", eo.id));
                                rules.insert(format!("preference:{}", en.id));
                            }
                        }
                    }
                }
                let (o, ov) = na.clone().map_or((None, None), |(n, v)| (Some(n), v));
                let (n, nv) = nb.clone().map_or((None, None), |(n, v)| (Some(n), v));
                let Some(example) = example_of(&mut m, cube) else {
                    unverified += 1;
                    continue;
                };
                regions.push(DiffRegion {
                    constraints: cube_constraints(&m, cube),
                    example,
                    old: o,
                    new: n,
                    old_variant: ov,
                    new_variant: nv,
                    rules: rules.into_iter().collect(),
                });
            }
            if !all {
                break 'pairs;
            }
        }
    }
    let report = DiffReport {
        regions,
        regions_truncated: !listed_all,
        classes_examined: m.evaluations,
        diagram_nodes: m.size() as u64,
        complete: !m.exhausted && m.unknown == 0 && unverified == 0,
        regions_unverified: unverified,
        changed_rules: changed_names,
        assumptions: assumptions_for(old.schema),
    };
    (report, space)
}

/// Decides an example config with probes answered "supported" (verification helper).
pub fn decide_example(policy: &Policy, example: &Json) -> Result<Option<String>, String> {
    let facts = Facts::from_json(example).map_err(|e| e.to_string())?;
    Ok(policy
        .decide(&facts)
        .selected
        .map(|b| policy.backends[b as usize].name.clone()))
}
