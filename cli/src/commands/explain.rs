//! `attn-policy explain`: decide for one configuration and explain every backend.

use clap::Args;
use serde_json::{Map, Value as Json};

use super::args::{ConfigArgs, Format, Input, OutputArgs, PackArgs};
use attn_policy::facts::schema::Ty;
use attn_policy::{Explanation, Facts};

#[derive(Args, Debug)]
#[command(after_help = "\
NVTE_* variables of the shell are read as TransformerEngine reads them; --env NAME=VALUE
overrides one, --no-env ignores them all. The JSON output's `provenance` says where each input
key came from (shell, preset, config, flag) and `input` echoes every fact decided on.

Examples:
  attn-policy explain --preset gemma4-global-cp-p2p
  attn-policy explain --preset gemma4-global --sm 90 --format te
  attn-policy explain examples/gemma4-global.json --json --parity
  attn-policy explain --head-dim 260 --sm 100 --mask causal --probe fused_attn_graph=true

Exit codes: 0 selected, 1 no backend can serve the input, 2 bad input or bad rules.")]
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
    let (facts, input) = match a.config.facts() {
        Ok(f) => f,
        Err(e) => return super::fail(e),
    };
    let decision = policy.decide(&facts);
    let ex = Explanation::new(&policy, &facts, &decision);
    match a.output.format() {
        Format::Human => {
            print!("{}", ex.to_text(a.output.stdout_color()));
            print!("{}", shell_note(&input));
        }
        Format::Json => {
            let mut json = ex.to_json();
            add_input(&mut json, &facts, &input);
            println!("{}", serde_json::to_string_pretty(&json).expect("json"));
        }
        Format::Te => println!(
            "{}",
            serde_json::to_string_pretty(&ex.to_te()).expect("json")
        ),
    }
    decision.exit_code()
}

/// Every fact as decided on, by path (enums and versions as text, unknown probes as
/// `"unknown"`).
pub fn resolved(facts: &Facts) -> Map<String, Json> {
    let schema = facts.schema();
    schema
        .fields
        .iter()
        .zip(facts.values())
        .map(|(d, v)| {
            let domain = match d.ty {
                Ty::Enum(dom) => Some(dom),
                _ => None,
            };
            (d.path.to_string(), v.to_json(domain))
        })
        .collect()
}

/// Adds `input` (every fact decided on) and `provenance` (input key -> shell, preset, config,
/// flag) to an explain/v1 document. The owned explanation model records both itself once it
/// lands (`Explanation::with_provenance`); until then the CLI adds them here.
pub fn add_input(json: &mut Json, facts: &Facts, input: &Input) {
    if let Some(obj) = json.as_object_mut() {
        obj.insert("input".into(), Json::Object(resolved(facts)));
        let provenance: Map<String, Json> = input
            .provenance()
            .into_iter()
            .map(|(k, w)| (k, Json::String(w.into())))
            .collect();
        obj.insert("provenance".into(), Json::Object(provenance));
    }
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
