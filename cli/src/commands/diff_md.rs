//! `attn-policy diff OLD NEW --format md`: the regions of a diff as a Markdown review report,
//! grouped by the kind of change (docs/analysis.md, docs/changes/).
//!
//! A group is one (kind, old decision, new decision, old-side rules, new-side rules); groups
//! are sorted by their corpus configurations (most first), then by those keys, so the output
//! is deterministic. Every listed region is printed, inside its group, with the constraints
//! its group does not share.

use std::cmp::Reverse;
use std::fmt::Write as _;

use serde_json::{Map, Value as Json};

use attn_policy_analysis::regions::{DiffRegion, DiffReport};

/// One group of regions: the same change, decided by the same rules of the two backends
/// involved.
struct Group<'r> {
    kind: &'static str,
    old: String,
    new: String,
    old_rules: String,
    new_rules: String,
    /// Rules of other backends whose firing also differs in some region of the group.
    others: std::collections::BTreeSet<String>,
    /// The regions, most-hit first (ties in listing order).
    regions: Vec<&'r DiffRegion>,
    count: u64,
}

/// `backend (variant)`, or `none`.
fn outcome(b: &Option<String>, v: &Option<String>) -> String {
    match (b, v) {
        (None, _) => "none".to_string(),
        (Some(b), None) => b.clone(),
        (Some(b), Some(v)) => format!("{b} ({v})"),
    }
}

fn rule_list(v: &[String]) -> String {
    if v.is_empty() {
        "-".to_string()
    } else {
        v.join(", ")
    }
}

/// Text for a Markdown table cell or inline code: no line breaks, `|` escaped.
fn cell(s: &str) -> String {
    s.replace('\n', " ").replace('|', "\\|")
}

/// Whether rule `id` (of a region's `rules`) belongs to the backend selected on either side
/// (`changed_rules` names each rule's backend: `id@backend`); a preference entry, or a rule
/// `changed_rules` does not name, counts as involved.
fn involved(report: &DiffReport, r: &DiffRegion, id: &str) -> bool {
    let mut backends = report
        .changed_rules
        .iter()
        .filter_map(|c| c.split_once('@'))
        .filter(|(i, _)| *i == id)
        .map(|(_, b)| b)
        .peekable();
    if id.starts_with("preference:") || backends.peek().is_none() {
        return true;
    }
    backends.any(|b| r.old.as_deref() == Some(b) || r.new.as_deref() == Some(b))
}

fn groups(report: &DiffReport) -> Vec<Group<'_>> {
    let mut out: Vec<Group> = Vec::new();
    for r in &report.regions {
        let side = |v: &[String]| -> Vec<String> {
            v.iter()
                .filter(|id| involved(report, r, id))
                .cloned()
                .collect()
        };
        let others = r
            .rules
            .iter()
            .filter(|id| !involved(report, r, id))
            .cloned();
        let key = (
            r.kind.as_str(),
            outcome(&r.old, &r.old_variant),
            outcome(&r.new, &r.new_variant),
            rule_list(&side(&r.old_rules)),
            rule_list(&side(&r.new_rules)),
        );
        let n = r.corpus_count.unwrap_or(0);
        match out.iter_mut().find(|g| {
            (g.kind, &g.old, &g.new, &g.old_rules, &g.new_rules)
                == (key.0, &key.1, &key.2, &key.3, &key.4)
        }) {
            Some(g) => {
                g.regions.push(r);
                g.count += n;
                g.others.extend(others);
            }
            None => out.push(Group {
                kind: key.0,
                old: key.1,
                new: key.2,
                old_rules: key.3,
                new_rules: key.4,
                others: others.collect(),
                regions: vec![r],
                count: n,
            }),
        }
    }
    for g in &mut out {
        // Stable: ties keep the listing order (itself most-hit first, then corpus order).
        g.regions
            .sort_by_key(|r| Reverse(r.corpus_count.unwrap_or(0)));
    }
    out.sort_by(|a, b| {
        (
            Reverse(a.count),
            a.kind,
            &a.old,
            &a.new,
            &a.old_rules,
            &a.new_rules,
        )
            .cmp(&(
                Reverse(b.count),
                b.kind,
                &b.old,
                &b.new,
                &b.old_rules,
                &b.new_rules,
            ))
    });
    out
}

/// The constraints every region of the group states alike (same fact, same text).
fn common(g: &Group) -> Map<String, Json> {
    let mut c = g.regions[0].widened.clone();
    for r in &g.regions[1..] {
        c.retain(|k, v| r.widened.get(k) == Some(v));
    }
    c
}

