//! JSON (the contract of docs/matrix.md) and Markdown renderings, and the caption and
//! dependence notes the other renderings share.

use serde_json::{Map, Value as Json, json};

use super::{Matrix, outcome_label};

/// A value as it reads in a table (strings without quotes).
pub(super) fn show(v: &Json) -> String {
    match v {
        Json::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The dependence notes: one per distinct (deciding facts, other outcomes), numbered in
/// row-major order of first use.
pub(super) struct Notes {
    pub(super) notes: Vec<(Vec<String>, Vec<String>)>,
    /// Per cell, its note's number (1-based) when it depends on free facts.
    pub(super) of_cell: Vec<Option<usize>>,
}

impl Notes {
    pub(super) fn of(m: &Matrix) -> Notes {
        let mut notes: Vec<(Vec<String>, Vec<String>)> = Vec::new();
        let of_cell = m
            .cells
            .iter()
            .map(|c| {
                if c.depends_on.is_empty() {
                    return None;
                }
                let mut also: Vec<String> = c
                    .alternatives
                    .iter()
                    .map(|a| outcome_label(&a.backend, &a.variant))
                    .collect();
                also.sort();
                let key = (c.depends_on.clone(), also);
                Some(match notes.iter().position(|n| *n == key) {
                    Some(i) => i + 1,
                    None => {
                        notes.push(key);
                        notes.len()
                    }
                })
            })
            .collect();
        Notes { notes, of_cell }
    }
}

impl Matrix {
    /// The JSON document: `{"pack", "rows": {"axis", "values"}, "cols": {"axis", "values"},
    /// "fixed", "cells": [{<row axis>, <col axis>, "backend", "variant", "depends_on"?}],
    /// "free", "complete"}`.
    pub fn to_json(&self) -> Json {
        let nc = self.cols.values.len();
        let cells: Vec<Json> = self
            .cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut o = Map::new();
                o.insert(self.rows.name.clone(), self.rows.values[i / nc].clone());
                o.insert(self.cols.name.clone(), self.cols.values[i % nc].clone());
                o.insert("backend".into(), json!(c.backend));
                o.insert("variant".into(), json!(c.variant));
                if !c.depends_on.is_empty() {
                    o.insert("depends_on".into(), json!(c.depends_on));
                }
                Json::Object(o)
            })
            .collect();
        let fixed: Map<String, Json> = self.fixed.iter().cloned().collect();
        json!({
            "pack": self.pack,
            "rows": {"axis": self.rows.name, "values": self.rows.values},
            "cols": {"axis": self.cols.name, "values": self.cols.values},
            "fixed": fixed,
            "cells": cells,
            "free": self.free,
            "complete": self.complete,
        })
    }

    /// The caption: the pack, the axes (and what an alias sets), the fixed facts, the free
    /// facts, and what every other fact is.
    pub fn caption(&self) -> Vec<String> {
        let axis = |a: &super::Axis| match &a.meaning {
            Some(m) => format!("`{}` ({m})", a.name),
            None => format!("`{}`", a.name),
        };
        let mut out = vec![format!(
            "Pack `{}`: rows {}, columns {}.",
            self.pack,
            axis(&self.rows),
            axis(&self.cols)
        )];
        if !self.fixed_caption.is_empty() {
            out.push(format!("Fixed: {}.", self.fixed_caption.join(", ")));
        }
        out.push(if self.free.is_empty() {
            "Free: none.".to_string()
        } else {
            let f: Vec<String> = self.free.iter().map(|x| format!("`{x}`")).collect();
            format!(
                "Free (every value analysed; a cell shows the decision at the default and \
                 is marked ◆ where other values change it): {}.",
                f.join(", ")
            )
        });
        out.push(format!(
            "Every other fact is held at its default (`attn-policy facts --pack {}` lists \
             them): no optional feature, the environment unset; probes are answered \
             \"supported\".",
            self.pack
        ));
        if !self.complete {
            out.push(
                "INCOMPLETE: the dependence of the cells marked (?) (of every cell, when the \
                 diagram budget ran out) could not be established exactly (an outcome without \
                 a verified example); their marks are no claim."
                    .to_string(),
            );
        }
        out
    }

    /// Markdown: the caption, a table (◆N marks a cell that depends on free facts, see
    /// note N), the notes.
    pub fn to_markdown(&self) -> String {
        let notes = Notes::of(self);
        let esc = |s: String| s.replace('|', "\\|");
        let mut out = String::new();
        for line in self.caption() {
            out.push_str(&line);
            out.push('\n');
        }
        out.push('\n');
        out.push_str(&format!(
            "| {} \\ {} |",
            esc(self.rows.name.clone()),
            esc(self.cols.name.clone())
        ));
        for c in &self.cols.values {
            out.push_str(&format!(" {} |", esc(show(c))));
        }
        out.push_str("\n|---|");
        for _ in &self.cols.values {
            out.push_str("---|");
        }
        out.push('\n');
        let nc = self.cols.values.len();
        for (r, rv) in self.rows.values.iter().enumerate() {
            out.push_str(&format!("| {} |", esc(show(rv))));
            for c in 0..nc {
                let i = r * nc + c;
                let mut mark = notes.of_cell[i]
                    .map(|n| format!(" ◆{n}"))
                    .unwrap_or_default();
                if !self.cells[i].exact {
                    mark.push_str(" (?)");
                }
                out.push_str(&format!(" {}{mark} |", esc(Matrix::label(&self.cells[i]))));
            }
            out.push('\n');
        }
        if !notes.notes.is_empty() {
            out.push_str("\n◆ The decision changes with free facts:\n\n");
            for (i, (facts, also)) in notes.notes.iter().enumerate() {
                let f: Vec<String> = facts.iter().map(|x| format!("`{x}`")).collect();
                out.push_str(&format!(
                    "{}. depends on {}; other values select {}\n",
                    i + 1,
                    f.join(", "),
                    also.join(", ")
                ));
            }
        }
        out
    }
}
