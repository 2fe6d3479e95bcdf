//! docs/add-a-backend.md, "Adding an executor", followed literally: a toy executor is written
//! (the `Executor` trait), registered (`Registry::register(RegistryEntry::builtin(..))`), named
//! in a pack's chain (`executors:` in pack.yaml, checked against the catalogue) and walked
//! (`chain::walk`, then `trial::run_on` after the walk).
//!
//! `toy`: CPU, fp16/bf16, head_dim 8..=64 (multiple of 8), no mask, no window. Its plan's
//! forward is its own naive float64 attention (so verification against the float64 reference
//! tests it); its backward plan delegates to the reference's plan. Everything goes through the
//! one contract: `check`, `plan(problem, direction)`, `Plan::run_host`.

use std::path::PathBuf;
use std::sync::Arc;

use attn_policy::ExecutorOutcome;
use attn_policy::PackSpec;
use attn_policy_adapters::chain::{self, ChainError, ChainOptions};
use attn_policy_adapters::executor::{
    direction_mismatch, validate_backward_inputs, validate_forward_inputs,
};
use attn_policy_adapters::reference::{self, Reference};
use attn_policy_adapters::trial::{RunOptions, RunReport, VerifyMode, run_on};
use attn_policy_adapters::{
    AttentionProblem, Availability, DType, DeviceKind, Direction, ExecError, ExecStats, Executor,
    ForwardInputs, ForwardOutput, HeadDimRange, HostIo, HostOutput, LayoutKind, Manifest, MaskKind,
    MaskSpec, Plan, Registry, RegistryEntry, Unsupported, problem_from_facts,
};

// ---- 1. the executor ------------------------------------------------------------------------

const NAME: &str = "toy";

/// What `toy` accepts, as data: the catalogue's `admits` condition is derived from it.
fn manifest() -> Manifest {
    Manifest {
        name: NAME.into(),
        device: DeviceKind::Cpu,
        min_compute_capability: None,
        max_compute_capability: None,
        dtypes: vec![DType::F16, DType::BF16],
        head_dim_qk: HeadDimRange {
            min: 8,
            max: 64,
            multiple_of: 8,
        },
        head_dim_v: HeadDimRange {
            min: 8,
            max: 64,
            multiple_of: 8,
        },
        head_dim_v_may_differ: false,
        masks: vec![MaskKind::NoMask],
        windows: false,
        rectangular: true,
        layouts: vec![LayoutKind::Bshd, LayoutKind::Sbhd, LayoutKind::Bhsd],
        arbitrary_strides: false,
        stride_multiple_of: 1,
        gqa: true,
        max_seqlen: None,
        max_score_elements: Some(1 << 20),
        backward: true,
        deterministic: true,
        features: attn_policy_adapters::Features::none(),
        notes: vec!["a toy: naive float64 forward, the reference's backward".into()],
    }
}

struct Toy;

impl Executor for Toy {
    fn name(&self) -> &str {
        NAME
    }

    fn device_description(&self) -> String {
        "host CPU (toy)".into()
    }

    fn manifest(&self) -> Manifest {
        manifest()
    }

    /// The exact gate: the manifest is the whole truth for `toy`.
    fn check(&self, p: &AttentionProblem) -> Result<(), Unsupported> {
        manifest().admits(p)
    }

    /// The plan: the problem and direction. Its backward is the reference's plan.
    fn plan(&self, p: &AttentionProblem, direction: Direction) -> Result<Arc<dyn Plan>, ExecError> {
        self.check(p)?;
        let backward = match direction {
            Direction::Forward => None,
            Direction::Backward => Some(Reference.plan(p, direction)?),
        };
        Ok(Arc::new(ToyPlan {
            p: p.clone(),
            direction,
            backward,
        }))
    }
}

struct ToyPlan {
    p: AttentionProblem,
    direction: Direction,
    /// The reference's backward plan (backward plans only).
    backward: Option<Arc<dyn Plan>>,
}

impl Plan for ToyPlan {
    fn executor(&self) -> &str {
        NAME
    }

    fn direction(&self) -> Direction {
        self.direction
    }