/// With a corpus, how many regions holding none of its configurations a group lists (the
/// others are counted; `--json` has them all).
const ZERO_HIT_SHOWN: usize = 3;

/// A constraint text at least this long that several regions of a group share is printed
/// once, in the group's legend, and named `fact#n` in the regions.
const LEGEND_MIN_LEN: usize = 40;

/// Per fact, the long constraint texts that several regions of the group (outside the common
/// ones) share, in order of first use: the legend.
fn legend(regions: &[&DiffRegion], common: &Map<String, Json>) -> Vec<(String, String)> {
    let mut seen: Vec<(String, String, usize)> = Vec::new();
    for r in regions {
        for (k, v) in &r.widened {
            let Some(t) = v.as_str() else { continue };
            if common.contains_key(k) || t.len() < LEGEND_MIN_LEN {
                continue;
            }
            match seen.iter_mut().find(|(sk, st, _)| sk == k && st == t) {
                Some(e) => e.2 += 1,
                None => seen.push((k.clone(), t.to_string(), 1)),
            }
        }
    }
    let mut out: Vec<(String, String)> = Vec::new();
    for (k, t, n) in seen {
        if n >= 2 {
            let i = out
                .iter()
                .filter(|(l, _)| l.split('#').next() == Some(&k))
                .count();
            out.push((format!("{k}#{}", i + 1), t));
        }
    }
    out
}

/// A region's constraints without the group's common ones, a legend entry by its name.
fn own(r: &DiffRegion, common: &Map<String, Json>, legend: &[(String, String)]) -> String {
    let parts: Vec<String> = r
        .widened
        .iter()
        .filter(|(k, _)| !common.contains_key(*k))
        .filter_map(|(k, v)| {
            let t = v.as_str()?;
            Some(
                match legend
                    .iter()
                    .find(|(l, lt)| lt == t && l.split('#').next() == Some(k.as_str()))
                {
                    Some((l, _)) => format!("[{l}]"),
                    None => super::gaps::parenthesised(t),
                },
            )
        })
        .collect();
    if parts.is_empty() {
        "(the common constraints only)".to_string()
    } else {
        parts.join(" and ")
    }
}

/// The header: the command, the corpus summary and how complete the listing is.
fn header(out: &mut String, report: &DiffReport, command: &str, titles: (&str, &str)) {
    let (old, new) = titles;
    let _ = writeln!(out, "# `{old}` -> `{new}`: where the decisions differ\n");
    let _ = writeln!(
        out,
        "Generated by `attn-policy diff --format md` (from the repository root; rerun it to \
         regenerate this file):\n\n    {command}\n"
    );
    if !report.complete {
        let _ = writeln!(
            out,
            "**INCOMPLETE**: the search ran out of budget, an evaluation stayed unknown, or a \
             region had no example found; what follows is not the whole answer.\n"
        );
    }
    if let Some(c) = &report.corpus {
        let _ = writeln!(
            out,
            "Corpus: {} configuration(s) read ({} input error(s) excluded, as in both packs), {} \
             decided differently, {}.",
            c.configurations,
            c.input_errors,
            c.decided_differently,
            if c.outside_listed_regions == 0 {
                "each in a listed region".to_string()
            } else {
                format!(
                    "{} of them in no listed region (the listing is cut at --max-regions, or no \
                     region the search placed holds them)",
                    c.outside_listed_regions
                )
            }
        );
    }
    let hit = report
        .regions
        .iter()
        .filter(|r| r.corpus_count.unwrap_or(0) > 0)
        .count();
    let _ = writeln!(
        out,
        "Regions: {} listed{}{}.\n",
        report.regions.len(),
        if report.corpus.is_some() {
            format!(", {hit} of them holding corpus configurations")
        } else {
            String::new()
        },
        if report.regions_truncated {
            "; the listing is cut at --max-regions (the regions past it hold no corpus \
             configuration when the corpus line says each is in a listed region)"
        } else {
            "; every region where the decisions differ"
        }
    );
    let _ = writeln!(
        out,
        "A group is one kind of change: the same kind (`gained`: a backend serves it that did \
         not; `lost`; `switched`: both serve, another is chosen), old and new decision, and rule \
         ids responsible on each side (old: fire in the old pack only; new: in the new pack \
         only), of the two backends selected (the rules of other backends whose firing differs \
         there are listed per group; `--json` has every region's `old_rules` and `new_rules`). Groups and their regions are sorted by corpus configurations, most first. Each \
         region is printed without the constraints common to its group; the JSON \
         (`--json`) has every region's full constraints and example.\n"
    );
}

