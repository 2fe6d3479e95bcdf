//! `attn-policy check`: load, type-check and lint a pack.

use clap::Args;

use super::args::{ColorChoice, PackArgs};
use attn_policy::Severity;
use attn_policy::analysis::lint::lint;

#[derive(Args, Debug)]
#[command(after_help = "\
Every finding has a stable code, a level and file:line:col (codes: docs/analysis.md).
Lints: duplicate rule ids (loader), rules that never or always fire, subsumed rules, backends
that can never be selected, capabilities a backend neither rules on nor declares in
`supports:`, workarounds whose `until:` the pack's min_versions have made obsolete.

Examples:
  attn-policy check
  attn-policy check --rules rules/te
  attn-policy check --rules my-pack/ --json

Exit codes: 0 no errors, 1 errors (or warnings with --deny-warnings), 2 bad arguments.")]
pub struct CheckArgs {
    #[command(flatten)]
    pub pack: PackArgs,
    /// Print the diagnostics as a JSON array.
    #[arg(long)]
    pub json: bool,
    /// Treat warnings as errors for the exit code.
    #[arg(long)]
    pub deny_warnings: bool,
    /// Colour: auto, always, never.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
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
    let (mut diags, sources) = match a.pack.spec().load() {
        Ok(policy) => {
            let mut d = policy.warnings.0.clone();
            d.extend(lint(&policy));
            (d, policy.sources.clone())
        }
        Err(attn_policy::PackError::Load(e)) => (e.diagnostics.0, e.sources),
        Err(other) => return super::fail(other),
    };
    for d in &mut diags {
        d.locate(&sources);
    }
    let errors = diags
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .count();
    let warnings = diags.len() - errors;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&diags).expect("serialisable")
        );
    } else {
        for d in &diags {
            println!("{}\n", d.render(&sources, color));
        }
        println!("{errors} error(s), {warnings} warning(s)");
    }
    if errors > 0 || (a.deny_warnings && warnings > 0) {
        1
    } else {
        0
    }
}
