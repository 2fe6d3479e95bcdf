//! `attn-policy matrix`: a support matrix generated from the rules (docs/matrix.md).

use clap::{Args, ValueEnum};

use std::path::PathBuf;

use super::progress::Progress;
use attn_policy::{PackSpec, Policy};
use attn_policy_analysis::matrix::{
    AxisQuery, DEFAULT_BUDGET, Free, Matrix, MatrixCompare, MatrixError, Query, build,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Default)]
pub enum MatrixFormat {
    /// Markdown: caption, table, notes.
    #[default]
    Md,
    /// One self-contained HTML page (hover or click a cell for its explanation).
    Html,
    /// SVG (docs, slides).
    Svg,
    /// {"pack", "rows", "cols", "fixed", "cells": [...], "free", "complete"}.
    Json,
}

/// The query flags shared with `diff --format matrix`.
#[derive(Args, Debug, Clone, Default)]
pub struct MatrixQueryArgs {
    /// Row axis: a fact or an alias (head_dim, sm, seqlen, cp_comm_type, dtype, mask,
    /// layout), with values or not: `head_dim=64,128,256`, `sm`, `window_size=null,[128,0]`.
    #[arg(long, value_name = "FACT[=V1,V2,..]")]
    pub rows: Option<String>,
    /// Column axis (as --rows).
    #[arg(long, value_name = "FACT[=V1,V2,..]")]
    pub cols: Option<String>,
    /// Fix a fact in every cell: FACT=VALUE (`qkv_dtype=bf16`, `sm=90`,
    /// `flash_attn_versions.v2=2.7.4`, `window_size=[128,0]`); FACT alone holds it (an
    /// object: every member) at its default. Repeatable.
    #[arg(long = "fix", value_name = "FACT[=VALUE]")]
    pub fix: Vec<String>,
    /// Facts the analysis lets vary (a cell that changes with them is marked, with the
    /// facts): `shape` (batch, heads, sequence lengths, head dims, CP sizes), `all`, `none`,
    /// or FACT,FACT,...; every other fact is held at its default.
    #[arg(long, value_name = "shape|all|none|FACTS", default_value = "shape")]
    pub free: String,
}

impl MatrixQueryArgs {
    pub fn query(&self) -> Result<Query, String> {
        let (Some(rows), Some(cols)) = (&self.rows, &self.cols) else {
            return Err("a matrix needs --rows FACT[=V1,..] and --cols FACT[=V1,..]".into());
        };
        Ok(Query {
            rows: AxisQuery::parse(rows),
            cols: AxisQuery::parse(cols),
            fix: self.fix.iter().map(|f| Query::parse_fix(f)).collect(),
            free: Free::parse(&self.free),
        })
    }
}

/// The flag that named an unknown fact (`--rows: `, `--cols: `, `--fix: `), so the message
/// points at what to change; empty for other errors.
fn flag_of(e: &MatrixError, q: &Query) -> &'static str {
    match e {
        MatrixError::UnknownFact { name, .. } if *name == q.rows.name => "--rows: ",
        MatrixError::UnknownFact { name, .. } if *name == q.cols.name => "--cols: ",
        MatrixError::UnknownFact { .. } => "--fix: ",
        _ => "",
    }
}

#[derive(Args, Debug)]
#[command(after_help = "\
Each cell is the backend (and variant) the pack selects for the row's and the column's
values, or none. Facts not on an axis are fixed (--fix), free (--free: the cell shows the
decision at their default, and the exact analysis covers every value; a cell that changes
with them is marked \u{25c6} with the deciding facts), or held at their default (features off,
environment unset, probes \"supported\"); the caption says which. See docs/matrix.md.

With --pack repeated, every pack's matrix of the same query, cell by cell: each row's cells
per pack one under the other, and the cells where the packs select differently marked (md:
\u{2731}; html: outlined; json: the differing list). Made for releases of one selector
(te@2.18.0, te@2.19.0, te@2.20.2). --format svg takes one pack.

Examples:
  attn-policy matrix --rows head_dim --cols sm --fix qkv_dtype=bf16 --fix attn_mask_type=causal
  attn-policy matrix --pack te@2.19.0 --pack te@2.20.2 --rows head_dim=128,256,512 --cols sm=90,100
  attn-policy matrix --rows mask --cols sm=90,100 --format html > matrix.html
  attn-policy matrix --rows cp_comm_type --cols head_dim=128,256,512 --format json

Exit codes: 0 done, 2 bad rules or a bad axis/--fix/--free, 3 INCOMPLETE (the diagram budget
ran out or an outcome had no verified example: those cells' marks are no claim).")]
pub struct MatrixArgs {
    /// The pack (embedded name or a folder holding pack.yaml); repeat to compare packs cell by
    /// cell (all of one fact family).
    #[arg(long = "pack", value_name = "NAME|DIR", default_value = "te")]
    pub packs: Vec<String>,
    /// Load the pack from a folder holding pack.yaml (one pack; as --pack DIR).
    #[arg(long, value_name = "DIR", conflicts_with = "packs")]
    pub rules: Option<PathBuf>,
    /// Site policy overlay file(s), applied to every pack (repeatable).
    #[arg(long, value_name = "FILE")]
    pub overlay: Vec<PathBuf>,
    /// Pure TransformerEngine parity: switch off the `guard` layer of every pack.
    #[arg(long)]
    pub parity: bool,
    #[command(flatten)]
    pub te: super::args::TeVersionArg,
    #[command(flatten)]
    pub query: MatrixQueryArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = MatrixFormat::Md)]
    pub format: MatrixFormat,
    /// Decision-diagram node budget (the result says INCOMPLETE when it runs out).
    #[arg(long, default_value_t = DEFAULT_BUDGET)]
    pub budget: u64,
}

