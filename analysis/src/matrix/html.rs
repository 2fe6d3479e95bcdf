//! The HTML rendering: one self-contained page (inline style and script, no network, no
//! external fonts or scripts) with one or more matrices: cells coloured per backend, a legend,
//! the caption and notes, and each cell's full explanation (every backend's status, its
//! declining rules with ids, locations and reasons, the variants not available, the other
//! outcomes with a verified example) shown on hover or click.
//!
//! Written as well-formed XML (polyglot HTML): every element closed, script text in CDATA
//! sections, the JSON data with `<`, `>` and `&` escaped, so an XML parser checks it.

use serde_json::{Value as Json, json};

use super::render::{Notes, show};
use super::svg::{NONE_FILL, esc, fill};
use super::{Matrix, outcome_label};

const STYLE: &str = r#"
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #1a1a1a; }
main { display: flex; gap: 1.5rem; align-items: flex-start; }
#matrices { flex: 1 1 auto; min-width: 0; overflow-x: auto; }
section.matrix { margin-bottom: 2.5rem; }
p.caption { font-size: 0.85rem; max-width: 70rem; margin: 0.2rem 0; }
table.grid { border-collapse: collapse; font-size: 0.8rem; margin: 0.6rem 0; }
table.grid th { padding: 0.3rem 0.5rem; background: #fafafa; }
table.grid td { padding: 0.2rem 0.35rem; border: 2px solid #ffffff; text-align: center; cursor: pointer; min-width: 5rem; }
table.grid td:hover, table.grid td:focus, table.grid td.pinned { outline: 2px solid #333333; }
td small { color: #444444; }
td.none { color: #b00020; }
sup.dep { font-weight: bold; }
ul.legend { list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: 0.9rem; font-size: 0.8rem; }
ul.legend span { display: inline-block; width: 0.9rem; height: 0.9rem; vertical-align: middle; margin-right: 0.3rem; border: 1px solid #999999; }
ol.notes { font-size: 0.8rem; }
#detail { flex: 0 0 24rem; position: sticky; top: 1rem; max-height: 92vh; overflow: auto; font-size: 0.8rem; border: 1px solid #cccccc; padding: 0.8rem; background: #fcfcfc; }
#detail h3 { margin: 0 0 0.4rem 0; font-size: 0.95rem; }
#detail .backend { margin: 0.5rem 0; }
#detail .status { font-weight: bold; }
#detail code { font-size: 0.75rem; }
#detail pre { white-space: pre-wrap; word-break: break-all; font-size: 0.72rem; background: #f2f2f2; padding: 0.4rem; }
"#;

/// Shows a cell's explanation in the side panel on hover or focus (click pins it: the
/// panel then follows clicks only, until the pinned cell is clicked again; the address then
/// links to the cell, `#cell=M-I`, and opening such a link pins it).
const SCRIPT: &str = r#"
(function () {
  var data = JSON.parse(document.getElementById('matrix-data').textContent);
  var panel = document.getElementById('detail');
  var pinned = null;
  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) { e.textContent = text; }
    if (cls) { e.className = cls; }
    return e;
  }
  function show(td) {
    var m = data[+td.getAttribute('data-m')];
    var c = m.cells[+td.getAttribute('data-i')];
    panel.textContent = '';
    panel.appendChild(el('h3', c.title));
    panel.appendChild(el('p', 'Selected: ' + c.label + (c.pref ? ' (preference ' + c.pref + ')' : '')));
    if (c.dep.length) {
      panel.appendChild(el('p', 'Depends on the free facts ' + c.dep.join(', ') + '. Other outcomes, each with a verified example (changes from this cell\'s config):'));
      var ul = el('ul');
      c.alt.forEach(function (a) { ul.appendChild(el('li', a.label + ' with ' + JSON.stringify(a.changes))); });
      panel.appendChild(ul);
    } else {
      panel.appendChild(el('p', 'Decided by the axes, the fixed and the held facts (no free fact changes it).'));
    }
    c.backends.forEach(function (b) {
      var d = el('div', null, 'backend');
      var head = el('div');
      head.appendChild(el('span', b.name + ': ', 'name'));
      head.appendChild(el('span', b.status + (b.variant ? ' (' + b.variant + ')' : '') + (b.by ? ' by ' + b.by : ''), 'status'));
      d.appendChild(head);
      if (b.rules.length) {
        var ul = el('ul');
        b.rules.forEach(function (k) {
          var r = m.rules[k];
          var li = el('li');
          li.appendChild(el('code', r.id));
          li.appendChild(document.createTextNode(' (' + r.kind + ', ' + r.location + '): ' + r.reason));
          ul.appendChild(li);
        });
        d.appendChild(ul);
      }
      if (b.unavailable.length) { d.appendChild(el('div', 'variants not available: ' + b.unavailable.join(', '))); }
      panel.appendChild(d);
    });
    panel.appendChild(el('div', 'Config:'));
    panel.appendChild(el('pre', JSON.stringify(c.config)));
  }
  function address(id) {
    // Some browsers refuse to change a local file's address: the link is a convenience.
    try { history.replaceState(null, '', '#' + id); } catch (e) { return; }
  }
  function pin(td) {
    if (pinned) { pinned.classList.remove('pinned'); }
    if (pinned === td) { pinned = null; address(''); return; }
    pinned = td; td.classList.add('pinned'); show(td);
    address('cell=' + td.id.slice(5));
  }
  var cells = document.querySelectorAll('td[data-i]');
  Array.prototype.forEach.call(cells, function (td) {
    td.addEventListener('mouseenter', function () { if (!pinned) { show(td); } });
    td.addEventListener('focus', function () { if (!pinned) { show(td); } });
    td.addEventListener('click', function () { pin(td); });
  });
  // A link to a cell (#cell=M-I, what a click puts in the address) opens its explanation.
  var link = /^#cell=(\d+)-(\d+)$/.exec(location.hash);
  var linked = link ? document.getElementById('cell-' + link[1] + '-' + link[2]) : null;
  if (linked) { pin(linked); linked.scrollIntoView({block: 'nearest'}); }
})();
"#;

/// The data the script reads for one matrix: a table of the rules its cells cite, and per
/// cell its title, outcome, dependence and explanation.
fn data(m: &Matrix) -> Json {
    let mut rules: Vec<Json> = Vec::new();
    let mut keys: Vec<(String, String)> = Vec::new();
    let nc = m.cols.values.len();
    let cells: Vec<Json> = m
        .cells
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let e = &c.explanation;
            let backends: Vec<Json> = e
                .backends
                .iter()
                .map(|b| {
                    let ids: Vec<usize> = b
                        .declined_by
                        .iter()
                        .map(|r| {
                            let key = (r.id.clone(), r.location.clone());
                            match keys.iter().position(|k| *k == key) {
                                Some(k) => k,
                                None => {
                                    keys.push(key);
                                    rules.push(json!({
                                        "id": r.id, "kind": r.kind,
                                        "location": r.location, "reason": r.reason,
                                    }));
                                    rules.len() - 1
                                }
                            }
                        })
                        .collect();
                    let unavailable: Vec<&str> = b
                        .unavailable_variants
                        .iter()
                        .map(|v| v.name.as_str())
                        .collect();
                    let by = match &b.status {
                        attn_policy::BackendStatus::Outranked { by } => by.clone(),
                        _ => None,
                    };
                    json!({
                        "name": b.name, "status": b.status.word(),
                        "variant": b.variant.as_ref().map(|v| &v.name), "by": by,
                        "rules": ids, "unavailable": unavailable,
                    })
                })
                .collect();
            let alt: Vec<Json> = c
                .alternatives
                .iter()
                .map(|a| json!({"label": outcome_label(&a.backend, &a.variant), "changes": a.changes}))
                .collect();
            json!({
                "title": format!("{} = {}, {} = {}", m.rows.name, show(&m.rows.values[i / nc]),
                                 m.cols.name, show(&m.cols.values[i % nc])),
                "label": Matrix::label(c),
                "pref": e.preference.as_ref().map(|p| &p.id),
                "dep": c.depends_on,
                "alt": alt,
                "backends": backends,
                "config": c.config,
            })
        })
        .collect();
    json!({"rules": rules, "cells": cells})
}

/// One matrix as an HTML section (`k`: its index in the page's data).
fn section(m: &Matrix, k: usize, heading: &str, intro: &str) -> String {
    let notes = Notes::of(m);
    let mut s = format!("<section class=\"matrix\" id=\"matrix-{k}\">\n");
    if !heading.is_empty() {
        s.push_str(&format!("<h2>{}</h2>\n", esc(heading)));
    }
    if !intro.is_empty() {
        s.push_str(&format!("<p>{}</p>\n", code_spans(intro)));
    }
    for line in m.caption() {
        s.push_str(&format!("<p class=\"caption\">{}</p>\n", code_spans(&line)));
    }
    s.push_str("<table class=\"grid\">\n<thead><tr>");
    s.push_str(&format!(
        "<th>{} \\ {}</th>",
        esc(&m.rows.name),
        esc(&m.cols.name)
    ));
    for c in &m.cols.values {
        s.push_str(&format!("<th>{}</th>", esc(&show(c))));
    }
    s.push_str("</tr></thead>\n<tbody>\n");
    let nc = m.cols.values.len();
    for (r, rv) in m.rows.values.iter().enumerate() {
        s.push_str(&format!("<tr><th>{}</th>", esc(&show(rv))));
        for c in 0..nc {
            let i = r * nc + c;
            let cell = &m.cells[i];
            let name = cell.backend.clone().unwrap_or_else(|| "none".into());
            let variant = cell
                .variant
                .as_ref()
                .map(|v| format!("<br/><small>{}</small>", esc(v)))
                .unwrap_or_default();
            let mut mark = notes.of_cell[i]
                .map(|n| format!(" <sup class=\"dep\">◆{n}</sup>"))
                .unwrap_or_default();
            if !cell.exact {
                mark.push_str(" <sup>(?)</sup>");
            }
            s.push_str(&format!(
                "<td id=\"cell-{k}-{i}\" tabindex=\"0\" data-m=\"{k}\" data-i=\"{i}\" style=\"background:{}\"{} title=\"{}\">{}{variant}{mark}</td>",
                fill(m, &cell.backend),
                if cell.backend.is_none() { " class=\"none\"" } else { "" },
                esc(&Matrix::label(cell)),
                esc(&name)
            ));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</tbody>\n</table>\n<ul class=\"legend\">");
    for b in &m.backends {
        s.push_str(&format!(
            "<li><span style=\"background:{}\"></span>{}</li>",
            fill(m, &Some(b.clone())),
            esc(b)
        ));
    }
    s.push_str(&format!(
        "<li><span style=\"background:{NONE_FILL}\"></span>none</li></ul>\n"
    ));
    if !notes.notes.is_empty() {
        s.push_str("<p class=\"caption\">◆ The decision changes with free facts:</p>\n<ol class=\"notes\">\n");
        for (facts, also) in &notes.notes {
            s.push_str(&format!(
                "<li>depends on {}; other values select {}</li>\n",
                esc(&facts.join(", ")),
                esc(&also.join(", "))
            ));
        }
        s.push_str("</ol>\n");
    }
    s.push_str("</section>\n");
    s
}

/// Markdown-style `code` spans as `<code>` (captions are written once for both).
fn code_spans(line: &str) -> String {
    let mut out = String::new();
    for (i, part) in line.split('`').enumerate() {
        if i % 2 == 1 {
            out.push_str(&format!("<code>{}</code>", esc(part)));
        } else {
            out.push_str(&esc(part));
        }
    }
    out
}

/// JSON inside a `<script>` element: `<`, `>` and `&` as escapes, so no text closes the
/// element or reads as markup.
fn script_json(v: &Json) -> String {
    serde_json::to_string(v)
        .expect("serialisable")
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

/// A page of matrices: `(heading, intro, matrix)` per section.
pub fn html_page(title: &str, intro: &str, sections: &[(String, String, &Matrix)]) -> String {
    let mut body = String::new();
    let mut all = Vec::new();
    for (k, (heading, text, m)) in sections.iter().enumerate() {
        body.push_str(&section(m, k, heading, text));
        all.push(data(m));
    }
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n<meta name=\"generator\" content=\"attn-policy matrix\"/>\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{}</h1>\n{}<main>\n<div id=\"matrices\">\n{body}</div>\n<aside id=\"detail\">Hover over or click a cell for its full explanation.</aside>\n</main>\n<script type=\"application/json\" id=\"matrix-data\">{}</script>\n<script>//<![CDATA[{SCRIPT}//]]></script>\n</body>\n</html>\n",
        esc(title),
        esc(title),
        if intro.is_empty() {
            String::new()
        } else {
            format!("<p>{}</p>\n", code_spans(intro))
        },
        script_json(&Json::Array(all))
    )
}

impl Matrix {
    /// A page with this matrix alone.
    pub fn to_html(&self) -> String {
        let title = format!("{}: {} × {}", self.pack, self.rows.name, self.cols.name);
        html_page(&title, "", &[(String::new(), String::new(), self)])
    }
}
