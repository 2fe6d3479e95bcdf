//! Diagnostics for rule packs: one serialisable type for CLI text, JSON and bindings, rendered
//! with annotate-snippets (rustc's own renderer) with the offending source underlined. Codes
//! are typed ([`Code`]); sources and locations live in [`source`].

pub mod code;
pub mod source;

use annotate_snippets::{AnnotationKind, Group, Level, Renderer, Snippet};
use serde::Serialize;

pub use code::{Code, Severity};
pub use source::{Loc, SourceFile, SourceMap};

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Diagnostic {
    /// Stable code, e.g. `E-TYPE` (see docs/diagnostics.md).
    pub code: Code,
    pub severity: Severity,
    pub message: String,
    #[serde(skip)]
    pub loc: Option<Loc>,
    /// `file:line:col`, filled in by [`Diagnostic::locate`].
    pub location: Option<String>,
    pub label: Option<String>,
    pub help: Option<String>,
}

impl Diagnostic {
    /// A diagnostic of `code` (its severity comes with the code).
    pub fn new(code: Code, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            code,
            severity: code.severity(),
            message: message.into(),
            loc: None,
            location: None,
            label: None,
            help: None,
        }
    }

    pub fn at(mut self, loc: Loc) -> Self {
        self.loc = Some(loc);
        self
    }

    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    pub fn help(mut self, help: Option<String>) -> Self {
        self.help = help;
        self
    }

    /// Fills `location` (`file:line:col`) from the source map.
    pub fn locate(&mut self, sources: &SourceMap) {
        if let Some(loc) = self.loc {
            self.location = Some(sources.describe(loc));
        }
    }

    /// Renders like rustc: title, `--> file:line:col`, the source line with the span underlined.
    pub fn render(&self, sources: &SourceMap, color: bool) -> String {
        let level = match self.severity {
            Severity::Error => Level::ERROR,
            Severity::Warning => Level::WARNING,
        };
        let title = level
            .primary_title(self.message.as_str())
            .id(self.code.name());
        let mut group = match self.loc.and_then(|l| sources.get(l.file).map(|f| (l, f))) {
            Some((loc, file)) => {
                let end = if loc.end > loc.start {
                    loc.end
                } else {
                    (loc.start + 1).min(file.text.len())
                };
                let start = loc.start.min(file.text.len());
                let mut ann = AnnotationKind::Primary.span(start..end.max(start));
                if let Some(label) = &self.label {
                    ann = ann.label(label.as_str());
                }
                title.element(
                    Snippet::source(file.text.as_str())
                        .path(file.name.as_str())
                        .annotation(ann),
                )
            }
            None => Group::with_title(title),
        };
        if let Some(help) = &self.help {
            group = group.element(Level::HELP.message(help.as_str()));
        }
        let renderer = if color {
            Renderer::styled()
        } else {
            Renderer::plain()
        };
        renderer.render(&[group])
    }
}

/// Errors and warnings from loading a pack. Loading fails when any is an error.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    pub fn has_errors(&self) -> bool {
        self.0.iter().any(|d| d.severity == Severity::Error)
    }

    pub fn push(&mut self, d: Diagnostic) {
        self.0.push(d);
    }

    pub fn render(&self, sources: &SourceMap, color: bool) -> String {
        let mut out = String::new();
        for d in &self.0 {
            out.push_str(&d.render(sources, color));
            out.push_str("\n\n");
        }
        let errors = self
            .0
            .iter()
            .filter(|d| d.severity == Severity::Error)
            .count();
        let warnings = self.0.len() - errors;
        out.push_str(&format!("{errors} error(s), {warnings} warning(s)\n"));
        out
    }
}
