//! `attn-policy check`: lints over a loaded pack, each proved (or refuted) by a search over the
//! pack's equivalence classes. Codes are stable (docs/analysis.md):
//!
//! | code | meaning |
//! |---|---|
//! | `W-NEVER-FIRES` | a rule's condition is false for every input |
//! | `W-ALWAYS-FIRES` | a rule's condition is true for every input |
//! | `W-SUBSUMED` | whenever a rule fires, another rule of the same backend (same layer, kind, variants or more) fires too |
//! | `W-UNSELECTABLE` | a backend is never selected (never eligible, or always outranked where eligible) |
//! | `W-CAPABILITY` | a backend neither reads a capability's facts in any rule nor declares it in `supports:` |
//! | `W-UNKNOWN-CAPABILITY` | `supports:` names a capability this checker does not know |
//! | `W-OBSOLETE-WORKAROUND` | a rule's `until:` holds for every input the pack's `min_versions` allow |
//! | `W-ANALYSIS-INCOMPLETE` | a search ran out of budget; the lint it served was skipped |
//!
//! Load errors (`E-DUP-RULE`, `E-TYPE`, ...) come from the loader.

use std::collections::BTreeSet;

use attn_policy::Policy;
use attn_policy::eval::program::{Node, NodeId, Program, Truth};
use attn_policy::facts::Value;
use attn_policy::facts::schema::Ty;
use attn_policy::facts::te::{FIELDS, slot};
use attn_policy::{Code, Diagnostic};

use super::mdd::{FALSE, Id, Mdd, PolicyDiagrams, TRUE};
use super::regions::{add_policy, example_of};
use super::search::{Step, Tri, search};
use super::space::{Assign, Space, SpaceBuilder, mask_of, slot_bit};

const RULE_BUDGET: u64 = 2_000_000;
/// Decision-diagram nodes `check` may build (the te pack needs about 2M).
const PACK_BUDGET: usize = 20_000_000;

/// A capability and the facts whose rules give a backend's disposition for it.
pub struct Capability {
    pub name: &'static str,
    /// Reading any of these facts counts.
    pub facts: &'static [&'static str],
    /// Reading this enum fact with one of these values counts.
    pub values: &'static [(&'static str, &'static [&'static str])],
    /// Reading these facts without reading `values`' fact counts too (blanket rules, e.g. a
    /// rule on `context_parallel` covers every comm type).
    pub blanket: &'static [&'static str],
    /// Every backend must dispose of it (false: known name, not linted).
    pub required: bool,
}

const THD: &[&str] = &[
    "t3hd",
    "th3d",
    "thd_t2hd",
    "thd_th2d",
    "thd_thd_thd",
    "thd_bshd_bshd",
    "thd_sbhd_sbhd",
    "paged_kv_thd_bshd_bshd",
    "paged_kv_thd_sbhd_sbhd",
];
const PAGED: &[&str] = &[
    "paged_kv_bshd_bshd_bshd",
    "paged_kv_bshd_sbhd_sbhd",
    "paged_kv_sbhd_bshd_bshd",
    "paged_kv_sbhd_sbhd_sbhd",
    "paged_kv_thd_bshd_bshd",
    "paged_kv_thd_sbhd_sbhd",
];
const CP: &[&str] = &["context_parallel", "cp_size", "cp_size_a2a"];

const fn cap(
    name: &'static str,
    facts: &'static [&'static str],
    values: &'static [(&'static str, &'static [&'static str])],
    blanket: &'static [&'static str],
) -> Capability {
    Capability {
        name,
        facts,
        values,
        blanket,
        required: true,
    }
}

