//! `attn-policy gaps`: every region of the configuration space where no backend is selected.

use std::time::Instant;

use clap::Args;

use super::args::PackArgs;
use super::progress::Progress;
use attn_policy_analysis::regions::{
    DEFAULT_BUDGET, DEFAULT_MAX_REGIONS, GapReport, Restriction, gaps_only,
};

#[derive(Args, Debug)]
#[command(after_help = "\
Exact and exhaustive: facts are split into equivalence classes at the constants the rules
compare them with (residues for `%`, every enum value); every condition becomes a decision
diagram over those classes, and \"nothing selected\" is computed over the whole space at once.
Regions are a cover of that set (their union is exactly the gaps; they may overlap), largest
first; each omits the facts whose value does not change the outcome anywhere in it. Probe
facts are answered \"supported\". See docs/analysis.md.

Examples:
  attn-policy gaps
  attn-policy gaps --rules rules/te --where 'sm == 90 and context_parallel'
  attn-policy gaps --where 'head_dim_qk == head_dim_v' --json
  attn-policy gaps --pack torch --only math --where 'sm == 90'   # where only math serves

Exit codes: 0 no gaps (search complete), 1 gaps found, 2 bad rules or a bad --where,
3 the diagram budget ran out, or an evaluation stayed unknown, and no gap was found
(INCOMPLETE: no claim either way).")]
pub struct GapsArgs {
    #[command(flatten)]
    pub pack: PackArgs,
    /// Only search inputs where this condition holds (fact schema names; pack defs not available).
    #[arg(long = "where", value_name = "EXPR")]
    pub where_: Option<String>,
    /// Instead of the gaps, every region where BACKEND is the only eligible backend (the one
    /// thing that serves there, e.g. `--only math`).
    #[arg(long, value_name = "BACKEND")]
    pub only: Option<String>,
    /// Print {"regions": [...], "classes_examined": N, ...} as JSON.
    #[arg(long)]
    pub json: bool,
    /// Decision-diagram node budget (the result says INCOMPLETE when it runs out).
    #[arg(long, default_value_t = DEFAULT_BUDGET)]
    pub budget: u64,
    /// List at most N regions (the gaps are still computed exactly; the listing then says
    /// how it was cut).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_REGIONS)]
    pub max_regions: usize,
}

pub fn run(a: GapsArgs) -> i32 {
    let policy = match a.pack.load(false) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let restrict = match a
        .where_
        .as_deref()
        .map(|w| Restriction::parse_for(policy.schema, w))
        .transpose()
    {
        Ok(r) => r,
        Err(e) => return super::fail(e),
    };
    let only = match a.only.as_deref().map(|b| {
        policy.backend_index(b).ok_or_else(|| {
            let names: Vec<&str> = policy.backends.iter().map(|b| b.name.as_str()).collect();
            let hint = attn_policy::facts::did_you_mean(b, names.iter().copied())
                .map(|h| format!(" (did you mean `{h}`?)"))
                .unwrap_or_default();
            format!(
                "--only: pack `{}` has no backend `{b}`{hint}; backends: {}",
                policy.name,
                names.join(", ")
            )
        })
    }) {
        None => None,
        Some(Ok(b)) => Some(b),
        Some(Err(e)) => return super::fail(e),
    };
    let progress = Progress::start(format!(
        "gaps: searching pack `{}` (exact, over every equivalence class)",
        policy.name
    ));
    let t = Instant::now();
    let (report, _) = gaps_only(&policy, restrict.as_ref(), a.budget, a.max_regions, only);
    let elapsed = t.elapsed();
    progress.finish();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("serialisable")
        );
    } else {
        print!("{}", human(&policy.name, &report, elapsed.as_secs_f64()));
    }
    super::analysis_exit(report.gaps_exist, report.complete)
}

