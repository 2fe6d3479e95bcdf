//! `attn-policy run`: decide with a pack (default `native`), walk the selected backend's
//! executor chain (the pack's `executors:`), run the first entry that can run here on random
//! inputs, verify against the float64 reference when small enough, and report every chain
//! entry's outcome. A substitute (any entry but the first) is reported, never silent;
//! `--no-substitute` makes it an error.
//!
//! Where a CUDA device is present the decision is made with its live facts (compute capability,
//! the libcudnn the executors load) instead of the config's, and the output says when they
//! differ; `--as-configured` keeps the config's.

use clap::Args;
use serde_json::{Value as Json, json};

use super::args::{ConfigArgs, Format, Input, OutputArgs, Sources};
use attn_policy::Explanation;
use attn_policy::facts::te::TE;
use attn_policy::facts::{Facts, InputError, Value};
use attn_policy::{CallExtras, ExecutorOutcome};
use attn_policy_adapters::chain::{self, ChainError, ChainOptions};
use attn_policy_adapters::trial::{RunOptions, RunReport, VerifyMode, plan_trial, run_planned};
use attn_policy_adapters::{
    AttentionProblem, LiveDevice, NotExpressible, Registry, live_device, problem_from_facts,
};

/// Exit codes of `run` (the table of every command: docs/cli.md, `--help`).
const EXIT_NO_BACKEND: i32 = super::EXIT_FOUND;
const EXIT_NOTHING_RAN: i32 = super::EXIT_NOT_RUN;
const EXIT_VERIFICATION_FAILED: i32 = super::EXIT_VERIFY_FAILED;

#[derive(Args, Debug)]
#[command(after_help = "\
Examples:
  attn-policy run --pack native --head-dim 64 --seqlen 128          # anywhere: CPU reference
  attn-policy run --pack te --head-dim 64 --seqlen 128              # te: its chains, reference here
  attn-policy run --pack te --preset gemma4-sliding --seqlen 64 --batch 1 --no-substitute
  attn-policy run --preset gemma4-global --seqlen 16384             # on a GPU: chunked executor
  attn-policy run --pack te --preset gemma4-global --as-configured  # SM100 decision, run here

Exit codes: 0 ran (and verified where verification applies), 1 no backend selected,
2 bad input or rules, 4 no chain entry could run (or a substitution was refused, or the
executor that ran failed while running), 5 verification failed.")]
pub struct RunArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Embedded pack of the te fact family whose backends name executor chains: native, te,
    /// te@<release> or te@auto (with --te-version or the te_version fact).
    #[arg(long, default_value = "native")]
    pub pack: String,
    #[command(flatten)]
    pub te: super::args::TeVersionArg,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Forward only.
    #[arg(long)]
    pub forward_only: bool,
    /// Verification: auto (when small enough), always, never.
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "never"])]
    pub verify: String,
    /// Only the selected backend's own executor (its chain's first entry) may run: a substitute
    /// is an error (exit 4).
    #[arg(long)]
    pub no_substitute: bool,
    /// Decide with the config's device facts (compute capability, cuDNN version) even where a
    /// GPU is present; the chain then runs what it can here.
    #[arg(long)]
    pub as_configured: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// A device fact whose live value differs from the config's.
struct Difference {
    fact: &'static str,
    configured: Value,
    live: Value,
}

/// What the live device said and whether the decision used it.
struct DeviceFacts {
    live: Result<LiveDevice, String>,
    used: bool,
    differences: Vec<Difference>,
}

impl DeviceFacts {
    fn to_json(&self) -> Json {
        let differs: Vec<Json> = self
            .differences
            .iter()
            .map(|d| {
                json!({"fact": d.fact, "configured": d.configured.to_json(None),
                       "live": d.live.to_json(None)})
            })
            .collect();
        match &self.live {
            Ok(d) => json!({
                "available": true,
                "name": d.name,
                "compute_capability": [d.compute_capability.0, d.compute_capability.1],
                "cudnn_version": d.cudnn_version.map(|(a, b, p)| format!("{a}.{b}.{p}")),
                "cudnn_unavailable": d.cudnn_unavailable,
                "used": self.used,
                "differs_from_config": differs,
            }),
            Err(why) => json!({"available": false, "reason": why, "used": false,
                               "differs_from_config": []}),
        }
    }

    fn text(&self) -> String {
        let configured = self
            .differences
            .iter()
            .map(|d| format!("{} {}", d.fact, d.configured.display(None)))
            .collect::<Vec<_>>()
            .join(", ");
        match &self.live {
            Err(why) => format!("no CUDA device ({why}): decided with the config's device facts"),
            Ok(d) if self.used && self.differences.is_empty() => {
                format!("decided for the live device {}", d.describe())
            }
            Ok(d) if self.used => format!(
                "decided for the live device {}, not the config's {configured} (--as-configured keeps the config's)",
                d.describe()
            ),
            Ok(d) if self.differences.is_empty() => {
                format!(
                    "decided with the config's facts, which match this device: {}",
                    d.describe()
                )
            }
            Ok(d) => format!(
                "decided with the config's {configured} (--as-configured); this device is {}",
                d.describe()
            ),
        }
    }
}