/// The capability -> facts mapping of the `W-CAPABILITY` lint (documented in docs/analysis.md).
pub static CAPABILITIES: &[Capability] = &[
    cap(
        "fp8",
        &[
            "fp8",
            "fp8_recipe",
            "fp8_recipe.recipe",
            "fp8_recipe.fp8_dpa",
            "fp8_recipe.fp8_mha",
            "fp8_recipe.fp8_format",
            "fp8_recipe.local_recipe",
            "fp8_output",
        ],
        &[("qkv_dtype", &["fp8_e4m3", "fp8_e5m2"])],
        &[],
    ),
    cap(
        "bias",
        &[
            "core_attention_bias_shape",
            "core_attention_bias_shape.b",
            "core_attention_bias_shape.h",
            "core_attention_bias_shape.s_q",
            "core_attention_bias_shape.s_kv",
            "core_attention_bias_requires_grad",
        ],
        &[(
            "core_attention_bias_type",
            &["pre_scale_bias", "post_scale_bias", "no_bias"],
        )],
        &[],
    ),
    cap(
        "alibi",
        &["alibi_slopes_shape", "alibi_slopes_shape.len"],
        &[("core_attention_bias_type", &["alibi", "no_bias"])],
        &[],
    ),
    cap("dropout", &["attention_dropout"], &[], &[]),
    cap("softcap", &["softcap"], &[], &[]),
    cap(
        "score_mod",
        &["has_score_mod", "has_score_mod_bprop"],
        &[],
        &[],
    ),
    cap("num_splits", &["num_splits"], &[], &[]),
    cap("cuda_graph", &["cuda_graph"], &[], &[]),
    cap(
        "checkpoint_core_attention",
        &["checkpoint_core_attention"],
        &[],
        &[],
    ),
    cap("return_max_logit", &["return_max_logit"], &[], &[]),
    cap(
        "kv_cache",
        &[
            "inference",
            "inference.is_paged",
            "inference.page_size",
            "inference.total_num_pages",
            "inference.max_pages_per_seq",
        ],
        &[("qkv_layout", PAGED)],
        &[],
    ),
    cap(
        "paged_kv",
        &[
            "inference.is_paged",
            "inference.page_size",
            "inference.total_num_pages",
            "inference.max_pages_per_seq",
        ],
        &[("qkv_layout", PAGED)],
        &[],
    ),
    cap(
        "thd",
        &["num_tokens_q", "num_tokens_kv", "pad_between_seqs"],
        &[("qkv_layout", THD)],
        &[],
    ),
    cap("deterministic", &["deterministic"], &[], &[]),
    cap(
        "window",
        &[
            "window.left",
            "window.right",
            "window_size",
            "window_size.left",
            "window_size.right",
        ],
        &[],
        &[],
    ),
    cap("cp_p2p", &[], &[("cp_comm_type", &["p2p"])], CP),
    cap(
        "cp_all_gather",
        &[],
        &[("cp_comm_type", &["all_gather"])],
        CP,
    ),
    cap("cp_a2a", &[], &[("cp_comm_type", &["a2a"])], CP),
    cap("cp_a2a+p2p", &[], &[("cp_comm_type", &["a2a+p2p"])], CP),
    cap("softmax_type", &["softmax_type"], &[], &[]),
    Capability {
        name: "gqa",
        facts: &["num_gqa_groups"],
        values: &[],
        blanket: &[],
        required: false,
    },
];

/// (slot, enum value index) pairs a condition compares directly.
fn enum_refs(p: &Program, id: NodeId, out: &mut BTreeSet<(usize, u16)>) {
    match p.nodes[id as usize] {
        Node::Cmp(_, a, b) => {
            for (x, y) in [(a, b), (b, a)] {
                if let (Node::Slot(s), Node::Const(Value::Enum(i))) =
                    (p.nodes[x as usize], p.nodes[y as usize])
                {
                    out.insert((s as usize, i));
                }
            }
            enum_refs(p, a, out);
            enum_refs(p, b, out);
        }
        Node::In {
            item, start, len, ..
        } => {
            if let Node::Slot(s) = p.nodes[item as usize] {
                for c in &p.consts[start as usize..(start + len) as usize] {
                    if let Value::Enum(i) = c {
                        out.insert((s as usize, *i));
                    }
                }
            }
            enum_refs(p, item, out);
        }
        Node::Not(a) | Node::IsNull(a) | Node::IsNotNull(a) | Node::IsParsed(a) | Node::Neg(a) => {
            enum_refs(p, a, out)
        }
        Node::And { start, len } | Node::Or { start, len } | Node::Call { start, len, .. } => {
            for &c in &p.children[start as usize..(start + len) as usize] {
                enum_refs(p, c, out);
            }
        }
        Node::Arith(_, a, b) => {
            enum_refs(p, a, out);
            enum_refs(p, b, out);
        }
        Node::Const(_) | Node::Slot(_) => {}
    }
}

