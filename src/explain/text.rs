//! Human text, read from the model: the selection, then one line per backend with every
//! declining rule under it (`attn-policy explain`).

use std::fmt::Write as _;

use serde_json::Value as Json;

use super::{
    BackendExplanation, BackendStatus, ExecutorOutcome, Explanation, FactValue, VariantChoice,
};

/// ` [FA3 3.0.0]`, ` [F16_arbitrary_seqlen = 1]`, ` [name]` (no value), or nothing.
fn variant_text(v: Option<&VariantChoice>) -> String {
    match v {
        Some(v) => match v.value.to_json() {
            Json::Null => format!(" [{}]", v.name),
            Json::String(s) => format!(" [{} {s}]", v.name),
            other => format!(" [{} = {other}]", v.name),
        },
        None => String::new(),
    }
}

/// `s` in the ANSI style `code` when `color`, else as it is.
fn style(color: bool, code: &str, s: &str) -> String {
    if color {
        format!("\x1b[{code}m{s}\x1b[0m")
    } else {
        s.to_string()
    }
}

impl Explanation {
    /// The text of `attn-policy explain`; `color` adds ANSI styles.
    pub fn to_text(&self, color: bool) -> String {
        let mut out = String::new();
        self.write_selection(&mut out, color);
        if self.provisional {
            self.write_provisional(&mut out);
        }
        if !self.layers_disabled.is_empty() {
            let _ = writeln!(out, "layers off: {}", self.layers_disabled.join(", "));
        }
        // A pack named with its upstream release says which release decided (`te@2.19.0`),
        // and, chosen by `te@auto`, for which installed release.
        if let Some(from) = &self.pack_from {
            let _ = writeln!(
                out,
                "pack: {} (from {}, {} {})",
                self.pack, from.requested, from.upstream, from.installed
            );
        } else if let Some((_, release)) = self.pack.split_once('@') {
            let _ = writeln!(out, "pack: {} (upstream release {release})", self.pack);
        }
        for u in &self.unread_inputs {
            let _ = writeln!(out, "not read: {}", u.note);
        }
        // The third version state is shown even where no rule fired on it: a rule that
        // compares such a fact says, through `parsed(x)`, what this state does.
        for (path, v) in self.input.iter() {
            if let FactValue::Unparseable(_) = v {
                let _ = writeln!(
                    out,
                    "unparseable version: {path} = {} (present, but not a version; rules decide on `parsed({path})`)",
                    v.text()
                );
            }
        }
        self.write_features(&mut out);
        let width = self
            .backends
            .iter()
            .map(|b| b.name.len())
            .max()
            .unwrap_or(0);
        for b in &self.backends {
            write_backend(&mut out, b, width, color);
        }
        if !self.executor_chain.is_empty() {
            self.write_executors(&mut out, color);
        }
        out
    }

    /// The `features:` line: what the call computes beyond plain softmax attention over full
    /// sequences (padding or packed sequences, soft-capping, a sink, head_dim_qk !=
    /// head_dim_v), whether or not a rule fired on it, so a model's explanation says what
    /// the model asks for. Nothing is written for a plain call.
    fn write_features(&self, out: &mut String) {
        let get = |path: &str| self.input.iter().find(|(p, _)| *p == path).map(|(_, v)| v);
        let name = |path: &str| match get(path) {
            Some(FactValue::Enum(s)) => Some(s.as_str()),
            _ => None,
        };
        let mut parts = Vec::new();
        if let Some(m) = name("attn_mask_type").filter(|m| m.starts_with("padding")) {
            parts.push(format!("attn_mask_type = {m:?} (per-sequence lengths)"));
        }
        if let Some(l) = name("qkv_layout").filter(|l| l.contains("thd")) {
            parts.push(format!("qkv_layout = {l:?} (packed sequences)"));
        }
        match get("softcap") {
            Some(FactValue::Float(c)) if *c != 0.0 => parts.push(format!("softcap = {c:?}")),
            Some(FactValue::Int(c)) if *c != 0 => parts.push(format!("softcap = {c}")),
            _ => {}
        }
        if let Some(t) = name("softmax_type").filter(|t| *t != "vanilla") {
            parts.push(format!("softmax_type = {t:?} (attention sink)"));
        }
        if let (Some(FactValue::Int(qk)), Some(FactValue::Int(v))) =
            (get("head_dim_qk"), get("head_dim_v"))
            && qk != v
        {
            parts.push(format!("head_dim_qk = {qk} != head_dim_v = {v}"));
        }
        if !parts.is_empty() {
            let _ = writeln!(out, "features: {}", parts.join(", "));
        }
    }

    /// The first line: the selected backend and variant, and the preference that chose it.
    fn write_selection(&self, out: &mut String, color: bool) {
        let style = |code: &str, s: &str| style(color, code, s);
        match &self.selected {
            Some(s) => {
                let _ = write!(
                    out,
                    "{} {}{}",
                    style("1", "selected:"),
                    style("1;32", s),
                    variant_text(self.variant.as_ref())
                );
            }
            None => {
                let _ = write!(
                    out,
                    "{} {}",
                    style("1", "selected:"),
                    style("1;31", "none: no backend can serve this configuration")
                );
            }
        }
        if let Some(pref) = &self.preference {
            let _ = write!(out, "  (preference `{}`", pref.id);
            if let Some(w) = &pref.when {
                let _ = write!(out, ": {w}");
            }
            out.push(')');
        }
        out.push('\n');
    }

