//! `attn-policy diff OLD NEW`: where two packs decide differently.

use clap::Args;

use attn_policy_analysis::regions::{DEFAULT_BUDGET, Restriction, diff};

/// How many regions `diff` lists by default.
pub const DEFAULT_DIFF_REGIONS: usize = 50;
use attn_policy::{PackSpec, Policy};

#[derive(Args, Debug)]
#[command(after_help = "\
Semantic diff over the same equivalence classes as `gaps`: every region whose selected backend
(or variant) changes, with the rules that fire in one pack and not the other there. Exact: per
pack, the decision diagram of each outcome; the regions are a disjoint cover of every pair of
differing outcomes (listing cut at --max-regions, which says so). Each region is printed
without the facts whose value does not change its two decisions, so printed regions may
overlap; --json keeps the disjoint cubes in `constraints` and the printed ones in `widened`.

With --format matrix, both packs' support matrices of one query (--rows, --cols, --fix,
--free as for `attn-policy matrix`) side by side as Markdown, each row's old cells above its
new ones, changed cells marked (--json: both matrices and the changed cells).

Examples:
  attn-policy diff te rules/te-edited
  attn-policy diff old-pack/ new-pack/ --json
  attn-policy diff te rules/te-edited --format matrix --rows head_dim --cols sm

Exit codes: 0 no difference (search complete), 1 differences found, 2 bad rules or a bad
--where, 3 none found but the search ran out of budget (INCOMPLETE: no claim either way).")]
pub struct DiffArgs {
    /// Old pack: a folder holding pack.yaml, or an embedded pack name (te, native).
    pub old: String,
    /// New pack: a folder or an embedded pack name.
    pub new: String,
    /// Print {"regions": [{"constraints", "widened", "example", "old", "new", "rules"}]} as JSON.
    #[arg(long)]
    pub json: bool,
    /// Only compare inputs where this condition holds (fact schema names).
    #[arg(long = "where", value_name = "EXPR")]
    pub where_: Option<String>,
    /// Decision-diagram node budget (the result says INCOMPLETE when it runs out).
    #[arg(long, default_value_t = DEFAULT_BUDGET)]
    pub budget: u64,
    /// List at most N regions (the differences are still computed exactly; the listing then
    /// says how it was cut).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_DIFF_REGIONS)]
    pub max_regions: usize,
    /// `regions` (the default) or `matrix`: both packs' matrices side by side.
    #[arg(long, value_enum, default_value_t = DiffFormat::Regions)]
    pub format: DiffFormat,
    /// The matrix (with --format matrix).
    #[command(flatten)]
    pub matrix: super::matrix::MatrixQueryArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum DiffFormat {
    /// Regions where the decisions differ.
    #[default]
    Regions,
    /// Both packs' support matrices side by side, changed cells marked.
    Matrix,
}

/// `--format matrix`: both matrices of one query, side by side.
fn run_matrix(a: &DiffArgs, old: &Policy, new: &Policy) -> i32 {
    let query = match a.matrix.query() {
        Ok(q) => q,
        Err(e) => return super::fail(e),
    };
    let (mo, mn) = match (
        attn_policy_analysis::matrix::build(old, &query, a.budget),
        attn_policy_analysis::matrix::build(new, &query, a.budget),
    ) {
        (Ok(o), Ok(n)) => (o, n),
        (Err(e), _) | (_, Err(e)) => return super::fail(e),
    };
    let d = attn_policy_analysis::matrix::MatrixDiff {
        old: &mo,
        new: &mn,
        old_name: a.old.clone(),
        new_name: a.new.clone(),
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&d.to_json()).expect("serialisable")
        );
    } else {
        print!("{}", d.to_markdown());
    }
    let changed = d.changes().iter().any(Option::is_some);
    super::analysis_exit(changed, mo.complete && mn.complete)
}