fn disposes(policy: &Policy, rule: usize, c: &Capability) -> bool {
    let r = &policy.rules[rule];
    let reads = |p: &str| slot(p).is_some_and(|s| r.when.slots.contains(&(s as u16)));
    if c.facts.iter().any(|f| reads(f)) {
        return true;
    }
    let mut refs = BTreeSet::new();
    enum_refs(&policy.program, r.when.node, &mut refs);
    for (fact, values) in c.values {
        let Some(s) = slot(fact) else { continue };
        let Ty::Enum(dom) = FIELDS[s].ty else {
            continue;
        };
        if values
            .iter()
            .filter_map(|v| dom.index_of(v))
            .any(|i| refs.contains(&(s, i)))
        {
            return true;
        }
        if !c.blanket.is_empty() && !reads(fact) && c.blanket.iter().any(|f| reads(f)) {
            return true;
        }
    }
    false
}

/// Searches for an input where `pred` is true; `Err(())` when the budget ran out.
fn witness(
    space: &Space,
    budget: u64,
    pred: &mut dyn FnMut(&[Value]) -> Tri,
) -> Result<Option<Assign>, ()> {
    let mut hit = None;
    let st = search(
        space,
        budget,
        &mut |vals| {
            let t = pred(vals);
            match t.truth {
                Truth::True => Step::Leaf(()),
                Truth::False => Step::Prune,
                Truth::Unknown => Step::Split(t.mask),
            }
        },
        &mut |a, ()| {
            hit = Some(a.clone());
            false
        },
    );
    if hit.is_none() && st.truncated {
        Err(())
    } else {
        Ok(hit)
    }
}

fn tri(t: Truth, mask: u128) -> Tri {
    Tri { truth: t, mask }
}

fn not(t: Truth) -> Truth {
    match t {
        Truth::True => Truth::False,
        Truth::False => Truth::True,
        Truth::Unknown => Truth::Unknown,
    }
}

fn and(a: Truth, b: Truth) -> Truth {
    match (a, b) {
        (Truth::False, _) | (_, Truth::False) => Truth::False,
        (Truth::True, Truth::True) => Truth::True,
        _ => Truth::Unknown,
    }
}

fn incomplete(what: String) -> Diagnostic {
    Diagnostic::new(
        Code::AnalysisIncomplete,
        format!("{what}: search budget exhausted, lint skipped"),
    )
}

/// Runs every lint. Diagnostics point into `policy.sources`; call `locate` to fill
/// `file:line:col`.
pub fn lint(policy: &Policy) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let p = &policy.program;
    // Every search question is answered on the decision diagrams of the whole pack's space
    // (src/mdd/queries.rs): a rule never fires iff its diagram is false, and so on.
    let mut sb = SpaceBuilder::for_schema(policy.schema);
    add_policy(&mut sb, policy);
    // What executor-chain entries admit (packs loaded with a catalogue): `executor_lints`.
    for (_, c) in &policy.executor_admits {
        sb.root(p, c.node);
    }
    let space = sb.build();
    let mut m = Mdd::for_policies(&space, &[policy]);
    m.budget = PACK_BUDGET;
    let d = PolicyDiagrams::build(&mut m, policy);
    let reads_probe: Vec<bool> = policy
        .rules
        .iter()
        .map(|r| {
            r.when.slots.iter().any(|&x| {
                policy.schema.fields[x as usize].origin == attn_policy::facts::schema::Origin::Probe
            })
        })
        .collect();
    let verdicts = fire_lints(policy, &m, &d, reads_probe, &mut out);
    subsumption_lints(policy, &mut m, &d, &verdicts, &mut out);
    selectability_lints(policy, &mut m, &d, &mut out);
    executor_lints(policy, &mut m, &d, &mut out);
    capability_lints(policy, &mut out);
    obsolete_workaround_lints(policy, &mut out);
    out
}

/// What the never-fires and always-fires lints found per rule, and which rules read probes:
/// the subsumption lint skips those.
struct RuleVerdicts {
    reads_probe: Vec<bool>,
    never: Vec<bool>,
    always: Vec<bool>,
}