    fn run_host(&self, io: HostIo<'_>) -> Result<HostOutput, ExecError> {
        match (io, &self.backward) {
            (HostIo::Forward(inputs), None) => {
                validate_forward_inputs(&self.p, &inputs)?;
                Ok(HostOutput::Forward(toy_forward(&self.p, &inputs)))
            }
            (HostIo::Backward(inputs), Some(reference)) => {
                validate_backward_inputs(&self.p, &inputs)?;
                reference.run_host(HostIo::Backward(inputs))
            }
            (io, _) => Err(direction_mismatch(self.direction, io.direction())),
        }
    }
    // `workspace_bytes`, `enqueue` and `run_device` keep their defaults: `toy` has no stream
    // path and no device path (`Unsupported`).
}

/// `toy`'s own naive float64 forward.
fn toy_forward(p: &AttentionProblem, inputs: &ForwardInputs<'_>) -> ForwardOutput {
    let (q, k, v) = (
        reference::decode(inputs.q),
        reference::decode(inputs.k),
        reference::decode(inputs.v),
    );
    let (l, d, dv) = (&p.layout, p.head_dim_qk, p.head_dim_v);
    let group = p.heads_q / p.heads_kv;
    let mut o = vec![0.0; p.o_span()];
    let mut lse = vec![0.0f32; p.lse_len()];
    for b in 0..p.batch {
        for h in 0..p.heads_q {
            let hk = h / group;
            for i in 0..p.seqlen_q {
                let s: Vec<f64> = (0..p.seqlen_kv)
                    .map(|j| {
                        let dot: f64 = (0..d)
                            .map(|x| q[l.q.offset(b, h, i, x)] * k[l.k.offset(b, hk, j, x)])
                            .sum();
                        p.softmax_scale * dot
                    })
                    .collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let sum: f64 = e.iter().sum();
                for x in 0..dv {
                    let acc: f64 = (0..p.seqlen_kv)
                        .map(|j| e[j] * v[l.v.offset(b, hk, j, x)])
                        .sum();
                    o[l.o.offset(b, h, i, x)] = acc / sum;
                }
                lse[(b * p.heads_q + h) * p.seqlen_q + i] = (m + sum.ln()) as f32;
            }
        }
    }
    ForwardOutput {
        o: reference::encode(p.dtype, &o),
        lse,
        stats: ExecStats::default(),
    }
}

// ---- 2. registering it ----------------------------------------------------------------------

fn create(_ordinal: usize) -> Result<Arc<dyn Executor>, ExecError> {
    Ok(Arc::new(Toy))
}

fn availability() -> Availability {
    Availability::Available {
        detail: "host CPU".into(),
    }
}

/// The built-in registry with `toy` added.
fn registry() -> Registry {
    let mut r = Registry::builtin();
    r.register(RegistryEntry::builtin(
        NAME,
        "toy CPU executor (docs/add-a-backend.md)",
        manifest(),
        None,
        create,
        availability,
    ));
    r
}

// ---- 3. walking a chain that names it -------------------------------------------------------

fn problem(d: usize) -> AttentionProblem {
    AttentionProblem::new(1, 4, 2, 24, 40, d, d, DType::BF16)
}

fn run_options() -> RunOptions {
    RunOptions {
        backward: true,
        verify: VerifyMode::Always,
        ..RunOptions::default()
    }
}

/// The walk as `attn-policy run` does it (cli/src/commands/run.rs): the closure is the plan
/// step; running (`run_on`) comes after the walk.
fn walk_and_run(
    registry: &Registry,
    names: &[&str],
    p: &AttentionProblem,
) -> (Vec<(String, ExecutorOutcome, Option<String>)>, RunReport) {
    let w = chain::walk(
        registry,
        "Toy",
        names,
        Ok(p),
        &ChainOptions::default(),
        |ex, p| {
            ex.plan(p, Direction::Forward)?;
            ex.plan(p, Direction::Backward)?;
            Ok(ex.clone())
        },
    )
    .expect("an entry runs");
    let report = run_on(w.output.as_ref(), p, 3, &run_options()).expect("it runs");
    let attempts = w
        .attempts
        .into_iter()
        .map(|a| (a.executor, a.outcome, a.reason))
        .collect();
    (attempts, report)
}

