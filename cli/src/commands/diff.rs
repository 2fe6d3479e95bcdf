//! `attn-policy diff OLD NEW`: where two packs decide differently.

use clap::Args;

use super::progress::Progress;

use attn_policy_analysis::regions::{
    CorpusConfig, DEFAULT_BUDGET, DiffReport, Restriction, diff_over_corpus,
};

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

Each region has a kind: `gained` (a backend serves it that did not), `lost` (none serves it
now) or `switched` (both serve, another backend or variant is chosen), and the rule ids
responsible on each side (`old_rules`: fire in the old pack only; `new_rules`: in the new one
only). With --corpus FILE, each region also counts the corpus's configurations in it
(`corpus_count`, with the first one's id as `corpus_example_id`) and the regions are listed
most-hit first: the effect of the change on real traffic.

With --format md, the regions as a Markdown report for review (docs/changes/): grouped by
kind, old and new decision and the rules responsible on each side, with each group's corpus
count, most-hit group first; each region with its own constraints, count and example id. The
report starts with the command that generated it (rerun it to regenerate the file).

Examples:
  attn-policy diff te rules/te-edited
  attn-policy diff old-pack/ new-pack/ --json
  attn-policy diff te@2.19.0 te@2.20.2 --corpus tests/corpora/te-2.20.2-corpus-a.jsonl.gz
  attn-policy diff te rules/te-edited --format matrix --rows head_dim --cols sm
  attn-policy diff te@2.18.0 te@2.19.0 --corpus tests/corpora/te-2.19.0-corpus-a.jsonl.gz \\
    --max-regions 400 --format md > docs/changes/te-2.18.0-to-2.19.0.md

Exit codes: 0 no difference (search complete), 1 differences found, 2 bad rules or a bad
--where, 3 none found but the search ran out of budget (INCOMPLETE: no claim either way).")]
pub struct DiffArgs {
    /// Old pack: a folder holding pack.yaml, or an embedded pack name (te, te@2.18.0,
    /// te@2.19.0, te@2.20.2, native, torch).
    pub old: String,
    /// New pack: a folder or an embedded pack name.
    pub new: String,
    /// Print {"regions": [{"constraints", "widened", "example", "old", "new", "rules", "kind",
    /// "old_rules", "new_rules"}]} as JSON (with --corpus also "corpus_count",
    /// "corpus_example_id", and a "corpus" summary).
    #[arg(long)]
    pub json: bool,
    /// A conformance corpus (JSON lines, .gz allowed): count its configurations per region
    /// and sort the regions by that count.
    #[arg(long, value_name = "FILE")]
    pub corpus: Option<std::path::PathBuf>,
    /// Only compare inputs where this condition holds (fact schema names).
    #[arg(long = "where", value_name = "EXPR")]
    pub where_: Option<String>,
    /// Decision-diagram node budget (the result says INCOMPLETE when it runs out).
    #[arg(long, default_value_t = DEFAULT_BUDGET)]
    pub budget: u64,
    #[command(flatten)]
    pub te: super::args::TeVersionArg,
    /// List at most N regions (the differences are still computed exactly; the listing then
    /// says how it was cut).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_DIFF_REGIONS)]
    pub max_regions: usize,
    /// `regions` (the default), `matrix` (both packs' matrices side by side) or `md` (the
    /// regions as a Markdown review report, grouped by change).
    #[arg(long, value_enum, default_value_t = DiffFormat::Regions)]
    pub format: DiffFormat,
    /// With --format md: list at most N regions per group, the most-hit (the others are
    /// counted; --json has them all).
    #[arg(long, value_name = "N")]
    pub group_regions: Option<usize>,
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
    /// The regions as a Markdown review report, grouped by kind, decisions and rules.
    Md,
}

/// `--format matrix`: both matrices of one query, side by side.
fn run_matrix(a: &DiffArgs, old: &Policy, new: &Policy) -> i32 {
    let query = match a.matrix.query() {
        Ok(q) => q,
        Err(e) => return super::fail(e),
    };
    let progress = Progress::start(format!(
        "diff: the matrices of `{}` and `{}` (--free {})",
        a.old, a.new, a.matrix.free
    ));
    let built = (
        attn_policy_analysis::matrix::build(old, &query, a.budget),
        attn_policy_analysis::matrix::build(new, &query, a.budget),
    );
    progress.finish();
    let (mo, mn) = match built {
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

fn load(spec: &str, te_version: Option<&str>) -> Result<Policy, i32> {
    let spec = PackSpec::parse(spec)
        .map_err(super::fail)?
        .with_catalogue(super::args::catalogue())
        .with_installed_release(te_version.map(str::to_string));
    super::args::load_spec_warned(&spec, false)
}

pub fn run(a: DiffArgs) -> i32 {
    let (old, new) = match (
        load(&a.old, a.te.te_version.as_deref()),
        load(&a.new, a.te.te_version.as_deref()),
    ) {
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
    if a.format == DiffFormat::Md && a.json {
        return super::fail("--format md and --json are two outputs: choose one");
    }
    if a.group_regions.is_some() && a.format != DiffFormat::Md {
        return super::fail("--group-regions goes with --format md");
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
    let progress = Progress::start(match &a.corpus {
        Some(p) => format!("diff: reading {}", p.display()),
        None => format!("diff: comparing `{}` and `{}`", a.old, a.new),
    });
    let corpus = match a.corpus.as_deref().map(|p| read_corpus(p, &old, &new)) {
        None => None,
        Some(Ok(c)) => Some(c),
        Some(Err(e)) => return progress.fail(e),
    };
    progress.stage(format!(
        "diff: comparing `{}` and `{}` over every equivalence class{}",
        a.old,
        a.new,
        match &corpus {
            Some((c, _)) => format!(", counting {} corpus configurations per region", c.len()),
            None => String::new(),
        }
    ));
    let (mut report, _) = diff_over_corpus(
        &old,
        &new,
        restrict.as_ref(),
        a.budget,
        a.max_regions,
        corpus.as_ref().map(|c| c.0.as_slice()),
    );
    progress.finish();
    if let (Some(summary), Some((_, errors))) = (report.corpus.as_mut(), &corpus) {
        summary.input_errors = *errors as u64;
    }
    if a.format == DiffFormat::Md {
        print!(
            "{}",
            super::diff_md::to_markdown(
                &report,
                &command_line(&a),
                (&a.old, &a.new),
                a.group_regions
            )
        );
    } else if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("serialisable")
        );
    } else {
        print_text(&report);
    }
    super::analysis_exit(!report.regions.is_empty(), report.complete)
}

/// The text output: the summary by backend pair and rules, the corpus summary, the regions.
fn print_text(report: &DiffReport) {
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
    print_corpus_summary(report);
    let list = |v: &[String]| {
        if v.is_empty() {
            "-".to_string()
        } else {
            v.join(", ")
        }
    };
    for (i, r) in report.regions.iter().enumerate() {
        let count = match (r.corpus_count, &r.corpus_example_id) {
            (Some(n), Some(id)) => format!("\n   corpus: {n} configuration(s), e.g. {id}"),
            (Some(n), None) => format!("\n   corpus: {n} configuration(s)"),
            _ => String::new(),
        };
        println!(
            "\n{}. {}: {} -> {}\n   where {}\n   rules: old {} | new {}{count}\n   example: {}",
            i + 1,
            r.kind.as_str(),
            show(&r.old, &r.old_variant),
            show(&r.new, &r.new_variant),
            super::gaps::where_text(&r.widened),
            list(&r.old_rules),
            list(&r.new_rules),
            serde_json::to_string(&r.example).expect("json")
        );
    }
}

/// The command line of a `--format md` run, canonical (arguments in a fixed order, defaults
/// left out), as the report prints it.
fn command_line(a: &DiffArgs) -> String {
    let quote = |s: &str| {
        if !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "@._-/:=+,".contains(c))
        {
            s.to_string()
        } else {
            format!("'{}'", s.replace('\'', r"'\''"))
        }
    };
    let mut words = vec!["attn-policy diff".to_string(), quote(&a.old), quote(&a.new)];
    if let Some(c) = &a.corpus {
        words.push(format!("--corpus {}", quote(&c.to_string_lossy())));
    }
    if let Some(w) = &a.where_ {
        words.push(format!("--where {}", quote(w)));
    }
    if a.budget != DEFAULT_BUDGET {
        words.push(format!("--budget {}", a.budget));
    }
    if a.max_regions != DEFAULT_DIFF_REGIONS {
        words.push(format!("--max-regions {}", a.max_regions));
    }
    if let Some(n) = a.group_regions {
        words.push(format!("--group-regions {n}"));
    }
    words.push("--format md".to_string());
    words.join(" ")
}

/// The corpus as each pack reads it, and how many records could not be read (input errors:
/// structurally invalid configurations, excluded from the counts).
fn read_corpus(
    path: &std::path::Path,
    old: &Policy,
    new: &Policy,
) -> Result<(Vec<CorpusConfig>, usize), String> {
    let records = attn_policy::read_corpus(path).map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(records.len());
    let mut errors = 0;
    for rec in &records {
        match (
            attn_policy::conformance::read_record(old, rec),
            attn_policy::conformance::read_record(new, rec),
        ) {
            (Ok(o), Ok(n)) => out.push(CorpusConfig {
                id: rec.id.clone(),
                old: o,
                new: n,
                config: rec.config.clone(),
            }),
            _ => errors += 1,
        }
    }
    Ok((out, errors))
}

fn print_corpus_summary(report: &DiffReport) {
    let Some(c) = &report.corpus else { return };
    println!(
        "\ncorpus: {} configuration(s) read ({} input error(s) excluded), {} decided \
         differently{}",
        c.configurations,
        c.input_errors,
        c.decided_differently,
        if c.outside_listed_regions > 0 {
            format!(
                ", {} of them outside the listed regions (raise --max-regions)",
                c.outside_listed_regions
            )
        } else {
            String::new()
        }
    );
}
