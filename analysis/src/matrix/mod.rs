//! Support matrices generated from the rules (`attn-policy matrix`, docs/matrix.md): for each
//! combination of two axes (facts or the CLI's aliases `head_dim`, `sm`, `seqlen`, ...), the
//! backend (and variant) the pack selects, or none; where other values of the free facts
//! change it, the facts that decide (found by the exact analysis of
//! [`crate::matrix::grid`], never by sampling).
//!
//! Every fact of a cell is one of:
//! - **on an axis**: the row's and the column's values;
//! - **fixed** (`--fix FACT=VALUE`; `--fix FACT` holds it at its default);
//! - **free** (`--free`, by default the family's *shape* facts: batch, heads, sequence
//!   lengths, head dims, context-parallel sizes): the cell shows the decision at the
//!   config's value (the default), and the analysis covers every value: `depends_on` lists
//!   the free facts that change the decision in the cell;
//! - **held** (every other fact): at its default. Features are off (no window, no dropout,
//!   no bias, ...), the environment is unset, probes are answered "supported": the matrix
//!   answers for that scenario, stated in its caption.
//!
//! Renderings: JSON (the contract of docs/matrix.md), Markdown, SVG and a self-contained
//! HTML page (colour per backend, each cell's full explanation on hover or click).

pub mod axes;
mod compare;
mod diff;
pub mod docs;
pub mod grid;
mod html;
mod model;
mod render;
mod specialize;
mod svg;

use serde_json::{Map, Value as Json};

use crate::matrix::grid::{CellAnalysis, GridQuery, Outcome, analyse};
use attn_policy::Policy;
use attn_policy::facts::schema::{Origin, Schema, Ty};

pub use axes::Name;
pub use compare::MatrixCompare;
pub use diff::{Change, MatrixDiff};
pub use html::html_page;
pub use model::{Alternative, Axis, Cell, Matrix, MatrixError, outcome_label};
pub use specialize::{Subst, specialize};

/// Which facts the analysis lets vary (`--free`).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Free {
    /// The family's shape facts (sizes every call has): see [`shape_facts`].
    #[default]
    Shape,
    /// Every fact not on an axis and not fixed.
    All,
    /// None: every fact not on an axis is fixed or held at its default.
    None,
    /// These facts (objects name all their members).
    Facts(Vec<String>),
}

impl Free {
    /// `shape`, `all`, `none` or a comma-separated list of facts.
    pub fn parse(text: &str) -> Free {
        match text.trim() {
            "shape" => Free::Shape,
            "all" => Free::All,
            "none" => Free::None,
            t => Free::Facts(axes::split_values(t)),
        }
    }
}

/// An axis as asked: a fact or alias, and its values as text (None: the default list).
#[derive(Clone, Debug)]
pub struct AxisQuery {
    pub name: String,
    pub values: Option<Vec<String>>,
}

impl AxisQuery {
    /// `FACT` or `FACT=v1,v2,...` (values split at commas outside brackets).
    pub fn parse(text: &str) -> AxisQuery {
        match text.split_once('=') {
            Some((n, v)) => AxisQuery {
                name: n.trim().to_string(),
                values: Some(axes::split_values(v)),
            },
            None => AxisQuery {
                name: text.trim().to_string(),
                values: None,
            },
        }
    }
}

/// What to tabulate.
#[derive(Clone, Debug)]
pub struct Query {
    pub rows: AxisQuery,
    pub cols: AxisQuery,
    /// `(FACT, Some(VALUE))` fixes a value; `(FACT, None)` holds the fact at its default.
    pub fix: Vec<(String, Option<String>)>,
    pub free: Free,
}

impl Query {
    /// `FACT=VALUE` or `FACT`.
    pub fn parse_fix(text: &str) -> (String, Option<String>) {
        match text.split_once('=') {
            Some((n, v)) => (n.trim().to_string(), Some(v.trim().to_string())),
            None => (text.trim().to_string(), None),
        }
    }
}

