//! The cells of a support matrix (`attn-policy matrix`, [`crate::matrix`]): per cell, every
//! outcome the pack can reach there and the facts that decide between them, exactly.
//!
//! A cell is the set of inputs whose *pinned* facts (the row's and the column's axis facts,
//! and every fact not free: fixed or held at its default) have the cell's values; the *free*
//! facts take any value. The cell's shown outcome is the decision at the cell's config (free
//! facts at their config values, usually the defaults); the analysis says whether another
//! value of the free facts changes it, and which free facts can.
//!
//! How: the pack specialised (`specialize`) to the pinned facts that have one value in every
//! cell (they become constants and their conditions fold; a torch fact that follows another,
//! [`FOLLOWS`], becomes its source); one space for the specialised pack with every value of
//! the remaining pinned facts (the axes) split into a class of its own, so a pinned fact's
//! class holds exactly that value; the pack's diagrams (per backend variant where it is out,
//! per preference entry where it applies) restricted to each row's values once, then to each
//! cell's (cofactors: [`Mdd::restrict_all`]); the outcomes within the cell are then small
//! diagrams over the free facts. A relation variable (an ordering of two facts, a predicate on
//! several) is pinned too when every fact it reads is pinned (evaluated at their values), or
//! when its tie allows one value under the pins.
//!
//! - **Reachable outcomes.** The outcome at the cell's defaults is decided by
//!   [`Policy::decide`] (probes answered "supported", as in the analysis); it must be one of
//!   the non-empty diagrams. Every other non-empty outcome diagram needs a verified example:
//!   a cube of its cover (ties applied), facts kept at their defaults where the cube allows,
//!   members found by the witness search, and the resulting config decided again by
//!   [`Policy::decide`] to the same outcome. An outcome without one is counted in
//!   `unverified` and makes the result incomplete (never claimed either way).
//! - **Deciding facts** (`depends_on`), for cells with more than one reachable outcome: the
//!   free facts the restricted outcome diagrams of the reachable outcomes test, directly or
//!   through a relation variable that reads them. A reduced diagram tests exactly the
//!   variables its function depends on, so these are the free facts whose classes the
//!   decision depends on in the cell: for each listed fact there are two inputs of the cell
//!   that differ in it alone (the other facts' classes and the relations' values held) and
//!   are decided differently. A relation variable counts for every free fact it reads.
//!
//! Assumptions are those of `gaps` / `diff` ([`crate::regions::assumptions`]).

use std::collections::BTreeSet;

use serde_json::{Map, Value as Json};

use attn_policy::Policy;
use attn_policy::facts::schema::Origin;
use attn_policy::facts::{Facts, Value};

use crate::mdd::{FALSE, Id, Mdd, PolicyDiagrams, TRUE};
use crate::regions::{add_policy, validity};
use crate::space::{Space, SpaceBuilder};

use super::specialize::{Subst, specialize};

/// What a pack selects: a backend and its variant (`None` for a backend without variants);
/// `None`: no backend.
pub type Outcome = Option<(u16, Option<usize>)>;

/// The grid to analyse: per cell (row-major) the config at its defaults, which fact slots
/// the axes set, and which facts are free. Every other fact is *held*: pinned to the cell
/// config's value (the same in every cell unless an axis alias sets it).
pub struct GridQuery {
    pub row_slots: Vec<usize>,
    pub col_slots: Vec<usize>,
    pub free_slots: Vec<usize>,
    pub nrows: usize,
    pub ncols: usize,
    /// Row-major, `nrows * ncols` configs (conformance `config` format).
    pub configs: Vec<Json>,
}

/// An outcome reachable in a cell, with an input of the cell that the pack decides to it.
#[derive(Clone, Debug)]
pub struct Reachable {
    pub outcome: Outcome,
    /// The example's config (the cell's config with some free facts changed).
    pub config: Json,
    /// The top-level config keys whose facts differ from the cell's config, with their
    /// values in the example (empty for the outcome at the defaults).
    pub changes: Map<String, Json>,
}

