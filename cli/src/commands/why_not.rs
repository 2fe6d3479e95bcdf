//! `attn-policy why-not BACKEND <config>`: verified changes that would make a backend eligible.

use clap::Args;

use super::args::{ConfigArgs, PackArgs};
use attn_policy::analysis::why_not::why_not;

#[derive(Args, Debug)]
#[command(after_help = "\
Each hint is verified by deciding the changed input again. Facts the user cannot change (the
GPU, live probes) are reported, not proposed. Unanswered probes count as \"supported\".

Examples:
  attn-policy why-not FrostAttention --head-dim 260 --sm 100
  attn-policy why-not FrostAttention --preset gemma4-global-cp-p2p --window 128,0
  attn-policy why-not FlashAttention config.json --json

Exit codes: 0 eligible already or hints found, 1 no verified hint, 2 bad input.")]
pub struct WhyNotArgs {
    /// Backend name as the pack spells it (e.g. FrostAttention).
    pub backend: String,
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub pack: PackArgs,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: WhyNotArgs) -> i32 {
    let policy = match a.pack.load(false) {
        Ok(p) => p,
        Err(code) => return code,
    };
    // Read (and validate) the input first, so that a bad value is reported where it was given.
    let (_, input) = match a.config.facts() {
        Ok(f) => f,
        Err(e) => return super::fail(e),
    };
    let config = input.json.clone();
    let r = match why_not(&policy, &a.backend, &config) {
        Ok(r) => r,
        Err(e) => return super::fail(e),
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&r).expect("serialisable")
        );
    } else if r.eligible {
        println!(
            "{} is eligible for this input{}",
            r.backend,
            match &r.selected {
                Some(s) if *s != r.backend => format!(" (outranked by {s})"),
                _ => String::new(),
            }
        );
    } else {
        println!("{} is not eligible for this input.", r.backend);
        for (id, reason) in &r.declined_by {
            println!("  declined by {id}: {reason}");
        }
        if r.hints.is_empty() {
            println!("no verified change makes it eligible");
        } else {
            println!("smallest changes (each verified):");
            for h in &r.hints {
                println!("  - {}", h.text);
            }
        }
        for u in &r.unchangeable {
            println!("  cannot change: {u}");
        }
    }
    if r.eligible || !r.hints.is_empty() {
        0
    } else {
        1
    }
}
