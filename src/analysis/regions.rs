//! `gaps` (inputs where no backend is selected) and `diff` (inputs where two packs decide
//! differently), as compact regions with one verified example each.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;
use serde_json::{Map, Value as Json};

use crate::check::Compiler;
use crate::eval::program::{Program, Truth};
use crate::facts::Facts;
use crate::lang::parse_expr;
use crate::policy::Policy;

use super::engine::{Engine, Judged, PolicyConds};
use super::mdd::{Bits, Cube, FALSE, Id, Mdd, PolicyDiagrams, TRUE};
use super::search::Cond;
use super::space::{Assign, Space, SpaceBuilder, mask_of};

/// Node budget of one search or diagram manager (a safety net; the te pack needs far fewer).
pub const DEFAULT_BUDGET: u64 = 50_000_000;

/// The most unmerged result leaves `diff` holds; past it the search stops and says INCOMPLETE
/// (two unrelated packs differ almost everywhere; their leaves once exhausted memory).
const MAX_DIFF_LEAVES: usize = 100_000;

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
    /// Compiles a condition over the fact schema (pack definitions are not available).
    pub fn parse(text: &str) -> Result<Restriction, AnalysisError> {
        let ast = parse_expr(text).map_err(|e| AnalysisError::Where(e.message))?;
        let mut c = Compiler::default();
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

/// A region before rendering: a set of classes per var (`None`: any).
#[derive(Clone, Debug)]
struct Raw<P> {
    sets: Vec<Option<Vec<u32>>>,
    example: Assign,
    payload: P,
}

trait Payload: Clone {
    type Key: std::hash::Hash + Eq + Clone;
    fn key(&self) -> Self::Key;
    fn absorb(&mut self, other: &Self);
}

fn raw_sets<P>(a: &Assign, sets: &super::engine::Sets, payload: P) -> Raw<P> {
    Raw {
        sets: sets.to_vec(),
        example: a.clone(),
        payload,
    }
}

fn set_hash(v: usize, s: &Option<Vec<u32>>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (v, s).hash(&mut h);
    h.finish()
}

fn key_hash<K: std::hash::Hash>(k: &K) -> u64 {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    k.hash(&mut h);
    h.finish()
}

/// Merges regions that differ in one var only, until nothing merges. Keys are sums of
/// per-var fingerprints, so one pass costs O(regions) per var.
fn merge<P: Payload>(space: &Space, mut regions: Vec<Raw<P>>) -> Vec<Raw<P>> {
    let nv = space.vars.len();
    let hashes = |r: &Raw<P>| -> (Vec<u64>, u64) {
        let h: Vec<u64> = (0..nv).map(|v| set_hash(v, &r.sets[v])).collect();
        let t = h
            .iter()
            .fold(key_hash(&r.payload.key()), |a, x| a.wrapping_add(*x));
        (h, t)
    };
    let mut hs: Vec<(Vec<u64>, u64)> = regions.iter().map(hashes).collect();
    loop {
        let before = regions.len();
        for v in 0..nv {
            if regions.iter().all(|r| r.sets[v].is_none()) {
                continue;
            }
            let mut index: HashMap<u64, Vec<usize>> = HashMap::new();
            let mut out: Vec<Raw<P>> = Vec::with_capacity(regions.len());
            let mut out_h: Vec<(Vec<u64>, u64)> = Vec::with_capacity(regions.len());
            let mut dirty: Vec<usize> = Vec::new();
            for (r, h) in regions.into_iter().zip(hs) {
                let key = h.1.wrapping_sub(h.0[v]);
                let slot = index.get(&key).and_then(|cands| {
                    cands.iter().copied().find(|&i| {
                        let t: &Raw<P> = &out[i];
                        t.payload.key() == r.payload.key()
                            && (0..nv).all(|u| u == v || t.sets[u] == r.sets[u])
                    })
                });
                match slot {
                    Some(i) => {
                        let target = &mut out[i];
                        target.sets[v] = match (target.sets[v].take(), &r.sets[v]) {
                            (Some(mut a), Some(b)) => {
                                a.extend(b);
                                a.sort_unstable();
                                a.dedup();
                                (a.len() < space.vars[v].classes.len()).then_some(a)
                            }
                            _ => None,
                        };
                        target.payload.absorb(&r.payload);
                        dirty.push(i);
                    }
                    None => {
                        index.entry(key).or_default().push(out.len());
                        out.push(r);
                        out_h.push(h);
                    }
                }
            }
            dirty.sort_unstable();
            dirty.dedup();
            for i in dirty {
                out_h[i] = hashes(&out[i]);
            }
            regions = out;
            hs = out_h;
        }
        if regions.len() == before {
            return regions;
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

/// A region's example (null when the bounded search found no input in it).
fn example_of(m: &mut Mdd, cube: &Cube) -> Json {
    match m.example(cube) {
        Some((assign, values)) => m.space.example_with(&assign, &values),
        None => Json::Null,
    }
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
    let mut b = SpaceBuilder::new();
    add_policy(&mut b, policy);
    if let Some(r) = restrict {
        b.root(&r.program, r.cond.node);
    }
    let space = b.build();
    let nb = policy.backends.len();
    let (mut m, acc) = manager(&space, &[policy], restrict, budget);
    let d = PolicyDiagrams::build(&mut m, policy);
    let none = d.none_within(&mut m, policy, acc);
    let (cubes, listed_all) = if m.exhausted {
        (Vec::new(), true)
    } else {
        m.cover(none, max_regions)
    };
    let regions = cubes
        .iter()
        .map(|cube| {
            let mut declined_by = BTreeMap::new();
            let mut not_applicable = BTreeMap::new();
            for bk in 0..nb {
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
            GapRegion {
                constraints: cube_constraints(&m, cube),
                example: example_of(&mut m, cube),
                declined_by,
                not_applicable,
            }
        })
        .collect();
    let report = GapReport {
        regions,
        regions_truncated: !listed_all,
        classes_examined: m.evaluations,
        diagram_nodes: m.size() as u64,
        class_product: space.product(),
        facts_enumerated: space.vars.len(),
        complete: !m.exhausted && m.unknown == 0,
        gaps_exist: !m.exhausted && none != FALSE,
        assumptions: assumptions(),
    };
    (report, space)
}

#[derive(Clone, Debug)]
struct DiffPayload {
    old: Option<(u16, usize)>,
    new: Option<(u16, usize)>,
    rules: BTreeSet<String>,
}

impl Payload for DiffPayload {
    type Key = (Option<(u16, usize)>, Option<(u16, usize)>);
    fn key(&self) -> Self::Key {
        (self.old, self.new)
    }
    fn absorb(&mut self, other: &Self) {
        self.rules.extend(other.rules.iter().cloned());
    }
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
    pub regions: Vec<DiffRegion>,
    pub classes_examined: u64,
    pub search_nodes: u64,
    pub complete: bool,
    /// Rules (id@backend) whose condition differs between the packs, or that exist in one
    /// only: decisions can differ only where one of them fires.
    pub changed_rules: Vec<String>,
    pub assumptions: Vec<String>,
}

/// A structural fingerprint of a compiled condition, comparable across packs.
fn fp(p: &Program, c: &crate::check::Compiled) -> String {
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

/// Every region where `old` and `new` select a different backend or a different variant.
///
/// When both packs have the same backends, variants and preference (compared structurally),
/// decisions can differ only where a rule that differs between them fires; the search is
/// pruned everywhere else, which keeps `diff` of two versions of a large pack fast.
pub fn diff(
    old: &Policy,
    new: &Policy,
    restrict: Option<&Restriction>,
    budget: u64,
) -> (DiffReport, Space) {
    let mut b = SpaceBuilder::new();
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
    let mut eng = Engine::new(&space);
    let po = eng.program(&old.program);
    let pn = eng.program(&new.program);
    let co = eng.policy(old, po);
    let cn = eng.policy(new, pn);
    let rc = restrict.map(|r| {
        let rp = eng.program(&r.program);
        eng.cond(rp, r.cond)
    });
    // Conditions of rules present in one pack only (or changed).
    let mut changed: Vec<usize> = Vec::new();
    let mut changed_names: Vec<String> = Vec::new();
    for (p, pc, keys, other) in [(old, &co, &ko, &sn), (new, &cn, &kn, &so)] {
        for (i, k) in keys.iter().enumerate() {
            if !other.contains(k) {
                let r = &p.rules[i];
                changed_names.push(format!("{}@{}", r.id, p.backends[r.backend as usize].name));
                changed.extend(pc.rule[i]);
            }
        }
    }
    changed_names.sort();
    changed_names.dedup();
    let mut found: Vec<Raw<DiffPayload>> = Vec::new();
    let name = |p: &Policy, s: Option<(u16, usize)>| {
        s.map(|(b, v)| {
            let bk = &p.backends[b as usize];
            (bk.name.clone(), bk.variants.get(v).map(|x| x.name.clone()))
        })
    };
    let stats = eng.run(
        budget,
        &mut |t, _vals, _a| {
            if let Some(i) = rc {
                match t[i] {
                    Truth::False => return Judged::Prune,
                    Truth::Unknown => return Judged::Split(vec![i]),
                    Truth::True => {}
                }
            }
            if same_skeleton {
                if changed.iter().all(|&i| t[i] == Truth::False) {
                    return Judged::Prune;
                }
                if !changed.iter().any(|&i| t[i] == Truth::True) {
                    return Judged::Split(
                        changed
                            .iter()
                            .copied()
                            .filter(|&i| t[i] == Truth::Unknown)
                            .collect(),
                    );
                }
            }
            let mut rel = Vec::new();
            let a = co.select(old, t, &mut rel);
            let b = cn.select(new, t, &mut rel);
            let (Ok(a), Ok(b)) = (a, b) else {
                return Judged::Split(rel);
            };
            if name(old, a) == name(new, b) {
                return Judged::Prune;
            }
            let mut rules = BTreeSet::new();
            let truth_by_id = |p: &Policy, pc: &PolicyConds| -> HashMap<String, Truth> {
                let mut m: HashMap<String, Truth> = HashMap::new();
                for (i, r) in p.rules.iter().enumerate() {
                    let x = pc.rule[i].map_or(Truth::False, |c| t[c]);
                    let e = m.entry(r.id.clone()).or_insert(Truth::False);
                    if x == Truth::True || (x == Truth::Unknown && *e == Truth::False) {
                        *e = x;
                    }
                }
                m
            };
            let to = truth_by_id(old, &co);
            let tn = truth_by_id(new, &cn);
            for id in to.keys().chain(tn.keys()) {
                let x = to.get(id).copied().unwrap_or(Truth::False);
                let y = tn.get(id).copied().unwrap_or(Truth::False);
                if x != y && x != Truth::Unknown && y != Truth::Unknown {
                    rules.insert(id.clone());
                }
            }
            let applied = |pc: &PolicyConds, p: &Policy| -> Option<String> {
                for (i, c) in pc.pref.iter().enumerate() {
                    match c.map_or(Truth::True, |c| t[c]) {
                        Truth::True => return Some(p.preference[i].id.clone()),
                        Truth::False => {}
                        Truth::Unknown => return None,
                    }
                }
                None
            };
            let (pa, pb) = (applied(&co, old), applied(&cn, new));
            if pa != pb {
                rules.extend(pa.map(|x| format!("preference:{x}")));
                rules.extend(pb.map(|x| format!("preference:{x}")));
            }
            Judged::Leaf(DiffPayload {
                old: a,
                new: b,
                rules,
            })
        },
        &mut |a, sets, p| {
            found.push(raw_sets(a, sets, p));
            // Leaves are held until merged: stop (INCOMPLETE) before they exhaust memory.
            found.len() < MAX_DIFF_LEAVES
        },
    );
    let cut = found.len() >= MAX_DIFF_LEAVES;
    let merged = merge(&space, found);
    let regions = merged
        .iter()
        .map(|r| {
            let (o, ov) = name(old, r.payload.old).map_or((None, None), |(n, v)| (Some(n), v));
            let (n, nv) = name(new, r.payload.new).map_or((None, None), |(n, v)| (Some(n), v));
            DiffRegion {
                constraints: constraints(&space, &r.sets),
                example: space.example(&r.example),
                old: o,
                new: n,
                old_variant: ov,
                new_variant: nv,
                rules: r.payload.rules.iter().cloned().collect(),
            }
        })
        .collect();
    (
        DiffReport {
            regions,
            classes_examined: stats.classes,
            search_nodes: stats.nodes,
            complete: !stats.truncated && stats.stuck == 0 && !cut,
            changed_rules: changed_names,
            assumptions: assumptions(),
        },
        space,
    )
}

/// Decides an example config with probes answered "supported" (verification helper).
pub fn decide_example(policy: &Policy, example: &Json) -> Result<Option<String>, String> {
    let facts = Facts::from_json(example).map_err(|e| e.to_string())?;
    Ok(policy
        .decide(&facts)
        .selected
        .map(|b| policy.backends[b as usize].name.clone()))
}
