//! Counterfactual hints (`attn-policy why-not BACKEND <config>`): the smallest changes to an
//! input that make a backend eligible. Candidate values come from the pack's equivalence
//! classes (the nearest member of each class, so `260 -> 264` rather than `260 -> 512`); every
//! proposal is verified by deciding the changed input again. Facts the user cannot change (the
//! GPU) are reported, never proposed.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value as Json, json};

use attn_policy::Decision;
use attn_policy::Policy;
use attn_policy::eval::program::Truth;
use attn_policy::facts::schema::Origin;
use attn_policy::facts::{Facts, Value};

use super::regions::add_policy;
use super::space::{ClassDesc, Space, SpaceBuilder, insert_path};

#[derive(Clone, Debug, Serialize)]
pub struct Change {
    pub fact: String,
    pub from: Json,
    pub to: Json,
}

#[derive(Clone, Debug, Serialize)]
pub struct Hint {
    /// Human wording ("pad head_dim_qk 260 -> 264").
    pub text: String,
    /// One alternative set of changes (for grouped hints, the first alternative).
    pub changes: Vec<Change>,
    /// The changed input was decided again and the backend is eligible there.
    pub verified: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct WhyNot {
    pub backend: String,
    pub eligible: bool,
    pub selected: Option<String>,
    /// Rules that decline the backend for this input: (id, reason).
    pub declined_by: Vec<(String, String)>,
    pub hints: Vec<Hint>,
    /// Obstacles only a fact the user cannot change would remove.
    pub unchangeable: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum WhyNotError {
    #[error("pack `{pack}` has no backend `{name}`{hint}; backends: {list}")]
    UnknownBackend {
        pack: String,
        name: String,
        /// ` (did you mean `X`?)` when a backend's name is close, else empty.
        hint: String,
        list: String,
    },
    #[error("invalid config: {0}")]
    Input(#[from] attn_policy::facts::InputError),
}

/// The config with unanswered probes answered "supported".
fn with_probes(policy: &Policy, config: &Json) -> Json {
    let mut c = config.clone();
    let probes = policy
        .schema
        .fields
        .iter()
        .filter(|d| d.origin == Origin::Probe);
    if probes.clone().next().is_none() {
        return c;
    }
    if let Some(obj) = c.as_object_mut() {
        let entry = obj.entry("probe").or_insert_with(|| json!({}));
        if let Some(p) = entry.as_object_mut() {
            for d in probes {
                if let Some(n) = d.path.strip_prefix("probe.") {
                    p.entry(n.to_string()).or_insert(Json::Bool(true));
                }
            }
        }
    }
    c
}

/// Sets one var of the space in a config object.
fn apply(space: &Space, facts: &Facts, config: &mut Json, var: usize, v: Value) {
    let Some(obj) = config.as_object_mut() else {
        return;
    };
    let var = &space.vars[var];
    if space.schema.family != "te" {
        // Structured facts as objects (their members fill them in); the rest as values.
        let j = match (var.ty, v) {
            (attn_policy::facts::Ty::Object, Value::Null) => Json::Null,
            (attn_policy::facts::Ty::Object, _) => obj.get(var.path).cloned().unwrap_or(json!({})),
            _ => v.to_json(var.domain()),
        };
        insert_path(obj, var.path, j);
        return;
    }
    let int = |p: &str| match facts.get(p) {
        Some(Value::Int(i)) => i,
        _ => -1,
    };
    match var.path {
        "sm" => {
            if let Value::Int(sm) = v {
                obj.insert(
                    "device_compute_capability".into(),
                    json!([sm / 10, sm % 10]),
                );
            }
        }
        "window_size" => {
            let w = if v == Value::Null {
                Json::Null
            } else {
                json!([int("window.left"), int("window.right")])
            };
            obj.insert("window_size".into(), w);
        }
        "window_size.left" | "window_size.right" => {
            let (mut l, mut r) = (int("window.left"), int("window.right"));
            if let Value::Int(x) = v {
                if var.path.ends_with("left") {
                    l = x;
                } else {
                    r = x;
                }
            }
            obj.insert("window_size".into(), json!([l, r]));
        }
        "core_attention_bias_shape" | "alibi_slopes_shape" | "fp8_recipe" | "inference" => {
            let x = if v == Value::Null {
                Json::Null
            } else if var.path.ends_with("shape") {
                json!(if var.path.starts_with("alibi") {
                    vec![1; 1]
                } else {
                    vec![1; 4]
                })
            } else {
                json!({})
            };
            obj.insert(var.path.into(), x);
        }
        p if p.starts_with("alibi_slopes_shape.") => {
            if let Value::Int(n) = v {
                obj.insert(
                    "alibi_slopes_shape".into(),
                    json!(vec![1; n.clamp(1, 8) as usize]),
                );
            }
        }
        p if p.starts_with("core_attention_bias_shape.") => {
            let dims: Vec<Json> = ["b", "h", "s_q", "s_kv"]
                .iter()
                .map(|m| {
                    let full = format!("core_attention_bias_shape.{m}");
                    if full == p {
                        v.to_json(None)
                    } else {
                        json!(int(&full).max(1))
                    }
                })
                .collect();
            obj.insert("core_attention_bias_shape".into(), Json::Array(dims));
        }
        p => {
            let j = match (v, p.starts_with("env.")) {
                (Value::Int(i), true) => json!(i.to_string()),
                _ => v.to_json(var.domain()),
            };
            insert_path(obj, p, j);
        }
    }
}

/// The member of class `c` of var `i` nearest to `cur`.
/// Symmetric head dims move together: padding q/k alone would trade one decline (a
/// multiple-of-8 rule) for another (`head_dim_qk != head_dim_v`).
fn couple(path: &str, facts: &Facts, cfg: &mut Json) {
    if path == "head_dim_qk"
        && facts.get("head_dim_qk") == facts.get("head_dim_v")
        && let Some(obj) = cfg.as_object_mut()
        && let Some(qk) = obj.get("head_dim_qk").cloned()
    {
        obj.insert("head_dim_v".into(), qk);
    }
}

fn nearest(space: &Space, i: usize, c: usize, cur: Value) -> Value {
    let cl = &space.vars[i].classes[c];
    match (cl.desc.clone(), cur) {
        (ClassDesc::Int { lo, hi, r, .. }, Value::Int(x)) => {
            let m = space.vars[i].modulus.max(1);
            let y = x.clamp(lo, hi);
            let down = y - (y - r).rem_euclid(m);
            let up = down + if (y - r).rem_euclid(m) == 0 { 0 } else { m };
            [down, up]
                .into_iter()
                .filter(|z| (lo..=hi).contains(z))
                .min_by_key(|z| (z - x).abs())
                .map_or(cl.value, Value::Int)
        }
        _ => cl.value,
    }
}

fn class_of(space: &Space, i: usize, v: Value) -> Option<usize> {
    space.vars[i]
        .classes
        .iter()
        .position(|c| match (&c.desc, v) {
            (ClassDesc::Int { lo, hi, r, .. }, Value::Int(x)) => {
                (*lo..=*hi).contains(&x) && (x - r).rem_euclid(space.vars[i].modulus.max(1)) == 0
            }
            (ClassDesc::Null, Value::Null) => true,
            (ClassDesc::Present, Value::Bool(true)) => true,
            (ClassDesc::Ordered { lo, hi }, x) if !matches!(x, Value::Null | Value::BadVersion) => {
                lo.is_none_or(|(b, incl)| {
                    x.compare(b)
                        .is_some_and(|o| o.is_gt() || (incl && o.is_eq()))
                }) && hi.is_none_or(|(b, incl)| {
                    x.compare(b)
                        .is_some_and(|o| o.is_lt() || (incl && o.is_eq()))
                })
            }
            _ => c.value == v,
        })
}

fn describe(space: &Space, i: usize, c: usize, from: Value, to: Value) -> String {
    let var = &space.vars[i];
    let p = var.path;
    let d = var.domain();
    let show = |v: Value| v.display(d).to_string();
    match (&var.classes[c].desc, from, to) {
        (_, _, Value::Null) => format!("unset {p}"),
        (ClassDesc::Ordered { lo, hi }, _, Value::Version(_)) => {
            let verb = if from == Value::Null {
                "install"
            } else if from == Value::BadVersion {
                "replace the unparseable"
            } else if from.compare(to).is_some_and(|o| o.is_lt()) {
                "upgrade"
            } else {
                "downgrade"
            };
            match (lo, hi) {
                (Some((a, true)), Some((b, true))) if a == b => {
                    format!("{verb} {p} to {}", show(*a))
                }
                (Some((a, incl)), _) if verb != "downgrade" => {
                    format!(
                        "{verb} {p} to {} {}",
                        if *incl { ">=" } else { ">" },
                        show(*a)
                    )
                }
                (_, Some((b, incl))) => format!(
                    "{verb} {p} to {} {}",
                    if *incl { "<=" } else { "<" },
                    show(*b)
                ),
                _ => format!("{verb} {p} to {}", show(to)),
            }
        }
        (_, Value::Int(a), Value::Int(b)) => {
            let verb = if p.starts_with("head_dim") && b > a {
                "pad"
            } else if b > a {
                "raise"
            } else {
                "lower"
            };
            format!("{verb} {p} {a} -> {b}")
        }
        (_, _, Value::Enum(_)) => format!("use {p} {}", show(to).trim_matches('"')),
        (_, _, Value::Bool(b))
            if var.path.contains('.') || var.ty != attn_policy::facts::Ty::Object =>
        {
            format!("set {p} to {b}")
        }
        (_, _, Value::Bool(_)) => format!("provide {p}"),
        _ => format!("set {p} {} -> {}", show(from), show(to)),
    }
}

/// A library version fact changed alone: the package to install (or up/downgrade) and every
/// version the verified hints accept, as one hint ("install flash-attn-3: flash_attn_versions.v3
/// >= 3.0.0") instead of one per version class.
fn package_hint(
    space: &Space,
    candidates: &[(usize, usize, Value, Json)],
    verified: &[(usize, i64, Vec<usize>)],
    var: usize,
    vals: &[Value],
) -> Option<String> {
    let v = &space.vars[var];
    if v.ty != attn_policy::facts::Ty::Version {
        return None;
    }
    let mut classes: Vec<u32> = verified
        .iter()
        .filter(|(len, _, c)| *len == 1 && candidates[c[0]].0 == var)
        .map(|(_, _, c)| candidates[c[0]].1 as u32)
        .collect();
    classes.sort_unstable();
    classes.dedup();
    let range = space.render(var, &classes)?;
    let from = vals[v.slot];
    let first = verified
        .iter()
        .find(|(len, _, c)| *len == 1 && candidates[c[0]].0 == var)
        .map(|(_, _, c)| candidates[c[0]].2)?;
    let verb = match from.compare(first) {
        _ if from == Value::Null => "install",
        _ if from == Value::BadVersion => "replace the unparseable",
        Some(o) if o.is_lt() => "upgrade",
        _ => "downgrade",
    };
    let package = attn_policy::facts::te::PACKAGES
        .iter()
        .find(|(fact, _)| *fact == v.path)
        .map(|(_, p)| *p);
    Some(match package {
        Some(p) => format!("{verb} {p} with {range}"),
        None => format!("set {range}"),
    })
}

/// Explains why `backend` is not eligible for `config` and proposes verified changes.
pub fn why_not(policy: &Policy, backend: &str, config: &Json) -> Result<WhyNot, WhyNotError> {
    let b = policy
        .backend_index(backend)
        .ok_or_else(|| WhyNotError::UnknownBackend {
            pack: policy.name.clone(),
            name: backend.to_string(),
            hint: attn_policy::facts::did_you_mean(
                backend,
                policy.backends.iter().map(|b| b.name.as_str()),
            )
            .map(|h| format!(" (did you mean `{h}`?)"))
            .unwrap_or_default(),
            list: policy
                .backends
                .iter()
                .map(|b| b.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    let config = with_probes(policy, config);
    let facts = policy.read_facts(&config)?;
    let decision = policy.decide(&facts);
    let mut out = WhyNot {
        backend: policy.backends[b].name.clone(),
        eligible: decision.backends[b].status.eligible(),
        selected: decision
            .selected
            .map(|s| policy.backends[s as usize].name.clone()),
        declined_by: decision
            .fired
            .iter()
            .map(|&r| &policy.rules[r as usize])
            .filter(|r| r.backend as usize == b)
            .map(|r| (r.id.clone(), r.reason.clone()))
            .collect(),
        hints: Vec::new(),
        unchangeable: Vec::new(),
    };
    if out.eligible {
        return Ok(out);
    }
    let mut sb = SpaceBuilder::for_schema(policy.schema);
    add_policy(&mut sb, policy);
    let space = sb.build();
    let candidates = candidate_changes(policy, &space, &facts, &config);
    let search = Search {
        policy,
        b,
        space: &space,
        facts: &facts,
        config: &config,
        candidates: &candidates,
    };
    let (combos, fixed_notes) = fix_combos(&search, &decision);
    out.unchangeable = fixed_notes;
    out.unchangeable.dedup();
    let verified = verify(&search, &combos);
    push_hints(&search, &verified, &mut out);
    Ok(out)
}

/// A candidate change: the fact (index into the space's vars), its class, the new value, and
/// the config with the change applied.
type Candidate = (usize, usize, Value, Json);

/// What the steps of [`why_not`] share: the backend, the config and its facts, and the
/// candidate changes.
struct Search<'a> {
    policy: &'a Policy,
    b: usize,
    space: &'a Space,
    facts: &'a Facts,
    config: &'a Json,
    candidates: &'a [Candidate],
}

/// Single-fact changes to try: each other class of each fact, and each fact compared with
/// another set to that one's value.
fn candidate_changes(
    policy: &Policy,
    space: &Space,
    facts: &Facts,
    config: &Json,
) -> Vec<Candidate> {
    let vals = facts.values();
    let mut candidates: Vec<Candidate> = Vec::new();
    for (i, var) in space.vars.iter().enumerate() {
        let cur = vals[var.slot];
        let here = class_of(space, i, cur);
        for c in 0..var.classes.len() {
            // Never propose an unparseable version as a change.
            if Some(c) == here || var.classes[c].desc == ClassDesc::Unparseable {
                continue;
            }
            let to = nearest(space, i, c, cur);
            let mut cfg = config.clone();
            apply(space, facts, &mut cfg, i, to);
            couple(var.path, facts, &mut cfg);
            if policy.read_facts(&cfg).is_ok() {
                candidates.push((i, c, to, cfg));
            }
        }
    }
    // Facts compared with each other (`heads_kv == heads_q`): a class rarely pins the other
    // fact's value, so also try each other compared fact's current value.
    for &si in &space.relational {
        let Some(i) = space.vars.iter().position(|v| v.slot == si) else {
            continue;
        };
        let cur = vals[si];
        for &sj in space.relational.iter().filter(|&&sj| sj != si) {
            let to = vals[sj];
            let Some(c) = class_of(space, i, to) else {
                continue;
            };
            if to == cur || !matches!(to, Value::Int(_)) {
                continue;
            }
            if candidates
                .iter()
                .any(|(ci, _, cto, _)| *ci == i && *cto == to)
            {
                continue;
            }
            let mut cfg = config.clone();
            apply(space, facts, &mut cfg, i, to);
            couple(space.vars[i].path, facts, &mut cfg);
            if policy.read_facts(&cfg).is_ok() {
                candidates.push((i, c, to, cfg));
            }
        }
    }
    candidates
}

/// Per variant, the combinations of candidate changes that remove every obstacle (smallest
/// first), and notes on obstacles only an unchangeable fact could remove.
fn fix_combos(s: &Search, decision: &Decision) -> (Vec<Vec<usize>>, Vec<String>) {
    let Search {
        policy,
        b,
        space,
        facts,
        candidates,
        ..
    } = *s;
    // Obstacles per variant: `None` = not applicable, `Some(rule)` = a rule that fires.
    let bk = &policy.backends[b];
    let nvar = bk.variants.len().max(1);
    let obstacle_holds = |f: &Facts, v: usize, ob: Option<usize>| -> bool {
        match ob {
            None => bk
                .variants
                .get(v)
                .and_then(|x| x.applicable.as_ref())
                .is_some_and(|c| Truth::of(policy.program.eval(c.node, f.values())) != Truth::True),
            Some(r) => {
                Truth::of(policy.program.eval(policy.rules[r].when.node, f.values())) == Truth::True
            }
        }
    };
    let mut combos: Vec<Vec<usize>> = Vec::new();
    let mut fixed_notes: Vec<String> = Vec::new();
    for v in 0..nvar {
        let mut obstacles: Vec<Option<usize>> = Vec::new();
        if obstacle_holds(facts, v, None) {
            obstacles.push(None);
        }
        for &r in &decision.fired {
            let rule = &policy.rules[r as usize];
            if rule.backend as usize == b && rule.variants & (1u64 << v.min(63)) != 0 {
                obstacles.push(Some(r as usize));
            }
        }
        // Per obstacle: candidate changes that remove it.
        let mut per: Vec<Vec<usize>> = Vec::new();
        for ob in &obstacles {
            let mut fixes = Vec::new();
            let mut fixed_only = Vec::new();
            for (k, (i, _, _, cfg)) in candidates.iter().enumerate() {
                let Ok(f) = policy.read_facts(cfg) else {
                    continue;
                };
                if !obstacle_holds(&f, v, *ob) {
                    if space.vars[*i].fixed {
                        fixed_only.push(k);
                    } else {
                        fixes.push(k);
                    }
                }
            }
            if fixes.is_empty() {
                let what = match ob {
                    Some(r) => format!("rule {}", policy.rules[*r].id),
                    None => format!(
                        "variant {} not applicable",
                        bk.variants.get(v).map_or("", |x| x.name.as_str())
                    ),
                };
                let mut by_var: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
                for k in fixed_only {
                    by_var
                        .entry(candidates[k].0)
                        .or_default()
                        .push(candidates[k].1 as u32);
                }
                if by_var.is_empty() {
                    fixed_notes.push(format!("{what}: no single fact change removes it"));
                } else {
                    for (i, cls) in by_var {
                        let need = space.render(i, &cls).unwrap_or_default();
                        fixed_notes.push(format!(
                            "{what}: needs {need}; {} cannot be changed (the GPU or a live probe)",
                            space.vars[i].path
                        ));
                    }
                }
                per.clear();
                break;
            }
            per.push(fixes);
        }
        if per.is_empty() {
            continue;
        }
        // Cartesian product of per-obstacle fixes, capped.
        let mut acc: Vec<Vec<usize>> = vec![Vec::new()];
        for fixes in &per {
            let mut next = Vec::new();
            for a in &acc {
                for &k in fixes {
                    let mut c = a.clone();
                    if !c.contains(&k) {
                        if c.iter().any(|&x| candidates[x].0 == candidates[k].0) {
                            continue;
                        }
                        c.push(k);
                    }
                    c.sort_unstable();
                    next.push(c);
                    if next.len() > 2000 {
                        break;
                    }
                }
            }
            next.sort();
            next.dedup();
            acc = next;
        }
        combos.extend(acc);
    }
    combos.sort_by_key(|c| c.len());
    combos.dedup();
    (combos, fixed_notes)
}

/// The combinations that make the backend eligible, verified by deciding, sorted: fewest
/// changes, then smallest numeric moves.
fn verify(s: &Search, combos: &[Vec<usize>]) -> Vec<(usize, i64, Vec<usize>)> {
    let Search {
        policy,
        b,
        space,
        facts,
        config,
        candidates,
    } = *s;
    let vals = facts.values();
    let eligible_at = |c: &Json| -> bool {
        policy
            .read_facts(c)
            .map(|f| policy.decide(&f).backends[b].status.eligible())
            .unwrap_or(false)
    };
    // Verify, then keep the smallest: fewest changes, then smallest numeric moves.
    let mut verified: Vec<(usize, i64, Vec<usize>)> = Vec::new();
    for c in combos.iter().take(5000) {
        let mut cfg = config.clone();
        for &k in c {
            let (i, _, to, _) = &candidates[k];
            apply(space, facts, &mut cfg, *i, *to);
            couple(space.vars[*i].path, facts, &mut cfg);
        }
        if eligible_at(&cfg) {
            let dist: i64 = c
                .iter()
                .map(|&k| {
                    let (i, _, to, _) = &candidates[k];
                    match (vals[space.vars[*i].slot], to) {
                        (Value::Int(a), Value::Int(b)) => (a - b).abs().min(1 << 20),
                        _ => 1,
                    }
                })
                .sum();
            verified.push((c.len(), dist, c.clone()));
        }
    }
    verified.sort();
    verified
}

/// Turns the smallest verified combinations into hints, one per set of facts.
fn push_hints(s: &Search, verified: &[(usize, i64, Vec<usize>)], out: &mut WhyNot) {
    let Search {
        space,
        facts,
        config,
        candidates,
        ..
    } = *s;
    let vals = facts.values();
    let min_len = verified.first().map_or(0, |v| v.0);
    // Group single-var alternatives of the same enum var ("use cp_comm_type all_gather or a2a").
    let mut seen_vars: BTreeMap<Vec<usize>, usize> = BTreeMap::new();
    for (len, _, c) in verified.iter().filter(|v| v.0 <= min_len + 1) {
        let vars: Vec<usize> = c.iter().map(|&k| candidates[k].0).collect();
        let changes: Vec<Change> = c
            .iter()
            .map(|&k| {
                let (i, _, to, _) = &candidates[k];
                let var = &space.vars[*i];
                Change {
                    fact: var.path.to_string(),
                    from: vals[var.slot].to_json(var.domain()),
                    to: to.to_json(var.domain()),
                }
            })
            .collect();
        let texts: Vec<String> = c
            .iter()
            .map(|&k| {
                let (i, cl, to, cfg) = &candidates[k];
                let text = describe(space, *i, *cl, vals[space.vars[*i].slot], *to);
                let moved_v = space.vars[*i].path == "head_dim_qk"
                    && cfg.get("head_dim_v") != config.get("head_dim_v");
                if moved_v {
                    format!("{text} (and head_dim_v with it)")
                } else {
                    text
                }
            })
            .collect();
        if let Some(&h) = seen_vars.get(&vars) {
            // One hint per set of facts: the smallest move comes first; further values of an
            // enum are alternatives of the same hint, other repeats say nothing new.
            if *len == 1 && space.vars[vars[0]].domain().is_some() {
                let name = texts[0].rsplit(' ').next().unwrap_or("").to_string();
                out.hints[h].text.push_str(&format!(" or {name}"));
            }
            continue;
        }
        seen_vars.insert(vars.clone(), out.hints.len());
        let text = match (
            *len,
            package_hint(space, candidates, verified, vars[0], vals),
        ) {
            (1, Some(t)) => t,
            _ => texts.join(" and "),
        };
        out.hints.push(Hint {
            text,
            changes,
            verified: true,
        });
        if out.hints.len() >= 8 {
            break;
        }
    }
}
