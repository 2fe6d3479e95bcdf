//! The `attn-policy` command line. Library code lives in the `attn_policy` crate (decisions,
//! analysis) and `attn_policy_adapters` (executors); this binary parses arguments, reads inputs
//! and prints.

mod commands;

fn main() {
    std::process::exit(commands::main());
}
