//! SVG rendering (docs and slides): the caption, a grid of cells coloured per backend (◆N:
//! depends on free facts, note N), a legend and the notes. Plain SVG 1.1: no scripts, no
//! fonts beyond the generic `sans-serif`, no external references.

use super::render::{Notes, show};
use super::{Matrix, outcome_label};

/// Fill colours per backend (pack order; light tints of a colour-blind-safe palette) and
/// for "none".
pub(super) const PALETTE: &[&str] = &[
    "#9ecae1", "#fdd0a2", "#a1d99b", "#dadaeb", "#fff3a6", "#fcbba1", "#c7e9c0", "#d4b9da",
];
pub(super) const NONE_FILL: &str = "#f2f2f2";

/// The fill of a backend (by name) in a matrix.
pub(super) fn fill(m: &Matrix, backend: &Option<String>) -> &'static str {
    match backend {
        None => NONE_FILL,
        Some(b) => m
            .backends
            .iter()
            .position(|x| x == b)
            .map_or(NONE_FILL, |i| PALETTE[i % PALETTE.len()]),
    }
}

/// XML text escaping (also for attribute values).
pub(super) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// Splits text into lines of at most `width` characters at spaces.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            out.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        out.push(line);
    }
    out
}

/// Approximate width of text in a 12px sans-serif font.
fn text_width(s: &str, px: f64) -> f64 {
    s.chars().count() as f64 * px * 0.58
}

/// Sizes of the SVG, in pixels (`chars`: the characters of a caption or note line).
struct Layout {
    pad: f64,
    row_h: f64,
    head_h: f64,
    cell_w: f64,
    head_w: f64,
    width: f64,
    chars: usize,
}

/// A line of text at the left margin, `size` * 1.4 below `y` (which it moves there).
fn text_line(body: &mut String, y: &mut f64, pad: f64, text: &str, size: f64, weight: &str) {
    *y += size * 1.4;
    body.push_str(&format!(
        "<text x=\"{pad}\" y=\"{y:.1}\" font-size=\"{size}\" font-weight=\"{weight}\">{}</text>\n",
        esc(text)
    ));
}