#[derive(Clone, Debug)]
pub struct CellAnalysis {
    /// The cell's config, read by the pack's schema, probes answered "supported".
    pub facts: Facts,
    /// The decision at the cell's config.
    pub at_defaults: Outcome,
    /// Every outcome reachable in the cell, the one at the defaults first.
    pub reachable: Vec<Reachable>,
    /// Free facts that decide between the reachable outcomes (empty: the pinned facts
    /// decide the cell), in schema order.
    pub depends_on: Vec<&'static str>,
    /// Outcomes whose diagram is not empty in the cell but for which no example was found.
    pub unverified: usize,
}

#[derive(Clone, Debug)]
pub struct GridAnalysis {
    /// Row-major.
    pub cells: Vec<CellAnalysis>,
    /// Every cell's answer is exact: the budget held, every evaluation was definite, every
    /// non-empty outcome has a verified example, and the defaults' decision agrees with the
    /// diagrams.
    pub complete: bool,
    pub diagram_nodes: u64,
    pub classes_examined: u64,
}

/// A pinned value the analysis cannot represent (outside the domain the space models).
#[derive(Debug, thiserror::Error)]
pub enum GridError {
    #[error("{path} = {value}: outside the values the analysis models ({why})")]
    Unmodelled {
        path: &'static str,
        value: String,
        why: &'static str,
    },
    #[error("invalid cell config: {0}")]
    Config(#[from] attn_policy::facts::InputError),
}

/// The facts a config is decided with by the analysis: probes answered "supported".
pub fn read_cell(policy: &Policy, config: &Json) -> Result<Facts, attn_policy::facts::InputError> {
    let mut f = policy.read_facts(config)?;
    f.set_all_probes(true);
    Ok(f)
}

/// The outcome the pack selects for some facts.
pub fn outcome_of(policy: &Policy, facts: &Facts) -> Outcome {
    let d = policy.decide(facts);
    d.selected.map(|b| {
        let variant = d.backends[b as usize]
            .variant
            .filter(|_| !policy.backends[b as usize].variants.is_empty())
            .map(usize::from);
        (b, variant)
    })
}

/// Analyses every cell of the grid.
pub fn analyse(policy: &Policy, q: &GridQuery, budget: u64) -> Result<GridAnalysis, GridError> {
    assert_eq!(q.configs.len(), q.nrows * q.ncols, "one config per cell");
    let facts: Vec<Facts> = q
        .configs
        .iter()
        .map(|c| read_cell(policy, c))
        .collect::<Result<_, _>>()?;
    let plan = Plan::of(policy, q, &facts);
    let spec = specialize(policy, &plan.substitute);
    let mut b = SpaceBuilder::for_schema(policy.schema);
    add_policy(&mut b, &spec);
    // Only inputs the family accepts (docs/facts.md): a cell's outcomes are those of valid
    // inputs, so each has an example that reads (as `gaps` and `diff` search).
    let valid = validity(&[&spec], None);
    if let Some(r) = &valid {
        b.root(&r.program, r.cond.node);
    }
    let mut splits = BTreeSet::new();
    for f in &facts {
        for &s in &plan.cofactor {
            let v = f.values()[s];
            if matches!(v, Value::Int(_) | Value::Float(_) | Value::Version(_))
                && splits.insert((s, format!("{v:?}")))
            {
                b.split_at(s, v);
            }
        }
    }
    let space = b.build();
    let mut m = Mdd::for_policies(&space, &[&spec]);
    m.budget = usize::try_from(budget).unwrap_or(usize::MAX);
    let d = PolicyDiagrams::build(&mut m, &spec);
    let valid_id = match &valid {
        Some(r) => {
            let rp = m.program(&r.program);
            m.condition(rp, r.cond.node)
        }
        None => TRUE,
    };
    let parts = Parts::of(&d);
    let row_pinned: Vec<usize> = plan
        .cofactor
        .iter()
        .copied()
        .filter(|s| q.row_slots.contains(s))
        .collect();
    let mut cells = Vec::with_capacity(facts.len());
    let mut complete = true;
    for r in 0..q.nrows {
        let pr = pins(&space, &m, &row_pinned, &facts[r * q.ncols])?;
        let dr = m.restrict_all(&parts.ids, &pr);
        for c in 0..q.ncols {
            let i = r * q.ncols + c;
            let mut all = pins(&space, &m, &plan.cofactor, &facts[i])?;
            for rv in space.vars.len()..m.nvars() {
                all[rv] = m.relation_at(rv, &all);
            }
            let drc = m.restrict_all(&dr, &all);
            let valid_cell = m.restrict_all(&[valid_id], &all)[0];
            let cell = analyse_cell(
                policy,
                &mut m,
                &parts.with(&d, &drc),
                valid_cell,
                &mut all,
                &facts[i],
                &q.configs[i],
            );
            complete &= cell.unverified == 0;
            cells.push(cell);
        }
    }
    Ok(GridAnalysis {
        cells,
        complete: complete && !m.exhausted && m.unknown == 0,
        diagram_nodes: m.size() as u64,
        classes_examined: m.evaluations,
    })
}

/// Facts that follow another fact when their config key is absent: (family, follower,
/// source), as the family's reader derives them (`src/facts/torch.rs`, `derive`; a test
/// checks each). Held, they are replaced by their source, so they move with it.
pub const FOLLOWS: &[(&str, &str, &str)] = &[
    ("torch", "dtype_k", "dtype"),
    ("torch", "dtype_v", "dtype"),
    ("torch", "batch_k", "batch"),
    ("torch", "batch_v", "batch"),
    ("torch", "heads_v", "heads_kv"),
    ("torch", "head_dim_k", "head_dim_qk"),
    ("torch", "stride_last_k", "stride_last_q"),
    ("torch", "stride_last_v", "stride_last_q"),
];

/// Which pinned facts become constants of the specialised pack and which stay vars of the
/// space, pinned per cell by cofactors.
struct Plan {
    /// Per slot, what it is replaced by: held facts with one value in every cell by that
    /// constant, facts that follow another ([`FOLLOWS`]) by it.
    substitute: Vec<Subst>,
    /// Pinned slots that stay vars: the axes, facts an axis alias sets, and the inputs of
    /// derived facts that cannot all be replaced.
    cofactor: Vec<usize>,
}

impl Plan {
    fn of(policy: &Policy, q: &GridQuery, facts: &[Facts]) -> Plan {
        let schema = policy.schema;
        let n = schema.fields.len();
        let on_axis = |s: usize| q.row_slots.contains(&s) || q.col_slots.contains(&s);
        // Axis facts are pinned even if listed free; probes stay as the space answers them.
        let pinned = |s: usize| {
            on_axis(s) || (!q.free_slots.contains(&s) && schema.fields[s].origin != Origin::Probe)
        };
        let constant = |s: usize| {
            pinned(s) && !on_axis(s) && facts.iter().all(|f| f.values()[s] == facts[0].values()[s])
        };
        let mut sub: Vec<bool> = (0..n)
            .map(|s| constant(s) && schema.fields[s].origin == Origin::Input)
            .collect();
        // The te family's derived facts: `sm` from the compute capability; the window bounds
        // from `window_size` and (when it is null) the mask. A group is replaced only whole,
        // else the space derives them from vars (and reads the mask as a var).
        let slot = |p: &str| schema.slot(p);
        let group =
            |paths: &[&str]| -> Vec<usize> { paths.iter().filter_map(|p| slot(p)).collect() };
        let cc = group(&[
            "device_compute_capability",
            "device_compute_capability.major",
            "device_compute_capability.minor",
            "sm",
        ]);
        if !cc.is_empty() {
            let all = cc
                .iter()
                .filter(|&&s| schema.fields[s].origin == Origin::Input)
                .all(|&s| constant(s));
            for &s in &cc {
                sub[s] = all;
            }
        }
        let window = group(&[
            "window_size",
            "window_size.left",
            "window_size.right",
            "window.left",
            "window.right",
        ]);
        if !window.is_empty() {
            let inputs_constant = window
                .iter()
                .filter(|&&s| schema.fields[s].origin == Origin::Input)
                .all(|&s| constant(s));
            let mask = slot("attn_mask_type");
            let window_null =
                slot("window_size").is_some_and(|s| facts[0].values()[s] == Value::Null);
            let all = inputs_constant && (!window_null || mask.is_some_and(constant));
            for &s in &window {
                sub[s] = all;
            }
            if !all && let Some(m) = mask {
                sub[m] = false;
            }
        }
        let mut substitute: Vec<Subst> = (0..n)
            .map(|s| {
                if sub[s] {
                    Subst::Const(facts[0].values()[s])
                } else {
                    Subst::Keep
                }
            })
            .collect();
        // A held fact that follows another (its key given in no cell) moves with it.
        let mut follows = vec![false; n];
        for &(family, follower, source) in FOLLOWS {
            let (Some(f), Some(src)) = (schema.slot(follower), schema.slot(source)) else {
                continue;
            };
            let given = q.configs.iter().any(|c| c.get(follower).is_some());
            if family != schema.family || given || !pinned(f) || on_axis(f) {
                continue;
            }
            follows[f] = true;
            substitute[f] = match substitute[src] {
                Subst::Const(v) => Subst::Const(v),
                _ => Subst::Slot(src as u16),
            };
        }
        let cofactor = (0..n)
            .filter(|&s| pinned(s) && substitute[s] == Subst::Keep && !follows[s])
            .collect();
        Plan {
            substitute,
            cofactor,
        }
    }
}

/// The diagrams `outcomes_within` reads, flattened so they can be restricted together.
struct Parts {
    ids: Vec<Id>,
}

impl Parts {
    fn of(d: &PolicyDiagrams) -> Parts {
        let mut ids: Vec<Id> = d.variant_out.iter().flatten().copied().collect();
        ids.extend(&d.first_pref);
        ids.push(d.no_pref);
        Parts { ids }
    }

