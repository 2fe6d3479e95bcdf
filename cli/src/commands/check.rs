//! `attn-policy check`: load, type-check and lint a pack.

use clap::Args;

use super::args::{ColorChoice, PackArgs};
use attn_policy::Code;
use attn_policy::Severity;
use attn_policy_analysis::lint::lint;

#[derive(Args, Debug)]
#[command(after_help = concat!("\
Every finding has a stable code, a level and file:line:col (`attn-policy explain-code CODE`
explains one; all of them: docs/diagnostics.md). Lints: duplicate rule ids (loader), rules that
never or always fire, subsumed rules, backends that can never be selected, capabilities a backend
neither rules on nor declares in `supports:`, workarounds whose `until:` the pack's min_versions
have made obsolete. A warning is allowed (reported, not counted) by `--allow CODE` or by the
pack's own `allow: [CODE, ...]` in pack.yaml.

Examples:
  attn-policy check
  attn-policy check --rules rules/te --deny-warnings --allow W-SUBSUMED
  attn-policy check --rules my-pack/ --json

", crate::exit_codes!(), "
  (check: 1 = lint errors, or warnings that are not allowed with --deny-warnings;
   2 = the pack does not load)"))]
pub struct CheckArgs {
    #[command(flatten)]
    pub pack: PackArgs,
    /// Print the diagnostics as a JSON array.
    #[arg(long)]
    pub json: bool,
    /// Treat warnings that are not allowed as errors for the exit code.
    #[arg(long)]
    pub deny_warnings: bool,
    /// Allow a warning code: report it, do not count it (repeatable), e.g. --allow W-SUBSUMED.
    #[arg(long = "allow", value_name = "CODE", value_parser = warning_code)]
    pub allow: Vec<Code>,
    /// Colour: auto, always, never.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
}

/// A warning code (`W-...`, any case).
fn warning_code(s: &str) -> Result<Code, String> {
    use strum::IntoEnumIterator;
    match Code::parse(s) {
        Some(c) if c.severity() == Severity::Warning => Ok(c),
        Some(c) => Err(format!(
            "`{c}` is an error; only warnings (W-...) can be allowed"
        )),
        None => {
            let names: Vec<&str> = Code::iter()
                .filter(|c| c.severity() == Severity::Warning)
                .map(Code::name)
                .collect();
            let hint = attn_policy::facts::did_you_mean(&s.to_ascii_uppercase(), names.clone())
                .map(|h| format!(" (did you mean `{h}`?)"))
                .unwrap_or_default();
            Err(format!(
                "unknown warning code `{s}`{hint}; codes: {}",
                names.join(", ")
            ))
        }
    }
}

pub fn run(a: CheckArgs) -> i32 {
    use std::io::IsTerminal;
    let color = match a.color {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => {
            !a.json && std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
        }
    };
    let (mut diags, sources, mut allowed, loaded) = match a.pack.spec().load() {
        Ok(policy) => {
            super::args::warn_auto(&policy);
            let mut d = policy.warnings.0.clone();
            d.extend(lint(&policy));
            (d, policy.sources.clone(), policy.allow.clone(), true)
        }
        Err(attn_policy::PackError::Load(e)) => (e.diagnostics.0, e.sources, Vec::new(), false),
        Err(other) => return super::fail(super::args::with_hint(other)),
    };
    allowed.extend(a.allow.iter().copied());
    for d in &mut diags {
        d.locate(&sources);
    }
    let is_allowed =
        |d: &attn_policy::Diagnostic| d.severity == Severity::Warning && allowed.contains(&d.code);
    let errors = diags
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .count();
    let allowed_n = diags.iter().filter(|d| is_allowed(d)).count();
    let warnings = diags.len() - errors - allowed_n;
    if a.json {
        let list: Vec<serde_json::Value> = diags
            .iter()
            .map(|d| {
                let mut v = serde_json::to_value(d).expect("serialisable");
                v["allowed"] = is_allowed(d).into();
                v
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&list).expect("serialisable")
        );
    } else {
        for d in &diags {
            let mut text = d.render(&sources, color);
            if is_allowed(d) {
                text.push_str("\n  (allowed)");
            }
            println!("{text}\n");
        }
        println!(
            "{errors} error(s), {warnings} warning(s){}",
            if allowed_n > 0 {
                format!(", {allowed_n} allowed")
            } else {
                String::new()
            }
        );
    }
    if !loaded {
        // Like every other command: a pack that does not load is bad input.
        super::EXIT_BAD_INPUT
    } else if errors > 0 || (a.deny_warnings && warnings > 0) {
        super::EXIT_FOUND
    } else {
        super::EXIT_OK
    }
}
