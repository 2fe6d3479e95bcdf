//! Two packs' matrices of the same query side by side (`attn-policy diff --format matrix`):
//! per row, the old pack's cells above the new pack's, changed cells marked. What a rule
//! change review can paste into a pull request.

use serde_json::{Map, Value as Json, json};

use super::render::show;
use super::{Cell, Matrix};

/// How a cell differs between the two matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// The backend or variant at the cell's config differs.
    Outcome,
    /// The same outcome at the config, but the free facts it depends on, or the outcomes
    /// they reach, differ.
    Dependence,
}

/// The old and the new pack's matrix of one query.
pub struct MatrixDiff<'a> {
    pub old: &'a Matrix,
    pub new: &'a Matrix,
    pub old_name: String,
    pub new_name: String,
}

fn outcomes(c: &Cell) -> Vec<(Option<String>, Option<String>)> {
    let mut v: Vec<_> = c
        .alternatives
        .iter()
        .map(|a| (a.backend.clone(), a.variant.clone()))
        .collect();
    v.sort();
    v
}

fn change(a: &Cell, b: &Cell) -> Option<Change> {
    if (&a.backend, &a.variant) != (&b.backend, &b.variant) {
        Some(Change::Outcome)
    } else if a.depends_on != b.depends_on || outcomes(a) != outcomes(b) {
        Some(Change::Dependence)
    } else {
        None
    }
}

fn cell_json(c: &Cell) -> Json {
    let mut o = Map::new();
    o.insert("backend".into(), json!(c.backend));
    o.insert("variant".into(), json!(c.variant));
    if !c.depends_on.is_empty() {
        o.insert("depends_on".into(), json!(c.depends_on));
    }
    Json::Object(o)
}

impl MatrixDiff<'_> {
    /// Per cell (row-major), how it changed.
    pub fn changes(&self) -> Vec<Option<Change>> {
        self.old
            .cells
            .iter()
            .zip(&self.new.cells)
            .map(|(a, b)| change(a, b))
            .collect()
    }

    /// `{"old": matrix, "new": matrix, "changed": [{<row axis>, <col axis>, "change",
    /// "old": {"backend", "variant", "depends_on"?}, "new": {...}}]}`.
    pub fn to_json(&self) -> Json {
        let nc = self.old.cols.values.len();
        let changed: Vec<Json> = self
            .changes()
            .iter()
            .enumerate()
            .filter_map(|(i, ch)| {
                let ch = (*ch)?;
                let mut o = Map::new();
                o.insert(
                    self.old.rows.name.clone(),
                    self.old.rows.values[i / nc].clone(),
                );
                o.insert(
                    self.old.cols.name.clone(),
                    self.old.cols.values[i % nc].clone(),
                );
                o.insert(
                    "change".into(),
                    json!(match ch {
                        Change::Outcome => "outcome",
                        Change::Dependence => "dependence",
                    }),
                );
                o.insert("old".into(), cell_json(&self.old.cells[i]));
                o.insert("new".into(), cell_json(&self.new.cells[i]));
                Some(Json::Object(o))
            })
            .collect();
        json!({"old": self.old.to_json(), "new": self.new.to_json(), "changed": changed})
    }

    /// Markdown: the caption of the query, one table with each row's old cells above its new
    /// cells (✱ the outcome changed, △ only what it depends on changed, ◆ depends on free
    /// facts), then every changed cell in words.
    pub fn to_markdown(&self) -> String {
        let (old, new) = (self.old, self.new);
        let changes = self.changes();
        let nc = old.cols.values.len();
        let esc = |s: String| s.replace('|', "\\|");
        let mut out = format!(
            "Old: `{}`, new: `{}`: {} of {} cells change (✱ outcome, △ only the free facts it depends on or the outcomes they reach; ◆ depends on free facts).\n\n",
            self.old_name,
            self.new_name,
            changes.iter().filter(|c| c.is_some()).count(),
            changes.len()
        );
        for line in new.caption().iter().skip(1) {
            out.push_str(line);
            out.push('\n');
        }
        out.push_str(&format!(
            "\n| {} \\ {} | pack |",
            esc(old.rows.name.clone()),
            esc(old.cols.name.clone())
        ));
        for c in &old.cols.values {
            out.push_str(&format!(" {} |", esc(show(c))));
        }
        out.push_str("\n|---|---|");
        for _ in 0..nc {
            out.push_str("---|");
        }
        out.push('\n');
        let label = |c: &Cell, ch: Option<Change>, is_new: bool| {
            let mut s = Matrix::label(c);
            if !c.depends_on.is_empty() {
                s.push_str(" ◆");
            }
            match (ch, is_new) {
                (Some(Change::Outcome), true) => format!("**{s}** ✱"),
                (Some(Change::Dependence), true) => format!("{s} △"),
                _ => s,
            }
        };
        for (r, rv) in old.rows.values.iter().enumerate() {
            for (k, m) in [old, new].into_iter().enumerate() {
                out.push_str(&format!(
                    "| {} | {} |",
                    if k == 0 { esc(show(rv)) } else { String::new() },
                    if k == 0 { "old" } else { "new" }
                ));
                for c in 0..nc {
                    let i = r * nc + c;
                    out.push_str(&format!(
                        " {} |",
                        esc(label(&m.cells[i], changes[i], k == 1))
                    ));
                }
                out.push('\n');
            }
        }
        let listed: Vec<String> = changes
            .iter()
            .enumerate()
            .filter_map(|(i, ch)| {
                ch.map(|_| {
                    let (a, b) = (&old.cells[i], &new.cells[i]);
                    let deps = |c: &Cell| {
                        if c.depends_on.is_empty() {
                            "decided".to_string()
                        } else {
                            format!("depends on {}", c.depends_on.join(", "))
                        }
                    };
                    format!(
                        "- {} = {}, {} = {}: {} ({}) -> {} ({})",
                        old.rows.name,
                        show(&old.rows.values[i / nc]),
                        old.cols.name,
                        show(&old.cols.values[i % nc]),
                        Matrix::label(a),
                        deps(a),
                        Matrix::label(b),
                        deps(b)
                    )
                })
            })
            .collect();
        if !listed.is_empty() {
            out.push_str("\nChanged cells:\n\n");
            for l in listed {
                out.push_str(&l);
                out.push('\n');
            }
        }
        out
    }
}