/// Rules that never fire (`W-NEVER-FIRES`) or always fire (`W-ALWAYS-FIRES`).
fn fire_lints(
    policy: &Policy,
    m: &Mdd,
    d: &PolicyDiagrams,
    reads_probe: Vec<bool>,
    out: &mut Vec<Diagnostic>,
) -> RuleVerdicts {
    let n = policy.rules.len();
    let mut never = vec![false; n];
    let mut always = vec![false; n];
    for (i, r) in policy.rules.iter().enumerate() {
        // A rule reading probes rests on the "supported" answer: not claimed.
        let exact = !reads_probe[i];
        let inexact_note = |what: &str| {
            Diagnostic::new(Code::AnalysisIncomplete,
                format!(
                    "rule `{}`: {what} not proved: it reads probe facts, which the analysis answers \"supported\"",
                    r.id
                ),
            )
            .at(r.when_loc)
        };
        if m.exhausted {
            out.push(incomplete(format!("rule `{}`", r.id)));
            continue;
        }
        if d.rule[i] == FALSE && policy.layer_enabled(r.layer) {
            if exact {
                never[i] = true;
                out.push(
                    Diagnostic::new(Code::NeverFires, format!("rule `{}` can never fire", r.id))
                        .at(r.when_loc)
                        .label("false for every input over the schema's domains")
                        .help(Some("delete the rule or fix its condition".into())),
                );
            } else {
                out.push(inexact_note("never-fires"));
            }
        }
        if d.rule[i] == TRUE {
            if exact {
                always[i] = true;
                out.push(
                    Diagnostic::new(
                        Code::AlwaysFires,
                        format!(
                            "rule `{}` always fires: backend `{}` is declined for every input",
                            r.id, policy.backends[r.backend as usize].name
                        ),
                    )
                    .at(r.when_loc)
                    .label("true for every input over the schema's domains"),
                );
            } else {
                out.push(inexact_note("always-fires"));
            }
        }
    }
    RuleVerdicts {
        reads_probe,
        never,
        always,
    }
}

/// Rules subsumed by another rule of the same backend, layer and kind.
fn subsumption_lints(
    policy: &Policy,
    m: &mut Mdd,
    d: &PolicyDiagrams,
    v: &RuleVerdicts,
    out: &mut Vec<Diagnostic>,
) {
    let RuleVerdicts {
        reads_probe,
        never,
        always,
    } = v;
    // Subsumption: A fires => B fires, B declines at least A's variants, same layer and kind.
    for (i, a) in policy.rules.iter().enumerate() {
        if never[i] || always[i] || !policy.layer_enabled(a.layer) || m.exhausted {
            continue;
        }
        for (j, b) in policy.rules.iter().enumerate() {
            if i == j
                || never[j]
                || a.backend != b.backend
                || a.layer != b.layer
                || a.kind != b.kind
                || a.variants & !b.variants != 0
            {
                continue;
            }
            // Not proved where either diagram is not exact (or rests on probe answers).
            if reads_probe[i] || reads_probe[j] {
                continue;
            }
            if !m.implies(d.rule[i], d.rule[j]) {
                continue;
            }
            // Equivalent rules: report the later one only.
            if j > i && m.implies(d.rule[j], d.rule[i]) {
                continue;
            }
            // A rule declining several backends is subsumed for one of them only: say which,
            // and do not suggest deleting it.
            let shared = policy
                .rules
                .iter()
                .any(|r| r.id == a.id && r.backend != a.backend);
            let (whose, help) = if shared {
                let name = &policy.backends[a.backend as usize].name;
                (
                    format!(" for backend `{name}`"),
                    format!(
                        "`{}` already declines `{name}` there; drop `{name}` from `{}`'s backends or narrow `{}`",
                        b.id, a.id, b.id
                    ),
                )
            } else {
                (
                    String::new(),
                    format!(
                        "delete `{}` or narrow `{}` (keep the one whose reason helps users more)",
                        a.id, b.id
                    ),
                )
            };
            out.push(
                Diagnostic::new(Code::Subsumed,
                    format!(
                        "rule `{}`{whose} is subsumed by rule `{}`: whenever it fires, `{}` fires too",
                        a.id, b.id, b.id
                    ),
                )
                .at(a.when_loc)
                .label(format!("implies `{}`", b.when_src))
                .help(Some(help)),
            );
            break;
        }
    }
}

