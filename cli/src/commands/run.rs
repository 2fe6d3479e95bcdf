//! `attn-policy run`: select with a pack whose backends are this project's executors (default
//! `native`), then execute on random inputs, verify against the float64 reference when small
//! enough, and report which executor ran, time and peak memory. No silent fallback: if the
//! selected executor refuses at run time, that is an error.

use clap::Args;
use serde_json::json;

use super::args::{ConfigArgs, Format, OutputArgs};
use attn_policy::Explanation;
use attn_policy::facts::Value;
use attn_policy_adapters::run::{RunOptions, VerifyMode, run_on};
use attn_policy_adapters::{Registry, problem_from_facts};

#[derive(Args, Debug)]
#[command(after_help = "\
Examples:
  attn-policy run --pack native --head-dim 64 --seqlen 128          # anywhere: CPU reference
  attn-policy run --preset gemma4-global --seqlen 16384             # on a GPU: chunked executor
  attn-policy run --head-dim 128 --seqlen 4096 --mask causal --heads 8 --kv-heads 4 --json

Exit codes: 0 ran (and verified where verification applies), 1 no backend selected, 2 bad input
or bad rules, 4 the selected executor could not run (unavailable or refused), 5 verification
failed.")]
pub struct RunArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Embedded pack whose backends are executors.
    #[arg(long, default_value = "native")]
    pub pack: String,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Forward only.
    #[arg(long)]
    pub forward_only: bool,
    /// Verification: auto (when small enough), always, never.
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "never"])]
    pub verify: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub fn run(a: RunArgs) -> i32 {
    let color = a.output.stdout_color();
    let spec = attn_policy::PackSpec::embedded(&a.pack).with_catalogue(super::args::catalogue());
    let policy = match super::args::load_spec(&spec, a.output.stderr_color()) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let (mut facts, input) = match a.config.facts() {
        Ok(f) => f,
        Err(e) => return super::fail(e),
    };
    let problem = problem_from_facts(&facts);
    // Live probes: is there a GPU executor, and can cuDNN build this graph here?
    // Every executor of the adapters (cudnn included; each unavailable without its feature or
    // a GPU).
    let registry = Registry::builtin();
    let gpu = registry.get("chunked").is_ok();
    if facts.get("probe.cuda_device") == Some(Value::Unknown) {
        let _ = facts.set_probe("cuda_device", Some(gpu));
    }
    if facts.get("probe.fused_attn_graph") == Some(Value::Unknown) {
        let cudnn_ok = gpu
            && registry.names().contains(&"cudnn")
            && problem
                .as_ref()
                .is_ok_and(|p| registry.get("cudnn").is_ok_and(|e| e.check(p).is_ok()));
        let _ = facts.set_probe("fused_attn_graph", Some(cudnn_ok));
    }
    let decision = policy.decide(&facts);
    let ex = Explanation::new(&policy, &facts, &decision);
    let Some(sel) = decision.selected else {
        print!("{}", ex.to_text(color));
        eprintln!(
            "error: no executor of pack `{}` can run this configuration",
            policy.name
        );
        return 1;
    };
    let name = policy.backends[sel as usize].name.clone();
    let problem = match problem {
        Ok(p) => p,
        Err(e) => {
            eprintln!(
                "error: `{name}` was selected but the config cannot be expressed as an executor problem: {e}"
            );
            return super::EXIT_NOT_RUN;
        }
    };
    let opts = RunOptions {
        backward: !a.forward_only,
        verify: match a.verify.as_str() {
            "always" => VerifyMode::Always,
            "never" => VerifyMode::Never,
            _ => VerifyMode::Auto,
        },
        ..RunOptions::default()
    };
    let executor = match registry.get(&name) {
        Ok(e) => e,
        Err(e) => {
            eprintln!(
                "error: pack `{}` selected `{name}`, but the executor is unavailable: {e}",
                policy.name
            );
            return super::EXIT_NOT_RUN;
        }
    };
    let report = match run_on(executor.as_ref(), &problem, a.seed, &opts) {
        Ok(r) => r,
        Err(e) => {
            // No silent fallback: the selected executor refused or failed.
            eprintln!("error: the selected executor `{name}` did not run: {e}");
            return super::EXIT_NOT_RUN;
        }
    };
    let verified = report.verification.as_ref().map(|v| v.passed);
    match a.output.format() {
        Format::Json | Format::Te => {
            println!("{}", {
                let mut decision = ex.to_json();
                super::explain::add_input(&mut decision, &facts, &input);
                serde_json::to_string_pretty(&json!({"decision": decision, "run": report}))
                    .expect("json")
            });
        }
        Format::Human => {
            print!("{}", ex.to_text(color));
            print!("{}", super::explain::shell_note(&input));
            println!();
            println!(
                "ran:       {} on {} (seed {})",
                report.executor, report.device, report.seed
            );
            println!(
                "problem:   b{} hq{} hkv{} s_q {} s_kv {} d_qk {} d_v {} {} {} {}",
                problem.batch,
                problem.heads_q,
                problem.heads_kv,
                problem.seqlen_q,
                problem.seqlen_kv,
                problem.head_dim_qk,
                problem.head_dim_v,
                problem.dtype,
                problem.mask.kind.rule_name(),
                if problem.deterministic {
                    "deterministic"
                } else {
                    ""
                }
            );
            println!(
                "forward:   {:.3} ms ({:.1} TFLOP/s)",
                report.forward_ms, report.forward_tflops
            );
            if let Some(b) = report.backward_ms {
                println!("backward:  {b:.3} ms");
            }
            match report.peak_bytes {
                Some(p) => println!(
                    "peak mem:  {:.1} MiB (workspace {:.1} MiB)",
                    p as f64 / 1048576.0,
                    report.workspace_bytes as f64 / 1048576.0
                ),
                None => println!(
                    "peak mem:  not measured (workspace {:.1} MiB)",
                    report.workspace_bytes as f64 / 1048576.0
                ),
            }
            match &report.verification {
                Some(v) => {
                    println!(
                        "verified:  {} against the float64 reference (LSE rel err {:.2e})",
                        if v.passed { "PASS" } else { "FAIL" },
                        v.lse_rel_err
                    );
                    for c in &v.checks {
                        println!(
                            "           {:<3} err {:.3e}  naive same-dtype err {:.3e}  {}",
                            c.name,
                            c.err,
                            c.naive_err,
                            if c.passed { "ok" } else { "FAIL" }
                        );
                    }
                }
                None => println!(
                    "verified:  skipped ({})",
                    report.verification_skipped.as_deref().unwrap_or("disabled")
                ),
            }
            if !gpu {
                println!("note:      no CUDA GPU here, so the CPU float64 reference ran");
            }
        }
    }
    if verified == Some(false) {
        super::EXIT_VERIFY_FAILED
    } else {
        0
    }
}
