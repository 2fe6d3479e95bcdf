//! `attn-policy explain`: decide for one configuration and explain every backend.

use clap::Args;

use super::args::{ConfigArgs, Format, OutputArgs, PackArgs};
use attn_policy::Explanation;

#[derive(Args, Debug)]
#[command(after_help = "\
Examples:
  attn-policy explain --preset gemma4-global-cp-p2p
  attn-policy explain --preset gemma4-global --sm 90 --format te
  attn-policy explain record.json --json --parity
  attn-policy explain --head-dim 260 --sm 100 --mask causal --probe fused_attn_graph=true
  attn-policy explain --pack torch --head-dim 512 --heads 32 --kv-heads 8 --enable-gqa
  attn-policy explain --pack torch record.json --disable cudnn --json")]
pub struct ExplainArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub pack: PackArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub fn run(a: ExplainArgs) -> i32 {
    let policy = match a.pack.load(a.output.stderr_color()) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let (facts, sources) = match a.config.facts_for_with_sources(&policy) {
        Ok(f) => f,
        Err(e) => return super::fail(e),
    };
    let decision = policy.decide(&facts);
    let ex = Explanation::new(&policy, &facts, &decision).with_provenance(sources);
    match a.output.format() {
        Format::Human => print!("{}", ex.to_text(a.output.stdout_color())),
        Format::Json => println!("{}", ex.to_json_string(true)),
        Format::Te => println!(
            "{}",
            serde_json::to_string_pretty(&ex.to_te()).expect("json")
        ),
    }
    ex.exit_code()
}