fn human(pack: &str, r: &GapReport, secs: f64) -> String {
    let mut out = String::new();
    if !r.complete {
        out.push_str(
            "INCOMPLETE: the search ran out of budget, an evaluation stayed unknown, or a region \
             had no example found; what follows is not the whole answer (raise --budget or \
             narrow with --where)\n",
        );
    }
    let what = match &r.only {
        Some(b) => format!("only {b} serves (every other backend is declined)"),
        None => "no backend is selected".to_string(),
    };
    out.push_str(&format!(
        "pack `{pack}`: {} region(s) where {what}{}\n",
        r.regions.len(),
        if r.regions_truncated {
            " (the first of more: raise --max-regions or narrow with --where)"
        } else {
            ""
        }
    ));
    // Summary first: regions grouped by the rules that decline there, with the shortest
    // region of each group as its representative.
    let mut groups: Vec<(Vec<String>, usize, String)> = Vec::new();
    for g in &r.regions {
        let mut rules: Vec<String> = g.declined_by.values().flatten().cloned().collect();
        rules.sort();
        rules.dedup();
        let text = where_text(&g.constraints);
        match groups.iter_mut().find(|(k, _, _)| *k == rules) {
            Some((_, n, rep)) => {
                *n += 1;
                if text.len() < rep.len() {
                    *rep = text;
                }
            }
            None => groups.push((rules, 1, text)),
        }
    }
    if !groups.is_empty() {
        out.push_str("\nsummary (regions by the rules that decline there):\n");
        groups.sort_by_key(|g| std::cmp::Reverse(g.1));
        for (rules, n, rep) in &groups {
            out.push_str(&format!(
                "  {n:>3} region(s)  declined by {}\n               e.g. {rep}\n",
                if rules.is_empty() {
                    "-".to_string()
                } else {
                    rules.join(", ")
                }
            ));
        }
    }
    for (i, g) in r.regions.iter().enumerate() {
        out.push_str(&format!("\n{}. {}\n", i + 1, where_text(&g.constraints)));
        out.push_str(&format!(
            "   example: {}\n",
            serde_json::to_string(&g.example).expect("json")
        ));
        for (b, ids) in &g.declined_by {
            out.push_str(&format!("   {b}: declined by {}\n", ids.join(", ")));
        }
        for (b, vs) in &g.not_applicable {
            out.push_str(&format!("   {b}: not applicable: {}\n", vs.join(", ")));
        }
    }
    out.push_str(&format!(
        "\n{} equivalence classes examined ({} diagram nodes, {} facts enumerated) in {:.3} s{}\n",
        r.classes_examined,
        r.diagram_nodes,
        r.facts_enumerated,
        secs,
        if r.complete { "" } else { " (INCOMPLETE)" }
    ));
    if r.regions_merged > 0 {
        out.push_str(&format!(
            "{} more region(s) of the cover not listed: with the facts that do not matter \
             dropped, each lies inside a region listed above\n",
            r.regions_merged
        ));
    }
    if r.regions_unverified > 0 {
        out.push_str(&format!(
            "{} region(s) not listed: no example found in them (they may be empty: conditions \
             sharing facts are not tied to each other)\n",
            r.regions_unverified
        ));
    }
    out.push_str("assumptions: ");
    out.push_str(&r.assumptions.join("; "));
    out.push('\n');
    out
}

/// A region's constraints joined with `and` (`everywhere` when it has none).
pub fn where_text(constraints: &serde_json::Map<String, serde_json::Value>) -> String {
    let cons: Vec<String> = constraints
        .values()
        .filter_map(|v| v.as_str().map(parenthesised))
        .collect();
    if cons.is_empty() {
        "everywhere".to_string()
    } else {
        cons.join(" and ")
    }
}

/// A constraint ready to be joined with `and` (one containing `or` is parenthesised).
pub fn parenthesised(c: &str) -> String {
    if c.contains(" or ") {
        format!("({c})")
    } else {
        c.to_string()
    }
}