/// The report as Markdown; `command` is the command line that produced it.
/// `per_group`: list at most that many regions per group (`--group-regions`).
pub fn to_markdown(
    report: &DiffReport,
    command: &str,
    titles: (&str, &str),
    per_group: Option<usize>,
) -> String {
    let mut out = String::new();
    header(&mut out, report, command, titles);
    let gs = groups(report);
    let with_corpus = report.corpus.is_some();
    let _ = writeln!(out, "## Summary\n");
    let _ = writeln!(
        out,
        "| group | kind | old | new | old rules | new rules | regions |{}",
        if with_corpus { " corpus |" } else { "" }
    );
    let _ = writeln!(
        out,
        "|---|---|---|---|---|---|---|{}",
        if with_corpus { "---|" } else { "" }
    );
    for (i, g) in gs.iter().enumerate() {
        let _ = write!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            i + 1,
            g.kind,
            g.old,
            g.new,
            g.old_rules,
            g.new_rules,
            g.regions.len()
        );
        if with_corpus {
            let _ = write!(out, " {} |", g.count);
        }
        out.push('\n');
    }
    for (i, g) in gs.iter().enumerate() {
        group_section(&mut out, i + 1, g, with_corpus, per_group);
    }
    out
}

fn group_section(
    out: &mut String,
    n: usize,
    g: &Group,
    with_corpus: bool,
    per_group: Option<usize>,
) {
    let _ = writeln!(out, "\n## {n}. {}: {} -> {}\n", g.kind, g.old, g.new);
    let _ = writeln!(
        out,
        "Rules: old `{}` | new `{}`. {} region(s){}.\n",
        g.old_rules,
        g.new_rules,
        g.regions.len(),
        if with_corpus {
            format!(", {} corpus configuration(s)", g.count)
        } else {
            String::new()
        }
    );
    if !g.others.is_empty() {
        let v: Vec<String> = g.others.iter().cloned().collect();
        let _ = writeln!(
            out,
            "Rules of other backends whose firing also differs in some of these regions: `{}`.\n",
            v.join(", ")
        );
    }
    // With a corpus: every region holding some of its configurations, and the first few of
    // those holding none (regions are sorted by count, so those come last).
    let hit = g
        .regions
        .iter()
        .filter(|r| r.corpus_count > Some(0))
        .count();
    let mut shown = if with_corpus {
        g.regions.len().min(hit + ZERO_HIT_SHOWN)
    } else {
        g.regions.len()
    };
    if let Some(k) = per_group {
        shown = shown.min(k.max(1));
    }
    let shared = common(g);
    if !shared.is_empty() {
        let _ = writeln!(
            out,
            "Common to every region: `{}`\n",
            cell(&super::gaps::where_text(&shared))
        );
    }
    let names = legend(&g.regions[..shown], &shared);
    if !names.is_empty() {
        let _ = writeln!(out, "Constraints several regions share (`[name]` below):\n");
        for (l, t) in &names {
            let _ = writeln!(out, "- `[{l}]`: `{}`", cell(t));
        }
        out.push('\n');
    }
    // A region holding corpus configurations has its example id in the table (the JSON
    // has every region's example configuration); else the group's first example here.
    if g.regions[0].corpus_example_id.is_none() {
        let _ = writeln!(
            out,
            "Example (region {n}.1): `{}`\n",
            cell(&serde_json::to_string(&g.regions[0].example).expect("json"))
        );
    }
    if with_corpus {
        let _ = writeln!(
            out,
            "| region | corpus | example id | where |\n|---|---|---|---|"
        );
    } else {
        let _ = writeln!(out, "| region | where |\n|---|---|");
    }
    for (j, r) in g.regions[..shown].iter().enumerate() {
        let text = cell(&own(r, &shared, &names));
        if with_corpus {
            let _ = writeln!(
                out,
                "| {n}.{} | {} | {} | `{text}` |",
                j + 1,
                r.corpus_count.unwrap_or(0),
                r.corpus_example_id.as_deref().unwrap_or("-"),
            );
        } else {
            let _ = writeln!(out, "| {n}.{} | `{text}` |", j + 1);
        }
    }
    if shown < g.regions.len() {
        let rest = &g.regions[shown..];
        let n: u64 = rest.iter().filter_map(|r| r.corpus_count).sum();
        let text = format!(
            "{} more region(s), {} holding corpus configurations ({n} in all): see --json",
            rest.len(),
            rest.iter().filter(|r| r.corpus_count > Some(0)).count()
        );
        if with_corpus {
            let _ = writeln!(out, "| ... | {n} | - | {text} |");
        } else {
            let _ = writeln!(out, "| ... | {text} |");
        }
    }
}