/// The matrix as text in a format.
pub fn render(m: &Matrix, format: MatrixFormat) -> String {
    match format {
        MatrixFormat::Md => m.to_markdown(),
        MatrixFormat::Html => m.to_html(),
        MatrixFormat::Svg => m.to_svg(),
        MatrixFormat::Json => {
            let mut s = serde_json::to_string_pretty(&m.to_json()).expect("serialisable");
            s.push('\n');
            s
        }
    }
}

/// The packs the flags name, loaded (exit code 2 on a bad one).
fn load_packs(a: &MatrixArgs) -> Result<Vec<Policy>, i32> {
    let specs: Vec<Result<PackSpec, String>> = match &a.rules {
        Some(dir) => vec![Ok(PackSpec::dir(dir))],
        None => (a.packs.iter())
            .map(|p| PackSpec::parse(p).map_err(|e| e.to_string()))
            .collect(),
    };
    let mut out = Vec::new();
    for spec in specs {
        let spec = spec
            .map_err(super::fail)?
            .with_overlays(a.overlay.iter().cloned())
            .with_parity(a.parity)
            .with_catalogue(super::args::catalogue())
            .with_installed_release(a.te.te_version.clone());
        out.push(super::args::load_spec_warned(&spec, false)?);
    }
    Ok(out)
}

pub fn run(a: MatrixArgs) -> i32 {
    let packs = match load_packs(&a) {
        Ok(p) => p,
        Err(code) => return code,
    };
    if let Some(p) = packs.iter().find(|p| p.schema != packs[0].schema) {
        return super::fail(format!(
            "pack `{}` (family `{}`) and pack `{}` (family `{}`) decide over different facts; a \
             matrix compares packs of one family",
            packs[0].name, packs[0].schema.family, p.name, p.schema.family
        ));
    }
    if packs.len() > 1 && a.format == MatrixFormat::Svg {
        return super::fail(
            "--format svg draws one pack's matrix; use md, html or json to compare",
        );
    }
    let query = match a.query.query() {
        Ok(q) => q,
        Err(e) => return super::fail(e),
    };
    let mut matrices = Vec::new();
    let progress = Progress::start("matrix");
    for (i, policy) in packs.iter().enumerate() {
        progress.stage(format!(
            "matrix: pack `{}` ({} of {}), every cell exactly (--free {})",
            policy.name,
            i + 1,
            packs.len(),
            a.query.free
        ));
        match build(policy, &query, a.budget) {
            Ok(m) => matrices.push(m),
            Err(e) => return progress.fail(format!("{}{e}", flag_of(&e, &query))),
        }
    }
    progress.finish();
    let complete = matrices.iter().all(|m| m.complete);
    if let [m] = &matrices[..] {
        print!("{}", render(m, a.format));
    } else {
        let c = MatrixCompare {
            matrices: matrices.iter().collect(),
        };
        match a.format {
            MatrixFormat::Md => print!("{}", c.to_markdown()),
            MatrixFormat::Html => print!("{}", c.to_html()),
            MatrixFormat::Json | MatrixFormat::Svg => {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&c.to_json()).expect("json")
                )
            }
        }
    }
    if complete {
        0
    } else {
        eprintln!(
            "warning: INCOMPLETE: the dependence of some cells could not be established exactly \
             (raise --budget, or narrow --free)"
        );
        3
    }
}