    /// The `provisional:` line: the undecided backends that come first, and the probes they
    /// wait for.
    fn write_provisional(&self, out: &mut String) {
        let mut waiting = Vec::new();
        if let Some(pref) = &self.preference {
            for name in &pref.order {
                if Some(name) == self.selected.as_ref() {
                    break;
                }
                let Some(b) = self.backend(name) else {
                    continue;
                };
                if b.status == BackendStatus::Undecided {
                    let mut probes: Vec<&str> = b
                        .pending
                        .iter()
                        .flat_map(|r| r.probes.iter().map(String::as_str))
                        .collect();
                    probes.sort_unstable();
                    probes.dedup();
                    waiting.push(format!(
                        "{} (until {} is answered)",
                        b.name,
                        probes.join(", ")
                    ));
                }
            }
        }
        let _ = writeln!(
            out,
            "provisional: undecided and earlier in the preference order: {}; answer with --probe NAME=true|false",
            waiting.join("; ")
        );
    }

    /// The executors of the selected backend, one line each, with what each did.
    fn write_executors(&self, out: &mut String, color: bool) {
        let _ = writeln!(
            out,
            "\nexecutors of {}:",
            self.selected.as_deref().unwrap_or("no backend")
        );
        let width = self
            .executor_chain
            .iter()
            .map(|a| a.executor.len())
            .max()
            .unwrap_or(0);
        for (i, a) in self.executor_chain.iter().enumerate() {
            let code = match a.outcome {
                ExecutorOutcome::Ran => "32",
                ExecutorOutcome::Refused | ExecutorOutcome::Failed => "31",
                ExecutorOutcome::Unavailable => "33",
                ExecutorOutcome::NotTried => "2",
            };
            let word = format!("{:<11}", a.outcome.word());
            let detail = match (&a.reason, a.outcome) {
                (Some(r), _) => r.clone(),
                (None, ExecutorOutcome::Ran) if i > 0 => "substitute".to_string(),
                (None, _) => String::new(),
            };
            let line = format!(
                "  {:<width$}  {}  {detail}",
                a.executor,
                style(color, code, &word)
            );
            let _ = writeln!(out, "{}", line.trim_end());
        }
    }

    /// The facts whose provenance is known, with their values and sources (the Python TE
    /// drop-in appends this to its text); empty when no provenance is recorded. A key with
    /// member facts (`flash_attn_versions`) shows its members.
    pub fn provenance_text(&self) -> String {
        if self.provenance.is_empty() {
            return String::new();
        }
        let mut out = String::from("\nfacts from the environment:\n");
        let width = self
            .provenance
            .iter()
            .map(|(k, _)| k.len())
            .max()
            .unwrap_or(0);
        for (k, source) in self.provenance.iter() {
            let members: Vec<String> = self
                .input
                .iter()
                .filter_map(|(path, v)| {
                    let member = path.strip_prefix(k)?.strip_prefix('.')?;
                    (!member.is_empty()).then(|| format!("{member}={}", v.plain_text()))
                })
                .collect();
            let value = if members.is_empty() {
                self.input
                    .get(k)
                    .map(|v| v.plain_text())
                    .unwrap_or_default()
            } else {
                members.join(", ")
            };
            if value.is_empty() {
                let _ = writeln!(out, "  {k:<width$}  from {source}");
            } else {
                let _ = writeln!(out, "  {k:<width$}  = {value}  from {source}");
            }
        }
        out
    }
}

/// One backend: its status line (names padded to `width`), the rules that decline it or wait
/// on a probe, and its variants that are not available.
fn write_backend(out: &mut String, b: &BackendExplanation, width: usize, color: bool) {
    let style = |code: &str, s: &str| style(color, code, s);
    let (code, status) = match &b.status {
        BackendStatus::Selected => ("32", "selected".to_string()),
        BackendStatus::Outranked { by: Some(by) } => ("33", format!("eligible, outranked by {by}")),
        BackendStatus::Outranked { by: None } => {
            ("33", "eligible, not in the preference order".to_string())
        }
        BackendStatus::Declined => ("31", "declined".to_string()),
        BackendStatus::Disabled => ("31", "disabled by environment".to_string()),
        BackendStatus::Undecided => ("35", "undecided: pending probe".to_string()),
    };
    let _ = writeln!(
        out,
        "\n{:<width$}  {}{}",
        b.name,
        style(code, &status),
        variant_text(b.variant.as_ref())
    );
    for (rules, tag) in [(&b.declined_by, ""), (&b.pending, "? ")] {
        for rule in rules {
            let scope = match &rule.variants {
                Some(v) => format!(" ({})", v.join(", ")),
                None => String::new(),
            };
            let _ = writeln!(
                out,
                "  {tag}{}{scope} [{}] {}",
                style("1", &rule.id),
                rule.layer,
                rule.reason
            );
            let vals: Vec<String> = rule
                .values
                .iter()
                .map(|(fact, v)| format!("{fact} = {}", v.text()))
                .collect();
            let _ = writeln!(out, "      {}  at {}", vals.join(", "), rule.location);
        }
    }
    for v in &b.unavailable_variants {
        // The condition (internal definitions written out), with the values of the
        // facts it read.
        let read: Vec<String> = v
            .values
            .iter()
            .map(|(fact, value)| format!("{fact} = {}", value.text()))
            .collect();
        let _ = writeln!(
            out,
            "  - {} not available: `{}` is false{}",
            v.name,
            v.applicable.as_deref().unwrap_or("false"),
            if read.is_empty() {
                String::new()
            } else {
                format!(" ({})", read.join(", "))
            }
        );
    }
}