/// Backends that can never be selected over the whole pack.
fn selectability_lints(
    policy: &Policy,
    m: &mut Mdd,
    d: &PolicyDiagrams,
    out: &mut Vec<Diagnostic>,
) {
    // Selectability over the whole pack.
    for (bi, bk) in policy.backends.iter().enumerate() {
        let unselectable = |why: &str| {
            Diagnostic::new(
                Code::Unselectable,
                format!("backend `{}` can never be selected: {why}", bk.name),
            )
            .at(bk.loc)
        };
        let eligible = d.ever_eligible(bi);
        let selectable = eligible && d.selectable(m, policy, bi, TRUE);
        if m.exhausted {
            out.push(incomplete(format!("backend `{}`", bk.name)));
        } else if !eligible {
            out.push(unselectable("it is declined for every input"));
        } else if !selectable {
            out.push(unselectable(
                "wherever it is eligible, a backend earlier in the preference order is too",
            ));
        }
    }
}

/// Capabilities a backend claims that are unknown, and required ones it has no disposition for.
fn capability_lints(policy: &Policy, out: &mut Vec<Diagnostic>) {
    // Capability disposition: the capabilities are the te family's (TE's features).
    let te_family = policy.schema.family == "te";
    for (bi, bk) in policy.backends.iter().enumerate().filter(|_| te_family) {
        for s in &bk.supports {
            if !CAPABILITIES.iter().any(|c| c.name == s) {
                out.push(
                    Diagnostic::new(
                        Code::UnknownCapability,
                        format!("backend `{}` supports unknown capability `{s}`", bk.name),
                    )
                    .at(bk.loc)
                    .help(Some(format!(
                        "known capabilities: {}",
                        CAPABILITIES
                            .iter()
                            .map(|c| c.name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))),
                );
            }
        }
        for c in CAPABILITIES.iter().filter(|c| c.required) {
            if bk.supports.iter().any(|s| s == c.name) {
                continue;
            }
            // A capability whose facts the pack's upstream release does not have (`softcap`
            // on te@2.19.0) needs no disposition: that release decides as if they were absent.
            let unread = |f: &str| {
                policy
                    .release
                    .as_ref()
                    .is_some_and(|r| r.ignores.iter().any(|(i, _)| i == f))
            };
            let facts_of = || {
                c.facts
                    .iter()
                    .copied()
                    .chain(c.values.iter().map(|(f, _)| *f))
            };
            if facts_of().next().is_some() && facts_of().all(unread) {
                continue;
            }
            let ruled = policy
                .rules
                .iter()
                .enumerate()
                .any(|(ri, r)| r.backend as usize == bi && disposes(policy, ri, c));
            if !ruled {
                let facts: Vec<&str> = c
                    .facts
                    .iter()
                    .copied()
                    .chain(c.values.iter().map(|(f, _)| *f))
                    .collect();
                out.push(
                    Diagnostic::new(
                        Code::Capability,
                        format!(
                            "backend `{}` has no disposition for capability `{}`",
                            bk.name, c.name
                        ),
                    )
                    .at(bk.loc)
                    .label(format!(
                        "no rule reads {} and `supports:` lacks it",
                        facts.join(" / ")
                    ))
                    .help(Some(format!(
                        "add a rule declining what `{}` cannot serve, or declare `supports: [{}]`",
                        bk.name, c.name
                    ))),
                );
            }
        }
    }
}

/// Workarounds whose `until` holds for every input the minimum versions allow.
fn obsolete_workaround_lints(policy: &Policy, out: &mut Vec<Diagnostic>) {
    let p = &policy.program;
    let eval = |node: NodeId, vals: &[Value]| Truth::of(p.eval(node, vals));
    // Obsolete workarounds: `until` holds for every input the minimum versions allow.
    for r in &policy.rules {
        let Some(until) = &r.until else { continue };
        let mut sb = SpaceBuilder::for_schema(policy.schema);
        sb.root(p, until.node);
        let mins: Vec<(usize, Value)> = policy
            .min_versions
            .iter()
            .filter_map(|(f, v)| policy.schema.slot(f).map(|s| (s, Value::Version(*v))))
            .collect();
        for &(s, v) in &mins {
            sb.split_at(s, v);
        }
        let space = sb.build();
        let um = mask_of(&until.slots);
        let res = witness(&space, RULE_BUDGET, &mut |v| {
            let mut t = not(eval(until.node, v));
            let mut m = um;
            for &(s, min) in &mins {
                let ok = match v[s] {
                    Value::Unknown => {
                        m |= slot_bit(s);
                        Truth::Unknown
                    }
                    Value::Version(x) => {
                        if Value::Version(x).compare(min) != Some(std::cmp::Ordering::Less) {
                            Truth::True
                        } else {
                            Truth::False
                        }
                    }
                    _ => Truth::True,
                };
                t = and(t, ok);
            }
            tri(t, m)
        });
        match res {
            Ok(None) => {
                let mins_text: Vec<String> = policy
                    .min_versions
                    .iter()
                    .map(|(f, v)| format!("{f} >= {v}"))
                    .collect();
                out.push(
                    Diagnostic::new(Code::ObsoleteWorkaround,
                        format!(
                            "workaround `{}` is obsolete: `until: {}` holds for every supported input{}",
                            r.id,
                            r.until_src.as_deref().unwrap_or(""),
                            if mins_text.is_empty() {
                                String::new()
                            } else {
                                format!(" ({})", mins_text.join(", "))
                            }
                        ),
                    )
                    .at(r.loc)
                    .help(Some(format!("delete rule `{}`", r.id))),
                );
            }
            Err(()) => out.push(incomplete(format!("until of `{}`", r.id))),
            Ok(Some(_)) => {}
        }
    }
}

/// The executor-chain lints: an entry whose executor admits nothing its backend admits
/// (`W-DEAD-EXECUTOR`), and inputs where a backend is selected but no entry of its chain can
/// run (`W-NO-EXECUTOR`, with an example). Entries whose executor states no `admits`
/// condition for this family make no claim either way: a chain holding one is not linted
/// for `W-NO-EXECUTOR`.
fn executor_lints(policy: &Policy, m: &mut Mdd, d: &PolicyDiagrams, out: &mut Vec<Diagnostic>) {
    let prog = m.program(&policy.program);
    let admits: Vec<Id> = policy
        .executor_admits
        .iter()
        .map(|(_, c)| m.condition(prog, c.node))
        .collect();
    for chain in &policy.executor_chains {
        let b = chain.backend as usize;
        let bk = &policy.backends[b];
        let scope = match chain.variant {
            Some(v) => format!(
                "backend `{}` variant `{}`",
                bk.name, bk.variants[v as usize].name
            ),
            None => format!("backend `{}`", bk.name),
        };
        // The chain serves where the backend (or that variant) is eligible: where `out` is
        // false. Its complement is never built (FusedAttention's `out` is ~360k nodes).
        let out_of_chain = match chain.variant {
            Some(v) => d.variant_out(m, b, v as usize, TRUE),
            None => d.declined_within(m, b, TRUE),
        };
        let mut runs = FALSE;
        let mut all_known = true;
        for e in &chain.entries {
            let Some(a) = e.admits.map(|i| admits[i]) else {
                all_known = false;
                continue;
            };
            if out_of_chain != TRUE && !m.satisfiable(&[(a, true), (out_of_chain, false)]) {
                out.push(
                    Diagnostic::new(
                        Code::DeadExecutor,
                        format!(
                            "executor `{}` in the chain of {scope} can never run: its manifest admits nothing the backend admits",
                            e.executor
                        ),
                    )
                    .at(e.loc)
                    .help(Some(format!(
                        "remove `{}` from the chain, or see `attn-policy executors` for what it runs",
                        e.executor
                    ))),
                );
            }
            runs = m.or(runs, a);
        }
        if m.exhausted {
            out.push(incomplete(format!("executor chain of {scope}")));
            return;
        }
        if !all_known {
            continue;
        }
        // `not out and not runs`, built from the small side.
        let idle = m.not(runs);
        let stranded = m.minus(idle, out_of_chain);
        if stranded == FALSE {
            continue;
        }
        let example = m
            .first_cube(stranded)
            .and_then(|c| example_of(m, &c))
            .map(|j| format!("e.g. {j}"));
        out.push(
            Diagnostic::new(
                Code::NoExecutor,
                format!(
                    "{scope} admits inputs that no entry of its executor chain ({}) can run",
                    chain
                        .entries
                        .iter()
                        .map(|e| e.executor.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
            .at(chain.loc)
            .label("such decisions cannot run here: `attn-policy run` exits 4")
            .help(example),
        );
    }
}
