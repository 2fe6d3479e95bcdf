//! The `attn-policy` command line. Library code lives in `attn_policy`; this binary only parses
//! arguments, reads inputs and prints.

mod cli;

fn main() {
    std::process::exit(cli::run());
}