fn load(spec: &str) -> Result<Policy, i32> {
    let spec = PackSpec::parse(spec)
        .map_err(super::fail)?
        .with_catalogue(super::args::catalogue());
    super::args::load_spec(&spec, false)
}

pub fn run(a: DiffArgs) -> i32 {
    let (old, new) = match (load(&a.old), load(&a.new)) {
        (Ok(o), Ok(n)) => (o, n),
        (Err(c), _) | (_, Err(c)) => return c,
    };
    if old.schema != new.schema {
        return super::fail(format!(
            "pack `{}` (family `{}`) and pack `{}` (family `{}`) decide over different facts; \
             diff compares packs of one family",
            old.name, old.schema.family, new.name, new.schema.family
        ));
    }
    if a.format == DiffFormat::Matrix {
        return run_matrix(&a, &old, &new);
    }
    if a.matrix.rows.is_some() || a.matrix.cols.is_some() || !a.matrix.fix.is_empty() {
        return super::fail("--rows, --cols and --fix go with --format matrix");
    }
    let restrict = match a
        .where_
        .as_deref()
        .map(|w| Restriction::parse_for(old.schema, w))
        .transpose()
    {
        Ok(r) => r,
        Err(e) => return super::fail(e),
    };
    let (report, _) = diff(&old, &new, restrict.as_ref(), a.budget, a.max_regions);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("serialisable")
        );
    } else {
        if !report.complete {
            println!(
                "INCOMPLETE: the search ran out of budget, an evaluation stayed unknown, or a \
                 region had no example found; what follows is not the whole answer"
            );
        }
        println!(
            "{} region(s) decide differently{} ({} classes examined, {} diagram nodes)",
            report.regions.len(),
            if report.regions_truncated {
                " (the first of more: raise --max-regions or narrow with --where)"
            } else {
                ""
            },
            report.classes_examined,
            report.diagram_nodes,
        );
        if report.regions_unverified > 0 {
            println!(
                "{} region(s) not listed: no example found in them (they may be empty)",
                report.regions_unverified
            );
        }
        let show = |b: &Option<String>, v: &Option<String>| match (b, v) {
            (None, _) => "none".to_string(),
            (Some(b), None) => b.clone(),
            (Some(b), Some(v)) => format!("{b} ({v})"),
        };
        // Summary first: per backend pair and deciding rules, how many regions, and the
        // shortest of them.
        let mut groups: Vec<(String, String, usize, String)> = Vec::new();
        for r in &report.regions {
            let pair = format!(
                "{} -> {}",
                show(&r.old, &r.old_variant),
                show(&r.new, &r.new_variant)
            );
            let rules = if r.rules.is_empty() {
                "-".to_string()
            } else {
                r.rules.join(", ")
            };
            let text = super::gaps::where_text(&r.widened);
            match groups
                .iter_mut()
                .find(|(p, k, _, _)| *p == pair && *k == rules)
            {
                Some((_, _, n, rep)) => {
                    *n += 1;
                    if text.len() < rep.len() {
                        *rep = text;
                    }
                }
                None => groups.push((pair, rules, 1, text)),
            }
        }
        if !groups.is_empty() {
            println!("\nsummary (regions by backend pair and the rules that differ there):");
            groups.sort_by_key(|g| std::cmp::Reverse(g.2));
            for (pair, rules, n, rep) in &groups {
                println!("  {n:>3} region(s)  {pair}  (rules: {rules})\n               e.g. {rep}");
            }
        }
        for (i, r) in report.regions.iter().enumerate() {
            println!(
                "\n{}. {} -> {}\n   where {}\n   rules: {}\n   example: {}",
                i + 1,
                show(&r.old, &r.old_variant),
                show(&r.new, &r.new_variant),
                super::gaps::where_text(&r.widened),
                if r.rules.is_empty() {
                    "-".to_string()
                } else {
                    r.rules.join(", ")
                },
                serde_json::to_string(&r.example).expect("json")
            );
        }
    }
    super::analysis_exit(!report.regions.is_empty(), report.complete)
}