#[test]
fn the_manifest_admits_what_toy_runs_and_refuses_the_rest() {
    let m = manifest();
    assert!(m.admits(&problem(64)).is_ok());
    let refused = m.admits(&problem(128)).expect_err("head_dim 128");
    assert!(
        refused.reason.contains("head_dim_qk 128 outside 8..=64"),
        "{}",
        refused.reason
    );
    let causal = problem(64).with_mask(MaskSpec::CAUSAL_TOP_LEFT);
    assert!(m.admits(&causal).is_err(), "no causal mask");
    let mut fp32 = problem(64);
    fp32.dtype = DType::F32;
    assert!(m.admits(&fp32).is_err(), "fp16/bf16 only");
    // The registry hands out the toy under its name, manifest as data.
    let r = registry();
    assert!(r.names().contains(&NAME));
    assert_eq!(r.manifest(NAME).expect("registered"), m);
    assert_eq!(r.get(NAME).expect("created").name(), NAME);
}

#[test]
fn toy_runs_head_dim_64_and_passes_verification() {
    let (attempts, report) = walk_and_run(&registry(), &["toy", "reference"], &problem(64));
    assert_eq!(
        attempts,
        [
            ("toy".into(), ExecutorOutcome::Ran, None),
            ("reference".into(), ExecutorOutcome::NotTried, None)
        ]
    );
    assert_eq!(report.executor, "toy");
    let v = report.verification.expect("verified");
    assert!(v.passed, "{v:?}");
    assert!(v.checks.iter().any(|c| c.name == "o" && c.passed), "{v:?}");
}

/// Verification is a real test of `toy`'s forward: the same toy with a wrong scale fails it.
#[test]
fn a_wrong_toy_fails_verification() {
    // The toy is told one scale, the reference another: the outputs must disagree.
    struct Skewed;
    impl Executor for Skewed {
        fn name(&self) -> &str {
            "skewed"
        }
        fn device_description(&self) -> String {
            "host CPU".into()
        }
        fn manifest(&self) -> Manifest {
            manifest()
        }
        fn check(&self, p: &AttentionProblem) -> Result<(), Unsupported> {
            Toy.check(p)
        }
        /// Toy's plan for the problem with a scale 1.5 times the caller's.
        fn plan(
            &self,
            p: &AttentionProblem,
            direction: Direction,
        ) -> Result<Arc<dyn Plan>, ExecError> {
            let mut q = p.clone();
            q.softmax_scale *= 1.5;
            Toy.plan(&q, direction)
        }
    }
    let report = run_on(&Skewed, &problem(64), 3, &run_options()).expect("runs");
    assert!(report.verification.is_some_and(|v| !v.passed));
}

#[test]
fn head_dim_128_is_refused_and_the_reference_substitutes() {
    let (attempts, report) = walk_and_run(&registry(), &["toy", "reference"], &problem(128));
    assert_eq!(attempts.len(), 2);
    assert_eq!(
        (attempts[0].0.as_str(), attempts[0].1),
        ("toy", ExecutorOutcome::Refused)
    );
    let reason = attempts[0].2.as_deref().unwrap_or_default();
    assert!(
        reason.contains("head_dim_qk 128 outside 8..=64"),
        "{reason}"
    );
    assert_eq!(
        (attempts[1].0.as_str(), attempts[1].1),
        ("reference", ExecutorOutcome::Ran)
    );
    assert_eq!(report.executor, "reference");
    assert!(report.verification.is_some_and(|v| v.passed));
    // With no_substitute the refusal is the error, and nothing runs.
    let opts = ChainOptions {
        no_substitute: true,
        ..ChainOptions::default()
    };
    let err = chain::walk(
        &registry(),
        "Toy",
        &["toy", "reference"],
        Ok(&problem(128)),
        &opts,
        |ex, _| Ok(ex.name().to_string()),
    )
    .expect_err("the substitute is refused");
    assert!(
        matches!(err, ChainError::SubstitutionRefused { .. }),
        "{err}"
    );
}

#[test]
fn outside_its_registry_toy_is_unavailable() {
    // A chain naming an executor this build's registry lacks: unavailable, recorded.
    let (attempts, report) =
        walk_and_run(&Registry::builtin(), &["toy", "reference"], &problem(64));
    assert_eq!(attempts[0].1, ExecutorOutcome::Unavailable);
    assert_eq!(report.executor, "reference");
}

// ---- 4. naming it in a pack -----------------------------------------------------------------

/// A pack folder in the temp dir: one backend `Toy` whose chain is `chain`.
fn pack_dir(tag: &str, chain: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ap-toy-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(
        dir.join("toy.yaml"),
        "backend: Toy\n\
         description: the toy executor of docs/add-a-backend.md\n\
         rules:\n  \
           - id: toy.head-dim\n    \
             when: head_dim_qk > 256\n    \
             reason: head dims above 256 are not served\n",
    )
    .expect("write toy.yaml");
    std::fs::write(
        dir.join("pack.yaml"),
        format!(
            "name: toy\n\
             backends: [toy.yaml]\n\
             preference:\n  \
               - id: only\n    \
                 order: [Toy]\n\
             executors:\n  \
               - backend: Toy\n    \
                 {chain}\n"
        ),
    )
    .expect("write pack.yaml");
    dir
}

