//! `attn-policy explain`: decide for one configuration and explain every backend.

use clap::Args;

use super::args::{ConfigArgs, Format, Input, OutputArgs, PackArgs};
use attn_policy::Explanation;

#[derive(Args, Debug)]
#[command(after_help = "\
NVTE_* variables of the shell are read as TransformerEngine reads them; --env NAME=VALUE
overrides one, --no-env ignores them all. The JSON output's `provenance` says where each input
key came from (shell, preset, config, flag) and `input` echoes every fact decided on.

Examples:
  attn-policy explain --preset gemma4-global-cp-p2p
  attn-policy explain --preset gemma4-global --sm 90 --format te
  attn-policy explain --preset gemma4-global --sm 90 --executors   # the chain `run` would walk
  attn-policy explain examples/gemma4-global.json --json --parity
  attn-policy explain --head-dim 260 --sm 100 --mask causal --probe fused_attn_graph=true
  attn-policy explain --pack torch --head-dim 512 --heads 32 --kv-heads 8 --enable-gqa
  attn-policy explain --pack torch record.json --disable cudnn --json
  attn-policy explain --pack te@auto --te-version 2.19.0 --preset gemma4-global

Exit codes: 0 selected, 1 no backend can serve the input, 2 bad input or bad rules.")]
pub struct ExplainArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Also list the executor chain that would run the decision (the pack's `executors:` for
    /// the selected backend, as `run` would walk it; nothing runs here: every entry is
    /// `not_tried`).
    #[arg(long)]
    pub executors: bool,
    #[command(flatten)]
    pub pack: PackArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub fn run(a: ExplainArgs) -> i32 {
    // The `te@auto` warning goes to stderr in text; the JSON holds it (`pack_from`).
    let warn = a.output.format() == Format::Human;
    let (policy, input) = match a
        .pack
        .load_with_config(&a.config, a.output.stderr_color(), warn)
    {
        Ok(p) => p,
        Err(code) => return code,
    };
    let facts = match input.facts_of(policy.schema) {
        Ok(f) => f,
        Err(e) => return super::fail(e),
    };
    let decision = policy.decide(&facts);
    let mut ex = Explanation::new(&policy, &facts, &decision).with_provenance(input.provenance());
    if a.executors {
        ex = ex.with_unwalked_chain(
            &policy,
            &facts,
            &decision,
            "explain runs nothing; `attn-policy run` walks this chain",
        );
    }
    match a.output.format() {
        Format::Human => {
            print!("{}", ex.to_text(a.output.stdout_color()));
            print!("{}", shell_note(&input));
        }
        Format::Json => println!("{}", ex.to_json_string(true)),
        Format::Te => println!(
            "{}",
            serde_json::to_string_pretty(&ex.to_te()).expect("json")
        ),
    }
    ex.exit_code()
}

/// One line naming the environment variables taken from the shell (they change decisions
/// without appearing on the command line).
pub fn shell_note(input: &Input) -> String {
    let vars = input.shell_values();
    if vars.is_empty() {
        return String::new();
    }
    let list: Vec<String> = vars.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!(
        "\nfrom the shell environment: {} (--env NAME=VALUE overrides, --no-env ignores)\n",
        list.join(" ")
    )
}