    /// `d` with the flattened diagrams replaced by `ids` (restricted ones).
    fn with(&self, d: &PolicyDiagrams, ids: &[Id]) -> PolicyDiagrams {
        let mut it = ids.iter().copied();
        let variant_out = d
            .variant_out
            .iter()
            .map(|vs| vs.iter().map(|_| it.next().expect("id")).collect())
            .collect();
        let first_pref = d
            .first_pref
            .iter()
            .map(|_| it.next().expect("id"))
            .collect();
        PolicyDiagrams {
            rule: Vec::new(),
            app: d.app.clone(),
            decliners: d.decliners.clone(),
            variant_out,
            first_pref,
            no_pref: it.next().expect("id"),
        }
    }
}

/// Per diagram var, the class of the pinned slots' values (members of an absent object and
/// unpinned vars free).
fn pins(space: &Space, m: &Mdd, slots: &[usize], f: &Facts) -> Result<Vec<Option<u32>>, GridError> {
    let mut out = vec![None; m.nvars()];
    for (i, v) in space.vars.iter().enumerate() {
        if !slots.contains(&v.slot) {
            continue;
        }
        let value = f.values()[v.slot];
        if let Some(p) = v.parent
            && f.values()[space.vars[p].slot] == Value::Null
        {
            continue;
        }
        match space.class_of(i, value) {
            Some(c) => out[i] = Some(c as u32),
            None => {
                return Err(GridError::Unmodelled {
                    path: v.path,
                    value: format!("{}", value.display(v.domain())),
                    why: "see the assumptions in docs/analysis.md",
                });
            }
        }
    }
    Ok(out)
}

/// The outcome of `outcomes_within` as an [`Outcome`] (variant index only for backends
/// that have variants).
fn named(policy: &Policy, o: Option<(u16, usize)>) -> Outcome {
    o.map(|(b, v)| {
        let has = !policy.backends[b as usize].variants.is_empty();
        (b, has.then_some(v))
    })
}

fn analyse_cell(
    policy: &Policy,
    m: &mut Mdd,
    d: &PolicyDiagrams,
    valid: Id,
    all: &mut [Option<u32>],
    facts: &Facts,
    config: &Json,
) -> CellAnalysis {
    let space = m.space;
    let at_defaults = outcome_of(policy, facts);
    let mut outs: Vec<(Outcome, Id)> = d
        .outcomes_within(m, policy, valid)
        .into_iter()
        .map(|(o, x)| (named(policy, o), x))
        .collect();
    // Relations the pins force through their ties (a fact they read is free).
    loop {
        let ids: Vec<Id> = outs.iter().map(|o| o.1).collect();
        let mut forced = vec![None; m.nvars()];
        let mut any = false;
        for v in m.support(&ids) {
            if v >= space.vars.len()
                && all[v].is_none()
                && let Some(c) = m.forced_relation(v, all)
            {
                forced[v] = Some(c);
                all[v] = Some(c);
                any = true;
            }
        }
        if !any {
            break;
        }
        let restricted = m.restrict_all(&ids, &forced);
        for (o, x) in outs.iter_mut().zip(restricted) {
            o.1 = x;
        }
        outs.retain(|o| o.1 != FALSE);
    }
    let mut unverified = 0;
    let mut reachable = vec![Reachable {
        outcome: at_defaults,
        config: config.clone(),
        changes: Map::new(),
    }];
    let mut reachable_ids = Vec::new();
    match outs.iter().find(|o| o.0 == at_defaults) {
        Some(o) => reachable_ids.push(o.1),
        // The decision and the diagrams disagree: never claimed either way.
        None => unverified += 1,
    }
    let near = pins(
        space,
        m,
        &(0..facts.values().len()).collect::<Vec<_>>(),
        facts,
    )
    .unwrap_or_else(|_| vec![None; m.nvars()]);
    let cube = m.pins_cube(all);
    for &(o, x) in &outs {
        if o == at_defaults {
            continue;
        }
        let f = m.and(x, cube);
        if f == FALSE {
            continue;
        }
        let found = verified_example(policy, m, f, &near, config, facts, o);
        match found {
            Some(r) => {
                reachable.push(r);
                reachable_ids.push(x);
            }
            None => {
                // Ties may empty it (no input): then it is not reachable; else unverified.
                let (cubes, _) = m.cover(f, 1);
                if !cubes.is_empty() {
                    unverified += 1;
                }
            }
        }
    }
    let depends_on = if reachable.len() > 1 {
        deciding_facts(space, m, &m.support(&reachable_ids), all)
    } else {
        Vec::new()
    };
    CellAnalysis {
        facts: facts.clone(),
        at_defaults,
        reachable,
        depends_on,
        unverified,
    }
}

/// An input of `f` near the cell's defaults, decided again to `want`: the example of the
/// diagrams, then, one config key at a time, each change the outcome does not need put back
/// to the cell's value (every candidate decided again), so the changes listed are few.
fn verified_example(
    policy: &Policy,
    m: &mut Mdd,
    f: Id,
    near: &[Option<u32>],
    config: &Json,
    facts: &Facts,
    want: Outcome,
) -> Option<Reachable> {
    let (assign, values) = m.example_near(f, near)?;
    let mut example = m.space.example_with(&assign, &values);
    if let Some(o) = example.as_object_mut() {
        o.remove("probe");
    }
    let strict = |changes: &Map<String, Json>| -> Option<Facts> {
        let mut merged = config.clone();
        merge(&mut merged, &Json::Object(changes.clone()));
        let ef = read_cell(policy, &merged).ok()?;
        (outcome_of(policy, &ef) == want).then_some(ef)
    };
    // Like `gaps`, the analysis does not tie the constraints a family marks unsearched (te's
    // head counts): an outcome found only where they fail is still listed, with such an
    // example, when no valid one exists (docs/matrix.md says so).
    let decides_untied = |changes: &Map<String, Json>| -> Option<Facts> {
        let mut merged = config.clone();
        merge(&mut merged, &Json::Object(changes.clone()));
        let e = read_cell(policy, &merged).err()?;
        let untied = e.kind == attn_policy::facts::InputErrorKind::Constraint
            && policy
                .schema
                .constraints
                .iter()
                .any(|c| !c.searched && c.facts.contains(&e.path.as_str()));
        if !untied {
            return None;
        }
        let mut ef = policy.schema.read_unvalidated(&merged).ok()?;
        ef.set_all_probes(true);
        (outcome_of(policy, &ef) == want).then_some(ef)
    };
    let decides = |changes: &Map<String, Json>| strict(changes).or_else(|| decides_untied(changes));
    // A valid example first; te's head counts moved to counts TE accepts next; else one
    // refused only by an untied constraint.
    let moved = || {
        crate::regions::head_count_candidates(&example)
            .into_iter()
            .find_map(|e| strict(e.as_object()?).map(|ef| (e, ef)))
    };
    let (example, ef) = match strict(example.as_object()?) {
        Some(ef) => (example.clone(), ef),
        None => match moved().filter(|_| policy.schema.family == "te") {
            Some(found) => found,
            None => (example.clone(), decides_untied(example.as_object()?)?),
        },
    };
    // The keys whose facts differ from the cell's.
    let mut changes = Map::new();
    for (k, v) in example.as_object()? {
        let differs = (0..facts.values().len()).any(|s| {
            let path = policy.schema.fields[s].path;
            (path == k
                || path
                    .strip_prefix(k.as_str())
                    .is_some_and(|r| r.starts_with('.')))
                && policy.schema.fields[s].origin == Origin::Input
                && ef.values()[s] != facts.values()[s]
        });
        if differs {
            changes.insert(k.clone(), v.clone());
        }
    }
    decides(&changes)?;
    for k in changes.keys().cloned().collect::<Vec<_>>() {
        let mut fewer = changes.clone();
        fewer.remove(&k);
        if decides(&fewer).is_some() {
            changes = fewer;
        }
    }
    let mut merged = config.clone();
    merge(&mut merged, &Json::Object(changes.clone()));
    Some(Reachable {
        outcome: want,
        config: merged,
        changes,
    })
}

/// Deep merge of config objects (`window_size` and lists are replaced whole).
pub fn merge(into: &mut Json, from: &Json) {
    let (Some(a), Some(b)) = (into.as_object_mut(), from.as_object()) else {
        *into = from.clone();
        return;
    };
    for (k, v) in b {
        match (a.get_mut(k), v) {
            (Some(x @ Json::Object(_)), Json::Object(_)) => merge(x, v),
            _ => {
                a.insert(k.clone(), v.clone());
            }
        }
    }
}

/// The free facts among the diagram vars `vars` (relation variables as the facts they read),
/// in schema order: a window's bounds as `window_size`, an object left out when one of its
/// members is listed.
fn deciding_facts(
    space: &Space,
    m: &Mdd,
    vars: &[usize],
    pinned: &[Option<u32>],
) -> Vec<&'static str> {
    let mut facts: BTreeSet<usize> = BTreeSet::new();
    for &v in vars {
        if v < space.vars.len() {
            facts.insert(v);
        } else {
            facts.extend(m.relation_facts(v));
        }
    }
    facts.retain(|&v| pinned[v].is_none());
    let listed: Vec<usize> = facts.iter().copied().collect();
    let mut slots: BTreeSet<(usize, &'static str)> = BTreeSet::new();
    for &v in &listed {
        let var = &space.vars[v];
        if listed
            .iter()
            .any(|&u| space.vars[u].parent == Some(v) && !var.path.starts_with("window_size"))
        {
            continue;
        }
        let (slot, path) = match var.path {
            "window_size.left" | "window_size.right" => (
                space
                    .vars
                    .iter()
                    .find(|x| x.path == "window_size")
                    .map_or(var.slot, |x| x.slot),
                "window_size",
            ),
            p => (var.slot, p),
        };
        slots.insert((slot, path));
    }
    let mut out: Vec<&'static str> = Vec::new();
    for (_, p) in slots {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}
