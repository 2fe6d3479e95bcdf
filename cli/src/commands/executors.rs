//! `attn-policy executors`: every executor the adapters know, with its manifest and whether it
//! can run here (and why not: no GPU, feature off, library missing, provided by the Python
//! host).

use clap::Args;

use attn_policy_adapters::{Availability, Registry};

#[derive(Args, Debug)]
#[command(after_help = concat!("\
Each executor's availability is checked here and now: no GPU, a feature this binary was built
without (`cargo build --release --features cudnn`), a library that does not load, or
\"provided by the Python host\" (attn_policy.torch). `attn-policy run` walks a backend's chain
of these executors (docs/executors.md).

Examples:
  attn-policy executors
  attn-policy executors --json

", crate::exit_codes!()))]
pub struct ExecutorsArgs {
    /// Print the list as JSON (name, description, provider, feature, availability with its
    /// reason or detail, manifest).
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: ExecutorsArgs) -> i32 {
    let list = Registry::builtin().describe();
    if a.json {
        match serde_json::to_string_pretty(&list) {
            Ok(s) => println!("{s}"),
            Err(e) => return super::fail(e.to_string()),
        }
        return 0;
    }
    for e in &list {
        let m = &e.manifest;
        let (word, why) = match &e.availability {
            Availability::Available { detail } => ("available", detail.as_str()),
            Availability::Unavailable { reason } => ("unavailable", reason.as_str()),
        };
        println!("{:<16} {:<11} {why}", e.name, word);
        let dtypes: Vec<&str> = m.dtypes.iter().map(|d| d.rule_name()).collect();
        println!(
            "    {}; {:?}{}; dtypes {}; head_dim {}; backward {}; deterministic {}",
            e.description,
            m.device,
            match (m.min_compute_capability, m.max_compute_capability) {
                (Some(lo), Some(hi)) if lo == hi => format!(" sm == {lo}"),
                (lo, hi) => format!(
                    "{}{}",
                    lo.map(|c| format!(" sm >= {c}")).unwrap_or_default(),
                    hi.map(|c| format!(" sm <= {c}")).unwrap_or_default()
                ),
            },
            dtypes.join("/"),
            m.head_dim_qk,
            m.backward,
            m.deterministic
        );
    }
    0
}