/// The family's shape facts, free by default: the sizes every call has (a default for them
/// is a guess, so the analysis covers every value). te: batch, heads, sequence lengths,
/// token counts, head dims, context-parallel sizes. torch: batch, query and key/value heads,
/// sequence lengths, head dims (the key's and value's copies follow the query's, see
/// [`crate::matrix::grid::FOLLOWS`]). Other families: their non-nullable integer inputs
/// that do not describe the machine.
pub fn shape_facts(schema: &Schema) -> Vec<&'static str> {
    const TE: &[&str] = &[
        "batch_size",
        "num_heads",
        "num_gqa_groups",
        "max_seqlen_q",
        "max_seqlen_kv",
        "num_tokens_q",
        "num_tokens_kv",
        "head_dim_qk",
        "head_dim_v",
        "cp_size",
        "cp_size_a2a",
    ];
    const TORCH: &[&str] = &[
        "batch",
        "heads_q",
        "heads_kv",
        "seqlen_q",
        "seqlen_kv",
        "head_dim_qk",
        "head_dim_v",
    ];
    schema
        .fields
        .iter()
        .filter(|f| match schema.family {
            "te" => TE.contains(&f.path),
            "torch" => TORCH.contains(&f.path),
            _ => f.ty == Ty::Int && !f.nullable && !f.fixed && f.origin == Origin::Input,
        })
        .map(|f| f.path)
        .collect()
}

/// Default node budget (as `gaps` / `diff`).
pub const DEFAULT_BUDGET: u64 = crate::regions::DEFAULT_BUDGET;

fn axis_values(schema: &Schema, a: &AxisQuery, n: &Name) -> Result<Vec<Json>, MatrixError> {
    match &a.values {
        Some(v) if !v.is_empty() => v.iter().map(|t| n.parse(schema, t)).collect(),
        _ => n.default_values(schema).ok_or_else(|| {
            MatrixError::Bad(format!(
                "axis `{}` has no default values: give them, e.g. {}=1,2,4",
                a.name, a.name
            ))
        }),
    }
}

fn name_of(policy: &Policy, o: Outcome) -> (Option<String>, Option<String>) {
    match o {
        None => (None, None),
        Some((b, v)) => {
            let bk = &policy.backends[b as usize];
            (
                Some(bk.name.clone()),
                v.and_then(|v| bk.variants.get(v)).map(|v| v.name.clone()),
            )
        }
    }
}

/// Builds the matrix of `policy` for `q`.
pub fn build(policy: &Policy, q: &Query, budget: u64) -> Result<Matrix, MatrixError> {
    let schema = policy.schema;
    let rn = Name::resolve(schema, &q.rows.name)?;
    let cn = Name::resolve(schema, &q.cols.name)?;
    if rn.slots.iter().any(|s| cn.slots.contains(s)) {
        return Err(MatrixError::Bad(format!(
            "--rows {} and --cols {} set the same fact",
            rn.name, cn.name
        )));
    }
    let rows = axis_values(schema, &q.rows, &rn)?;
    let cols = axis_values(schema, &q.cols, &cn)?;
    let pins = resolve_pins(policy, &q.fix, &rn, &cn)?;
    let mut free_slots = resolve_free_slots(schema, &q.free, &rn, &cn, &pins.slots)?;
    // A field the pack's release does not have is read by none of its rules: not free.
    if let Some(release) = &policy.release {
        free_slots.retain(|s| !release.ignores.iter().any(|(_, i)| i == s));
    }
    let configs = cell_configs(&pins, &rows, &cols, &rn, &cn);
    // Alias extras (cp_size under `cp_comm_type`) are config values, not pins: free facts
    // stay free, held ones are pinned to them.
    let grid = GridQuery {
        row_slots: rn.slots.clone(),
        col_slots: cn.slots.clone(),
        free_slots: free_slots.clone(),
        nrows: rows.len(),
        ncols: cols.len(),
        configs,
    };
    let g = analyse(policy, &grid, budget)?;
    let cells = matrix_cells(policy, &g.cells, &grid.configs);
    let mut free: Vec<String> = free_slots
        .iter()
        .map(|&s| schema.fields[s].path.to_string())
        .collect();
    free.dedup();
    Ok(Matrix {
        pack: policy.name.clone(),
        family: schema.family,
        rows: Axis {
            name: rn.name.clone(),
            meaning: rn.meaning(),
            values: rows,
        },
        cols: Axis {
            name: cn.name.clone(),
            meaning: cn.meaning(),
            values: cols,
        },
        fixed: pins.fixed,
        fixed_caption: pins.caption,
        free,
        backends: policy.backends.iter().map(|b| b.name.clone()).collect(),
        cells,
        complete: g.complete,
        diagram_nodes: g.diagram_nodes,
        classes_examined: g.classes_examined,
    })
}

/// The `--fix` facts, resolved (see [`resolve_pins`]).
struct Pins {
    /// The config every cell starts from: the fixed values set.
    base: Map<String, Json>,
    /// (fact, value) of each fixed value, and of each input held at its default.
    fixed: Vec<(String, Json)>,
    /// The caption's words for each `--fix`.
    caption: Vec<String>,
    /// The slots the `--fix` facts name.
    slots: Vec<usize>,
    /// The `--fix` names, as given.
    names: Vec<String>,
}