#[test]
fn the_catalogue_lists_toy_with_its_admits_condition() {
    let cat = attn_policy_adapters::catalogue::of(&registry());
    let toy = cat.get(NAME).expect("toy in the catalogue");
    let admits = toy.admits_for("te").expect("a te condition");
    for part in [
        "qkv_dtype in [\"fp16\", \"bf16\"]",
        "head_dim_qk >= 8 and head_dim_qk <= 64",
        "head_dim_qk % 8 == 0",
        "attn_mask_type in [\"no_mask\"]",
    ] {
        assert!(admits.contains(part), "{part} not in {admits}");
    }
    assert!(
        attn_policy_adapters::catalogue::catalogue()
            .get(NAME)
            .is_none()
    );
}

/// The facts of a te-family configuration with head dim `d`.
fn facts(policy: &attn_policy::Policy, d: usize) -> attn_policy::Facts {
    policy
        .read_facts(&serde_json::json!({
            "batch_size": 1, "num_heads": 4, "num_gqa_groups": 2,
            "max_seqlen_q": 24, "max_seqlen_kv": 24,
            "head_dim_qk": d, "head_dim_v": d,
            "qkv_dtype": "bf16", "qkv_layout": "bshd_bshd_bshd", "attn_mask_type": "no_mask",
        }))
        .expect("valid facts")
}

#[test]
fn a_pack_naming_toy_loads_with_a_catalogue_that_has_it() {
    let dir = pack_dir("chain", "chain: [toy, reference]");
    let registry = registry();
    let with_toy = PackSpec::dir(&dir)
        .with_catalogue(Arc::new(attn_policy_adapters::catalogue::of(&registry)))
        .load();
    let without = PackSpec::dir(&dir)
        .with_catalogue(Arc::new(attn_policy_adapters::catalogue::catalogue()))
        .load();
    std::fs::remove_dir_all(&dir).ok();
    let policy = with_toy.expect("loads with toy in the catalogue");
    // The builtin catalogue has no `toy`: E-EXECUTOR, naming it.
    let err = without.expect_err("toy is unknown to the builtin catalogue");
    let text = err.render(false);
    assert!(
        text.contains("E-EXECUTOR") && text.contains("unknown executor `toy`"),
        "{text}"
    );
    // Facts -> decision -> chain -> walk -> run, as `attn-policy run` does.
    let f = facts(&policy, 64);
    let decision = policy.decide(&f);
    let selected = decision.selected.expect("Toy selected");
    let names: Vec<&str> = policy
        .executor_chain_for(selected, decision.backends[selected as usize].variant, &f)
        .iter()
        .map(|e| e.executor.as_str())
        .collect();
    assert_eq!(names, ["toy", "reference"]);
    let p = problem_from_facts(&f).expect("expressible");
    let (attempts, report) = walk_and_run(&registry, &names, &p);
    assert_eq!(attempts[0].1, ExecutorOutcome::Ran);
    assert_eq!(report.executor, "toy");
    assert!(report.verification.is_some_and(|v| v.passed));
}

/// `if_admitted: [toy]`: where the toy's `admits` condition is false (head_dim 128) it leaves
/// the chain, so `reference` is the backend's own executor there, not a substitute.
#[test]
fn if_admitted_uses_the_toys_admits_condition() {
    let dir = pack_dir(
        "if-admitted",
        "chain: [toy, reference]\n    if_admitted: [toy]",
    );
    let registry = registry();
    let policy = PackSpec::dir(&dir)
        .with_catalogue(Arc::new(attn_policy_adapters::catalogue::of(&registry)))
        .load();
    std::fs::remove_dir_all(&dir).ok();
    let policy = policy.expect("loads");
    let chain = |d: usize| -> Vec<String> {
        let f = facts(&policy, d);
        policy
            .executor_chain_for(0, None, &f)
            .iter()
            .map(|e| e.executor.clone())
            .collect()
    };
    assert_eq!(chain(64), ["toy", "reference"]);
    assert_eq!(chain(128), ["reference"]);
}