impl Matrix {
    pub fn to_svg(&self) -> String {
        let notes = Notes::of(self);
        let lay = self.svg_layout();
        let (pad, width, chars) = (lay.pad, lay.width, lay.chars);
        let mut body = String::new();
        let mut y = pad;
        for (k, c) in self.caption().iter().enumerate() {
            for l in wrap(&c.replace('`', ""), chars) {
                text_line(
                    &mut body,
                    &mut y,
                    pad,
                    &l,
                    12.0,
                    if k == 0 { "bold" } else { "normal" },
                );
            }
        }
        y += 10.0;
        self.svg_grid(&mut body, &mut y, &lay, &notes);
        self.svg_legend(&mut body, &mut y, &lay);
        for (k, (facts, also)) in notes.notes.iter().enumerate() {
            let text = format!(
                "◆{}: depends on {}; other values select {}",
                k + 1,
                facts.join(", "),
                also.join(", ")
            );
            for l in wrap(&text, chars) {
                text_line(&mut body, &mut y, pad, &l, 11.0, "normal");
            }
        }
        let height = y + pad;
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" viewBox=\"0 0 {width:.0} {height:.0}\" font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n{body}</svg>\n"
        )
    }

    /// The sizes: cells as wide as the widest outcome, the header column as the widest row
    /// value, the whole at least 640 pixels wide.
    fn svg_layout(&self) -> Layout {
        let nc = self.cols.values.len();
        let (pad, row_h, head_h) = (16.0, 40.0, 26.0);
        let cell_w = self
            .cells
            .iter()
            .flat_map(|c| {
                [
                    c.backend.clone().unwrap_or_else(|| "none".into()),
                    c.variant.clone().unwrap_or_default(),
                ]
            })
            .map(|s| text_width(&s, 12.0) + 34.0)
            .fold(70.0, f64::max);
        let head_w = self
            .rows
            .values
            .iter()
            .map(|v| text_width(&show(v), 12.0))
            .chain([text_width(
                &format!("{} \\ {}", self.rows.name, self.cols.name),
                12.0,
            )])
            .fold(40.0, f64::max)
            + 16.0;
        let grid_w = head_w + cell_w * nc as f64;
        let width = (grid_w + 2.0 * pad).max(640.0);
        let chars = ((width - 2.0 * pad) / (12.0 * 0.58)) as usize;
        Layout {
            pad,
            row_h,
            head_h,
            cell_w,
            head_w,
            width,
            chars,
        }
    }

    /// The header row (column values) and each row: its value, then its cells; from `y`.
    fn svg_grid(&self, body: &mut String, y: &mut f64, lay: &Layout, notes: &Notes) {
        let nc = self.cols.values.len();
        let (row_h, head_h, cell_w, head_w) = (lay.row_h, lay.head_h, lay.cell_w, lay.head_w);
        // Header row.
        let x0 = lay.pad;
        body.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" font-weight=\"bold\">{}</text>\n",
            x0 + 4.0,
            *y + 17.0,
            esc(&format!("{} \\ {}", self.rows.name, self.cols.name))
        ));
        for (c, v) in self.cols.values.iter().enumerate() {
            body.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" font-weight=\"bold\" text-anchor=\"middle\">{}</text>\n",
                x0 + head_w + cell_w * (c as f64 + 0.5),
                *y + 17.0,
                esc(&show(v))
            ));
        }
        *y += head_h;
        for (r, rv) in self.rows.values.iter().enumerate() {
            body.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" font-weight=\"bold\">{}</text>\n",
                x0 + 4.0,
                *y + row_h / 2.0 + 4.0,
                esc(&show(rv))
            ));
            for c in 0..nc {
                let i = r * nc + c;
                let x = x0 + head_w + cell_w * c as f64;
                self.svg_cell(body, i, x, *y, lay, notes);
            }
            *y += row_h;
        }
    }

    /// Cell `i` (row-major) with its top left corner at (`x`, `y`): its fill, outcome and mark.
    fn svg_cell(&self, body: &mut String, i: usize, x: f64, y: f64, lay: &Layout, notes: &Notes) {
        let (row_h, cell_w) = (lay.row_h, lay.cell_w);
        let cell = &self.cells[i];
        body.push_str(&format!(
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{cell_w:.1}\" height=\"{row_h}\" fill=\"{}\" stroke=\"#ffffff\" stroke-width=\"2\"><title>{}</title></rect>\n",
            fill(self, &cell.backend),
            esc(&outcome_label(&cell.backend, &cell.variant))
        ));
        let name = cell.backend.clone().unwrap_or_else(|| "none".into());
        let cx = x + cell_w / 2.0;
        match &cell.variant {
            Some(v) => {
                body.push_str(&format!(
                    "<text x=\"{cx:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\">{}</text>\n<text x=\"{cx:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\" fill=\"#444444\">{}</text>\n",
                    y + 17.0,
                    esc(&name),
                    y + 31.0,
                    esc(v)
                ));
            }
            None => body.push_str(&format!(
                "<text x=\"{cx:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\"{}>{}</text>\n",
                y + row_h / 2.0 + 4.0,
                if cell.backend.is_none() { " fill=\"#b00020\"" } else { "" },
                esc(&name)
            )),
        }
        let mut mark = notes.of_cell[i]
            .map(|n| format!("◆{n}"))
            .unwrap_or_default();
        if !cell.exact {
            mark.push_str(" (?)");
        }
        if !mark.is_empty() {
            body.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"end\">{mark}</text>\n",
                x + cell_w - 4.0,
                y + 11.0
            ));
        }
    }

    /// The legend from `y`: a swatch per backend and for none, wrapped to the width.
    fn svg_legend(&self, body: &mut String, y: &mut f64, lay: &Layout) {
        let (pad, width) = (lay.pad, lay.width);
        *y += 14.0;
        let mut x = pad;
        let mut entries: Vec<(String, &str)> = self
            .backends
            .iter()
            .map(|b| (b.clone(), fill(self, &Some(b.clone()))))
            .collect();
        entries.push(("none".into(), NONE_FILL));
        for (name, colour) in entries {
            let w = text_width(&name, 12.0) + 30.0;
            if x + w > width - pad {
                x = pad;
                *y += 20.0;
            }
            body.push_str(&format!(
                "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"14\" height=\"14\" fill=\"{colour}\" stroke=\"#999999\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\">{}</text>\n",
                x + 18.0,
                *y + 11.5,
                esc(&name)
            ));
            x += w;
        }
        *y += 20.0;
    }
}