fn merge_into(config: &mut Json, extra: &Json) {
    if let (Some(c), Some(e)) = (config.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            c.insert(k.clone(), v.clone());
        }
    }
}

/// The te facts of a merged config; an error says where the offending value was given.
fn facts_of(config: &Json, input: &Input) -> Result<Facts, InputError> {
    TE.read(config).map_err(|e| {
        let at = input.locate(&e.path);
        e.at(at)
    })
}

pub fn run(a: RunArgs) -> i32 {
    let color = a.output.stdout_color();
    let spec = attn_policy::PackSpec::embedded(&a.pack).with_catalogue(super::args::catalogue());
    let warn = a.output.format() == Format::Human;
    let (policy, input) = match super::args::load_with_config(
        spec,
        a.te.te_version.as_deref(),
        &a.config,
        a.output.stderr_color(),
        warn,
    ) {
        Ok(p) => p,
        Err(code) => return code,
    };
    // Executors take te-family facts (`problem_from_facts`); the torch pack's executors are the
    // Python host's (`attn_policy.torch`).
    let family = policy.schema.family;
    if family != "te" {
        return super::fail(format!(
            "`run` decides with packs of the te fact family (te, native); pack `{}` is of the \
             `{family}` family, whose executors run inside Python (attn_policy.torch)",
            policy.name
        ));
    }
    let (mut config, mut sources) = (input.json.clone(), input.provenance());
    let note = super::explain::shell_note(&input);
    // Live device facts: the decision is for the device the executors run on.
    let configured = match facts_of(&config, &input) {
        Ok(f) => f,
        Err(e) => return super::fail(e),
    };
    let device = match live_device_facts(
        &mut config,
        &mut sources,
        &input,
        &configured,
        a.as_configured,
    ) {
        Ok(d) => d,
        Err(e) => return super::fail(e),
    };
    let mut facts = match facts_of(&config, &input) {
        Ok(f) => f,
        Err(e) => return super::fail(e),
    };
    let problem = problem_from_facts(&facts);
    // Live probes: is there a GPU executor, and can cuDNN build this graph here?
    let registry = Registry::builtin();
    answer_live_probes(&mut facts, &mut sources, &registry, &problem);
    let decision = policy.decide(&facts);
    let ex = Explanation::new(&policy, &facts, &decision).with_provenance(sources);
    let Some(selected) = decision.selected else {
        print_outcome(&a, color, &ex, &device, &note, None, None);
        eprintln!(
            "error: no backend of pack `{}` can serve this configuration",
            policy.name
        );
        return EXIT_NO_BACKEND;
    };
    let backend = policy.backends[selected as usize].name.clone();
    let variant = decision.backends[selected as usize].variant;
    let names: Vec<&str> = policy
        .executor_chain_for(selected, variant, &facts)
        .iter()
        .map(|e| e.executor.as_str())
        .collect();
    let opts = run_options(&a);
    let chain_opts = chain_options(&a, &facts);
    // The walk ends with the plan step; running is after it, and a failure while running is
    // an error, never a retry on the next entry (docs/executors.md).
    let walked = chain::walk(
        &registry,
        &backend,
        &names,
        problem.as_ref(),
        &chain_opts,
        |ex, p| Ok((ex.clone(), plan_trial(ex.as_ref(), p, &opts)?)),
    );
    match walked {
        Ok(mut w) => {
            let p = problem
                .as_ref()
                .expect("an entry ran, so the problem is expressible");
            let (executor, plans) = &w.output;
            let report = match run_planned(executor.as_ref(), plans, p, a.seed, &opts) {
                Ok(report) => report,
                Err(e) => {
                    let ran = &mut w.attempts[w.index];
                    ran.outcome = ExecutorOutcome::Failed;
                    ran.reason = Some(e.to_string());
                    let message = format!(
                        "executor `{}` failed while running: {e} (a failure while running is not retried on another executor)",
                        w.executor
                    );
                    let ex = ex.with_executor_chain(w.attempts);
                    print_outcome(&a, color, &ex, &device, &note, None, Some(&message));
                    eprintln!(
                        "error: pack `{}` selected {backend}, but {message}",
                        policy.name
                    );
                    return EXIT_NOTHING_RAN;
                }
            };
            let ex = ex.with_executor_chain(w.attempts);
            print_outcome(&a, color, &ex, &device, &note, Some(&report), None);
            if a.output.format() == Format::Human {
                print_report(&report, p);
            }
            match report.verification.as_ref().map(|v| v.passed) {
                Some(false) => {
                    eprintln!(
                        "error: `{}` ran but failed verification against the float64 reference",
                        report.executor
                    );
                    EXIT_VERIFICATION_FAILED
                }
                _ => 0,
            }
        }
        Err(e) => {
            let ex = ex.with_executor_chain(e.attempts().to_vec());
            let message = match &e {
                ChainError::SubstitutionRefused { .. } => {
                    e.to_string().replace("no_substitute", "--no-substitute")
                }
                _ => e.to_string(),
            };
            print_outcome(&a, color, &ex, &device, &note, None, Some(&message));
            eprintln!(
                "error: pack `{}` selected {backend}, but {message}",
                policy.name
            );
            EXIT_NOTHING_RAN
        }
    }
}