/// Resolves the `--fix` facts (none may be on an axis): their values in the base config, or
/// their defaults.
fn resolve_pins(
    policy: &Policy,
    fix: &[(String, Option<String>)],
    rn: &Name,
    cn: &Name,
) -> Result<Pins, MatrixError> {
    let schema = policy.schema;
    let defaults = policy.default_facts();
    let mut base = Map::new();
    let mut fixed = Vec::new();
    let mut fixed_caption = Vec::new();
    let mut fixed_slots = Vec::new();
    let fixed_names: Vec<String> = fix.iter().map(|f| f.0.clone()).collect();
    for (name, value) in fix {
        let n = Name::resolve(schema, name)?;
        if let Some(s) = n
            .slots
            .iter()
            .find(|s| rn.slots.contains(s) || cn.slots.contains(s))
        {
            return Err(MatrixError::Bad(format!(
                "--fix {name}: `{}` is on an axis",
                schema.fields[*s].path
            )));
        }
        fixed_slots.extend(n.slots.iter().copied());
        match value {
            Some(text) => {
                let v = n.parse(schema, text)?;
                for (path, x) in n.sets(&v, &fixed_names) {
                    axes::insert_path(&mut base, &path, x);
                }
                fixed_caption.push(format!("`{name}` = {v}"));
                fixed.push((name.clone(), v));
            }
            None => {
                fixed_caption.push(if n.slots.len() > 1 {
                    format!("`{name}` (every member) at its default")
                } else {
                    format!("`{name}` at its default")
                });
                for &s in &n.slots {
                    let f = &schema.fields[s];
                    if f.origin == Origin::Input && f.ty != Ty::Object {
                        let domain = match f.ty {
                            Ty::Enum(d) => Some(d),
                            _ => None,
                        };
                        fixed.push((f.path.to_string(), defaults.values()[s].to_json(domain)));
                    }
                }
            }
        }
    }
    Ok(Pins {
        base,
        fixed,
        caption: fixed_caption,
        slots: fixed_slots,
        names: fixed_names,
    })
}

/// The slots the analysis lets vary (`--free`), less those on an axis or fixed.
fn resolve_free_slots(
    schema: &Schema,
    free: &Free,
    rn: &Name,
    cn: &Name,
    fixed_slots: &[usize],
) -> Result<Vec<usize>, MatrixError> {
    let axis_slots = |s: usize| rn.slots.contains(&s) || cn.slots.contains(&s);
    Ok(match free {
        Free::Shape => shape_facts(schema)
            .into_iter()
            .filter_map(|p| schema.slot(p))
            .collect(),
        Free::All => (0..schema.fields.len())
            .filter(|&s| schema.fields[s].origin == Origin::Input)
            .collect(),
        Free::None => Vec::new(),
        Free::Facts(names) => {
            let mut out = Vec::new();
            for n in names {
                out.extend(Name::resolve(schema, n)?.slots);
            }
            out
        }
    }
    .into_iter()
    .filter(|&s| !axis_slots(s) && !fixed_slots.contains(&s))
    .collect())
}

/// Each cell's config, row-major: the base config with the row's and the column's values set.
fn cell_configs(pins: &Pins, rows: &[Json], cols: &[Json], rn: &Name, cn: &Name) -> Vec<Json> {
    let mut configs = Vec::with_capacity(rows.len() * cols.len());
    for r in rows {
        for c in cols {
            let mut obj = pins.base.clone();
            for (path, x) in rn
                .sets(r, &pins.names)
                .into_iter()
                .chain(cn.sets(c, &pins.names))
            {
                axes::insert_path(&mut obj, &path, x);
            }
            configs.push(Json::Object(obj));
        }
    }
    configs
}

/// The cells of the matrix from the analysis of each and its config.
fn matrix_cells(policy: &Policy, analysed: &[CellAnalysis], configs: &[Json]) -> Vec<Cell> {
    analysed
        .iter()
        .zip(configs)
        .map(|(c, config)| {
            let (backend, variant) = name_of(policy, c.at_defaults);
            let decision = policy.decide(&c.facts);
            let explanation = attn_policy::Explanation::new(policy, &c.facts, &decision);
            Cell {
                backend,
                variant,
                depends_on: c.depends_on.iter().map(|s| s.to_string()).collect(),
                alternatives: c
                    .reachable
                    .iter()
                    .skip(1)
                    .map(|r| {
                        let (backend, variant) = name_of(policy, r.outcome);
                        Alternative {
                            backend,
                            variant,
                            changes: r.changes.clone(),
                        }
                    })
                    .collect(),
                config: config.clone(),
                exact: c.unverified == 0,
                explanation,
            }
        })
        .collect()
}
