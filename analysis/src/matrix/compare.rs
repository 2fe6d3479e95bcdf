//! Several packs' matrices of the same query, cell by cell (`attn-policy matrix --pack A
//! --pack B ...`): per row, each pack's cells one under the other, and the cells where the
//! packs select different backends (or variants) marked. Made for releases of one selector
//! (`te@2.18.0`, `te@2.19.0`, `te@2.20.2`): which cells a release changed.

use serde_json::{Map, Value as Json, json};

use super::html::html_page;
use super::render::show;
use super::{Cell, Matrix};

/// The matrices of one query, one per pack, in the order the packs were named.
pub struct MatrixCompare<'a> {
    pub matrices: Vec<&'a Matrix>,
}

/// Mark of a cell where the packs differ (Markdown and the HTML title).
const MARK: &str = "✱";

impl MatrixCompare<'_> {
    /// Per cell (row-major): whether the packs select different outcomes there.
    pub fn differs(&self) -> Vec<bool> {
        let first = self.matrices[0];
        (0..first.cells.len())
            .map(|i| {
                let key = |m: &Matrix| (m.cells[i].backend.clone(), m.cells[i].variant.clone());
                self.matrices.iter().any(|m| key(m) != key(first))
            })
            .collect()
    }

    fn names(&self) -> Vec<&str> {
        self.matrices.iter().map(|m| m.pack.as_str()).collect()
    }

    /// `{"packs": [name, ...], "matrices": [matrix, ...], "differing": [{<row axis>, <col
    /// axis>, "cells": [{"pack", "backend", "variant"}, ...]}]}`.
    pub fn to_json(&self) -> Json {
        let first = self.matrices[0];
        let nc = first.cols.values.len();
        let differing: Vec<Json> = (self.differs().iter().enumerate())
            .filter(|(_, d)| **d)
            .map(|(i, _)| {
                let mut o = Map::new();
                o.insert(first.rows.name.clone(), first.rows.values[i / nc].clone());
                o.insert(first.cols.name.clone(), first.cols.values[i % nc].clone());
                let cells: Vec<Json> = (self.matrices.iter())
                    .map(|m| {
                        let c: &Cell = &m.cells[i];
                        json!({"pack": m.pack, "backend": c.backend, "variant": c.variant})
                    })
                    .collect();
                o.insert("cells".into(), Json::Array(cells));
                Json::Object(o)
            })
            .collect();
        let matrices: Vec<Json> = self.matrices.iter().map(|m| m.to_json()).collect();
        json!({"packs": self.names(), "matrices": matrices, "differing": differing})
    }

    /// Markdown: the query's caption, one table with each row's cells per pack one under the
    /// other (✱ where the packs differ), then the differing cells in words.
    pub fn to_markdown(&self) -> String {
        let first = self.matrices[0];
        let differs = self.differs();
        let nc = first.cols.values.len();
        let esc = |s: String| s.replace('|', "\\|");
        let names: Vec<String> = self.names().iter().map(|n| format!("`{n}`")).collect();
        let mut out = format!(
            "Packs {}: {} of {} cells differ ({MARK}).\n\n",
            names.join(", "),
            differs.iter().filter(|d| **d).count(),
            differs.len()
        );
        for line in first.caption().iter().skip(1) {
            out.push_str(line);
            out.push('\n');
        }
        out.push_str(&format!(
            "\n| {} \\ {} | pack |",
            esc(first.rows.name.clone()),
            esc(first.cols.name.clone())
        ));
        for c in &first.cols.values {
            out.push_str(&format!(" {} |", esc(show(c))));
        }
        out.push_str("\n|---|---|");
        out.push_str(&"---|".repeat(nc));
        out.push('\n');
        for (r, rv) in first.rows.values.iter().enumerate() {
            for (k, m) in self.matrices.iter().enumerate() {
                let head = if k == 0 { esc(show(rv)) } else { String::new() };
                out.push_str(&format!("| {head} | {} |", esc(m.pack.clone())));
                for c in 0..nc {
                    let i = r * nc + c;
                    let mut s = Matrix::label(&m.cells[i]);
                    if differs[i] {
                        s = format!("**{s}** {MARK}");
                    }
                    out.push_str(&format!(" {} |", esc(s)));
                }
                out.push('\n');
            }
        }
        let listed: Vec<String> = (differs.iter().enumerate())
            .filter(|(_, d)| **d)
            .map(|(i, _)| {
                let per: Vec<String> = (self.matrices.iter())
                    .map(|m| format!("{}: {}", m.pack, Matrix::label(&m.cells[i])))
                    .collect();
                format!(
                    "- {} = {}, {} = {}: {}",
                    first.rows.name,
                    show(&first.rows.values[i / nc]),
                    first.cols.name,
                    show(&first.cols.values[i % nc]),
                    per.join("; ")
                )
            })
            .collect();
        if !listed.is_empty() {
            out.push_str("\nDiffering cells:\n\n");
            for l in listed {
                out.push_str(&l);
                out.push('\n');
            }
        }
        out
    }

    /// One HTML page, a section per pack; the cells where the packs differ are outlined.
    pub fn to_html(&self) -> String {
        let first = self.matrices[0];
        let differs = self.differs();
        let n = differs.iter().filter(|d| **d).count();
        let title = format!(
            "{}: {} × {}",
            self.names().join(" / "),
            first.rows.name,
            first.cols.name
        );
        let intro = format!(
            "{n} of {} cells differ between the packs (outlined in red).",
            differs.len()
        );
        let sections: Vec<(String, String, &Matrix)> = (self.matrices.iter())
            .map(|m| (m.pack.clone(), String::new(), *m))
            .collect();
        let mut page = html_page(&title, &intro, &sections);
        for k in 0..self.matrices.len() {
            for (i, _) in differs.iter().enumerate().filter(|(_, d)| **d) {
                let id = format!("id=\"cell-{k}-{i}\"");
                page = page.replacen(&id, &format!("{id} data-differs=\"1\""), 1);
            }
        }
        page.replacen(
            "</style>",
            "td[data-differs]{outline:3px solid #c00;outline-offset:-3px}</style>",
            1,
        )
    }
}