/// The live device's facts, where a CUDA device answers: the decision is for the device the
/// executors run on, so they replace the config's in `config` (their `sources` say "live")
/// unless `as_configured`; those that differ from the `configured` facts are listed.
fn live_device_facts(
    config: &mut Json,
    sources: &mut Sources,
    input: &Input,
    configured: &Facts,
    as_configured: bool,
) -> Result<DeviceFacts, InputError> {
    let mut device = DeviceFacts {
        live: live_device(0),
        used: false,
        differences: Vec::new(),
    };
    if let Ok(d) = &device.live {
        let live_config = d.te_config();
        let mut with_live = config.clone();
        merge_into(&mut with_live, &live_config);
        let live_facts = facts_of(&with_live, input)?;
        for fact in ["sm", "cudnn_version"] {
            if let (Some(c), Some(l)) = (configured.get(fact), live_facts.get(fact))
                && c != l
                && live_config
                    .get(if fact == "sm" {
                        "device_compute_capability"
                    } else {
                        fact
                    })
                    .is_some()
            {
                device.differences.push(Difference {
                    fact,
                    configured: c,
                    live: l,
                });
            }
        }
        if !as_configured {
            *config = with_live;
            for key in live_config.as_object().into_iter().flat_map(|o| o.keys()) {
                sources.push((key.clone(), "live"));
            }
            device.used = true;
        }
    }
    Ok(device)
}

/// Live probes: is there a GPU executor, and can cuDNN build this graph here? Answers the
/// probes the config left unknown (their `sources` say "live").
fn answer_live_probes(
    facts: &mut Facts,
    sources: &mut Sources,
    registry: &Registry,
    problem: &Result<AttentionProblem, NotExpressible>,
) {
    let gpu = registry.get("chunked").is_ok();
    if facts.get("probe.cuda_device") == Some(Value::Unknown) {
        let _ = facts.set_probe("cuda_device", Some(gpu));
        sources.push(("probe.cuda_device".into(), "live"));
    }
    if facts.get("probe.fused_attn_graph") == Some(Value::Unknown) {
        let cudnn_ok = gpu
            && registry.names().contains(&"cudnn")
            && problem
                .as_ref()
                .is_ok_and(|p| registry.get("cudnn").is_ok_and(|e| e.check(p).is_ok()));
        let _ = facts.set_probe("fused_attn_graph", Some(cudnn_ok));
        sources.push(("probe.fused_attn_graph".into(), "live"));
    }
}

/// How the executor runs: backward unless `--forward-only`, verification as `--verify` says.
fn run_options(a: &RunArgs) -> RunOptions {
    RunOptions {
        backward: !a.forward_only,
        verify: match a.verify.as_str() {
            "always" => VerifyMode::Always,
            "never" => VerifyMode::Never,
            _ => VerifyMode::Auto,
        },
        ..RunOptions::default()
    }
}

/// How the chain is walked: on device 0, `--no-substitute`, with the decided cuDNN version.
fn chain_options(a: &RunArgs, facts: &Facts) -> ChainOptions {
    ChainOptions {
        ordinal: 0,
        no_substitute: a.no_substitute,
        decided_cudnn_version: match facts.get("cudnn_version") {
            Some(Value::Version(v)) => Some((v.parts[0], v.parts[1], v.parts[2])),
            _ => None,
        },
    }
}

/// The decision with its chain: the JSON document, or the explanation text with the one-line
/// account of the run and the device facts.
fn print_outcome(
    a: &RunArgs,
    color: bool,
    ex: &Explanation,
    device: &DeviceFacts,
    shell_note: &str,
    report: Option<&RunReport>,
    error: Option<&str>,
) {
    match a.output.format() {
        Format::Json | Format::Te => {
            // The call document (docs/schema/call-v1.json), the shape the Python package's
            // `Explanation.to_dict()` returns too.
            let doc = ex.to_call_json(CallExtras {
                run: report.map(|r| serde_json::to_value(r).unwrap_or(Json::Null)),
                device: Some(device.to_json()),
                fallback: None,
                error: error.map(str::to_string),
                extra: None,
            });
            println!("{}", serde_json::to_string_pretty(&doc).expect("json"));
        }
        Format::Human => {
            print!("{}", ex.to_text(color));
            print!("{shell_note}");
            println!();
            if let Some(backend) = &ex.selected {
                println!(
                    "executor:  {}",
                    chain::run_summary(backend, &ex.executor_chain)
                );
            }
            println!("device:    {}", device.text());
        }
    }
}

fn print_report(report: &RunReport, problem: &attn_policy_adapters::AttentionProblem) {
    println!(
        "ran:       {} on {} (seed {})",
        report.executor, report.device, report.seed
    );
    println!("problem:   {problem}");
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
}
