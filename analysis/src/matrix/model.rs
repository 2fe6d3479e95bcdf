//! A built support matrix ([`Matrix`]: axes, cells, what each cell depends on) and its errors:
//! what the builder (`mod.rs`) makes and the renderings (`render.rs`, `svg.rs`, `html.rs`,
//! `diff.rs`) read. It names none of them (no circle of files).

use serde_json::{Map, Value as Json};

use crate::matrix::grid::GridError;

#[derive(Debug, thiserror::Error)]
pub enum MatrixError {
    #[error("unknown fact `{name}` in the {family} family{}", suggestion.as_ref().map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default())]
    UnknownFact {
        name: String,
        family: &'static str,
        suggestion: Option<String>,
    },
    #[error("{0}")]
    Bad(String),
    #[error(transparent)]
    Grid(#[from] GridError),
}

/// One axis of a built matrix.
#[derive(Clone, Debug)]
pub struct Axis {
    pub name: String,
    /// What an alias sets (`head_dim_qk = head_dim_v`), for the caption.
    pub meaning: Option<String>,
    pub values: Vec<Json>,
}

/// Another outcome reachable in a cell, with the free facts changed to reach it.
#[derive(Clone, Debug, PartialEq)]
pub struct Alternative {
    pub backend: Option<String>,
    pub variant: Option<String>,
    /// Config keys changed from the cell's config (a verified example).
    pub changes: Map<String, Json>,
}

#[derive(Clone, Debug)]
pub struct Cell {
    /// The backend selected at the cell's config (None: no backend).
    pub backend: Option<String>,
    /// Its variant, for backends with variants.
    pub variant: Option<String>,
    /// Free facts that change the decision in the cell (empty: decided by the axes and the
    /// fixed and held facts).
    pub depends_on: Vec<String>,
    /// The other outcomes reachable in the cell (when `depends_on` is not empty).
    pub alternatives: Vec<Alternative>,
    /// The cell's config.
    pub config: Json,
    /// The analysis of this cell is exact (every non-empty outcome has a verified example
    /// and the decision at the config agrees with the diagrams).
    pub exact: bool,
    /// The decision at the cell's config, explained (every backend's status and rules).
    pub explanation: attn_policy::Explanation,
}

/// A support matrix: the pack's decision per cell and what it depends on.
#[derive(Clone, Debug)]
pub struct Matrix {
    pub pack: String,
    pub family: &'static str,
    pub rows: Axis,
    pub cols: Axis,
    /// Fixed facts as given (alias names kept); held ones (`--fix FACT`) per fact with its
    /// default.
    pub fixed: Vec<(String, Json)>,
    /// The fixed facts as the caption states them (`--fix FACT` as "FACT at its default").
    pub fixed_caption: Vec<String>,
    /// Free facts (the analysis covers every value of each).
    pub free: Vec<String>,
    /// The pack's backends, in pack order (the legend).
    pub backends: Vec<String>,
    /// Row-major.
    pub cells: Vec<Cell>,
    /// Every cell is exact (see [`crate::matrix::grid::GridAnalysis::complete`]).
    pub complete: bool,
    pub diagram_nodes: u64,
    pub classes_examined: u64,
}

impl Matrix {
    /// The cell at a row and column index.
    pub fn cell(&self, r: usize, c: usize) -> &Cell {
        &self.cells[r * self.cols.values.len() + c]
    }

    /// A cell's shown outcome as text: `Backend (variant)` or `none`.
    pub fn label(cell: &Cell) -> String {
        outcome_label(&cell.backend, &cell.variant)
    }
}

/// An outcome as text: `Backend (variant)`, `Backend` or `none`.
pub fn outcome_label(backend: &Option<String>, variant: &Option<String>) -> String {
    match (backend, variant) {
        (None, _) => "none".into(),
        (Some(b), None) => b.clone(),
        (Some(b), Some(v)) => format!("{b} ({v})"),
    }
}
