//! The executor chain walk: the pack names, per backend (and variant), the executors that run
//! its decisions in order (`executors:` in pack.yaml, [`attn_policy::Policy::executor_chain`]);
//! [`walk`] tries them in that order and records every entry's outcome.
//!
//! For each entry, in this order:
//! 1. the configuration must be expressible as an executor problem ([`crate::problem_from_facts`];
//!    its [`NotExpressible`] refusal refuses every entry: a property of the input, not the machine);
//! 2. the executor's manifest must admit the problem (`refused` with the manifest's reason: it
//!    would refuse on any machine);
//! 3. it must be available here (`unavailable`: no GPU, feature off, library missing, provided by
//!    the Python host), and be created on the device;
//! 4. for `cudnn`, the libcudnn it loads must be the version the decision was made for, when the
//!    caller says which ([`ChainOptions::decided_cudnn_version`]; `refused`, naming both);
//! 5. its exact gate ([`crate::Executor::check`]) must accept the problem (`refused`);
//! 6. the caller's *plan step* runs (for a stream executor, building its plans:
//!    [`Executor::plan`]): `ran` when it succeeds.
//!
//! The one rule for what does not run: a refusal (`refused`), an unavailable executor
//! (`unavailable`) or an error from the check or the plan step (`failed`, with the error) moves
//! on to the next entry, which then runs as a *substitute*: recorded, never silent; with
//! [`ChainOptions::no_substitute`] any substitute is an error instead
//! ([`ChainError::SubstitutionRefused`]). Entries after the one that ran (or after a refused
//! substitution) are `not_tried`. The walk ends with the plan: running it (enqueue and after) is
//! the caller's, and an error there is the caller's typed error, never a retry on another entry
//! (the work may have half run). The Python package walks with the same rule through
//! [`walk_entries`] (`_native.walk_chain`), with the same cases in
//! `tests/fixtures/chain_cases.json` tested on both sides.

use attn_policy::{ExecutorAttempt, ExecutorOutcome};
use thiserror::Error;

use std::sync::Arc;

use crate::executor::{ExecError, Executor};
use crate::from_facts::NotExpressible;
use crate::problem::AttentionProblem;
use crate::registry::{Availability, Registry};

/// How to walk a chain.
#[derive(Clone, Debug, Default)]
pub struct ChainOptions {
    /// CUDA device ordinal the executors are created on.
    pub ordinal: usize,
    /// Turn substitution into an error: only the chain's first entry may run.
    pub no_substitute: bool,
    /// The `cudnn_version` the decision was made for (major, minor, patch): the `cudnn` entry
    /// refuses, naming both, when the libcudnn it loads differs.
    pub decided_cudnn_version: Option<(u32, u32, u32)>,
}

/// A walk in which an entry ran.
#[derive(Debug)]
pub struct Walked<T> {
    /// Every entry of the chain with its outcome, in chain order.
    pub attempts: Vec<ExecutorAttempt>,
    /// The executor that ran.
    pub executor: String,
    /// Its position in the chain (0: the backend's own executor; above: a substitute).
    pub index: usize,
    /// What the caller's action returned.
    pub output: T,
}

impl<T> Walked<T> {
    /// Did a substitute run (not the chain's first entry)?
    pub fn is_substitute(&self) -> bool {
        self.index > 0
    }
}

/// A walk in which nothing ran.
#[derive(Debug, Error)]
pub enum ChainError {
    /// The pack declares no executor for the selected backend.
    #[error("the pack names no executor for backend `{backend}` (`executors:` in pack.yaml)")]
    Empty {
        /// The selected backend.
        backend: String,
    },
    /// Every entry was refused or unavailable.
    #[error("no executor of the chain could run: {}", summarize(attempts))]
    NoneRan {
        /// Every entry's outcome.
        attempts: Vec<ExecutorAttempt>,
    },
    /// The first entry could not run and substitutes were not allowed.
    #[error(
        "substitution refused: the backend's own executor cannot run ({}) and no_substitute allows no other",
        summarize(attempts)
    )]
    SubstitutionRefused {
        /// The first entry's outcome; the others are `not_tried`.
        attempts: Vec<ExecutorAttempt>,
    },
}

impl ChainError {
    /// The outcomes recorded before the walk ended (empty for [`ChainError::Empty`]).
    pub fn attempts(&self) -> &[ExecutorAttempt] {
        match self {
            ChainError::Empty { .. } => &[],
            ChainError::NoneRan { attempts } | ChainError::SubstitutionRefused { attempts } => {
                attempts
            }
        }
    }
}

/// `name outcome: reason` for every entry that did not run and was tried, joined by `; `;
/// neighbours with the same outcome and reason share one (`chunked, reference refused: ...`).
pub fn summarize(attempts: &[ExecutorAttempt]) -> String {
    let mut groups: Vec<(Vec<&str>, ExecutorOutcome, Option<&str>)> = Vec::new();
    for a in attempts {
        if matches!(a.outcome, ExecutorOutcome::Ran | ExecutorOutcome::NotTried) {
            continue;
        }
        match groups.last_mut() {
            Some((names, outcome, reason))
                if *outcome == a.outcome && *reason == a.reason.as_deref() =>
            {
                names.push(&a.executor)
            }
            _ => groups.push((vec![&a.executor], a.outcome, a.reason.as_deref())),
        }
    }
    groups
        .iter()
        .map(|(names, outcome, reason)| {
            let who = names.join(", ");
            match reason {
                Some(r) => format!("{who} {}: {r}", outcome.word()),
                None => format!("{who} {}", outcome.word()),
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The one-line account of a run: `selected FlashAttention; ran on chunked (substitute:
/// torch_flash unavailable: provided by the Python host; cudnn refused: ...)`, or `...; ran on
/// cudnn` when the backend's own executor ran, or `...; nothing ran (...)`.
pub fn run_summary(backend: &str, attempts: &[ExecutorAttempt]) -> String {
    let ran = attempts
        .iter()
        .position(|a| a.outcome == ExecutorOutcome::Ran);
    match ran {
        Some(0) => format!("selected {backend}; ran on {}", attempts[0].executor),
        Some(i) => format!(
            "selected {backend}; ran on {} (substitute: {})",
            attempts[i].executor,
            summarize(&attempts[..i])
        ),
        None => format!("selected {backend}; nothing ran ({})", summarize(attempts)),
    }
}

/// What trying one chain entry came to.
#[derive(Debug)]
pub enum Step<T> {
    /// Its plan step succeeded: it runs.
    Ran(T),
    /// It does not run here: `refused`, `unavailable` or `failed`, with the reason.
    Skip(ExecutorOutcome, String),
}

/// An error of the check or plan step as a chain outcome.
pub fn classify<T>(e: ExecError) -> Step<T> {
    match e {
        ExecError::Unsupported { reason } => Step::Skip(ExecutorOutcome::Refused, reason),
        ExecError::NoDevice { reason } | ExecError::Unavailable { reason, .. } => {
            Step::Skip(ExecutorOutcome::Unavailable, reason)
        }
        e @ ExecError::UnknownExecutor { .. } => {
            Step::Skip(ExecutorOutcome::Unavailable, e.to_string())
        }
        other => Step::Skip(ExecutorOutcome::Failed, other.to_string()),
    }
}

fn try_entry<T>(
    registry: &Registry,
    name: &str,
    problem: Result<&AttentionProblem, &NotExpressible>,
    opts: &ChainOptions,
    plan: &mut impl FnMut(&Arc<dyn Executor>, &AttentionProblem) -> Result<T, ExecError>,
) -> Step<T> {
    let p = match problem {
        Ok(p) => p,
        Err(e) => return Step::Skip(ExecutorOutcome::Refused, e.to_string()),
    };
    let entry = match registry.entry(name) {
        Ok(e) => e,
        Err(_) => {
            return Step::Skip(
                ExecutorOutcome::Unavailable,
                "not in this build's executor registry".into(),
            );
        }
    };
    if let Err(u) = entry.manifest.admits(p) {
        return Step::Skip(ExecutorOutcome::Refused, u.reason);
    }
    match registry.availability(name) {
        Ok(Availability::Available { .. }) => {}
        Ok(Availability::Unavailable { reason }) => {
            return Step::Skip(ExecutorOutcome::Unavailable, reason);
        }
        Err(e) => return classify(e),
    }
    let ex = match registry.get_on(name, opts.ordinal) {
        Ok(ex) => ex,
        Err(e @ ExecError::Unsupported { .. }) => return classify(e),
        Err(ExecError::NoDevice { reason } | ExecError::Unavailable { reason, .. }) => {
            return Step::Skip(ExecutorOutcome::Unavailable, reason);
        }
        // Available by its probe but not creatable (a library or package that does not load
        // or initialise): it cannot run here.
        Err(e) => {
            return Step::Skip(
                ExecutorOutcome::Unavailable,
                format!("cannot be created here: {e}"),
            );
        }
    };
    if name == crate::cudnn::NAME
        && let Some(v) = opts.decided_cudnn_version
        && let Err(e) = crate::cudnn::require_version(opts.ordinal, v)
    {
        return classify(e);
    }
    if let Err(u) = ex.check(p) {
        return Step::Skip(ExecutorOutcome::Refused, u.reason);
    }
    match plan(&ex, p) {
        Ok(t) => Step::Ran(t),
        Err(e) => classify(e),
    }
}

fn attempt(name: &str, outcome: ExecutorOutcome, reason: Option<String>) -> ExecutorAttempt {
    ExecutorAttempt {
        executor: name.to_string(),
        outcome,
        reason,
    }
}

/// Walks `chain` (executor names, in the pack's order) for `problem` (or the conversion's
/// refusal): `plan` runs on the first entry that passes every check, and the walk ends there;
/// see the module docs for the checks and the rule. `backend` names the selected backend in
/// errors. The caller runs what `plan` returned (the executor is passed as an `Arc`, so the
/// plan can keep it).
pub fn walk<T, S: AsRef<str>>(
    registry: &Registry,
    backend: &str,
    chain: &[S],
    problem: Result<&AttentionProblem, &NotExpressible>,
    opts: &ChainOptions,
    mut plan: impl FnMut(&Arc<dyn Executor>, &AttentionProblem) -> Result<T, ExecError>,
) -> Result<Walked<T>, ChainError> {
    let names: Vec<&str> = chain.iter().map(AsRef::as_ref).collect();
    walk_entries(backend, &names, opts.no_substitute, |name| {
        try_entry(registry, name, problem, opts, &mut plan)
    })
}

/// The walk's rule over any way of trying an entry (`try_entry`: the registry's checks and a
/// plan step for [`walk`]; the Python host's executors for the Python package): the first
/// entry that comes to [`Step::Ran`] runs, every other outcome moves on, `no_substitute` makes
/// anything but the first entry an error.
pub fn walk_entries<T>(
    backend: &str,
    names: &[&str],
    no_substitute: bool,
    mut try_entry: impl FnMut(&str) -> Step<T>,
) -> Result<Walked<T>, ChainError> {
    if names.is_empty() {
        return Err(ChainError::Empty {
            backend: backend.to_string(),
        });
    }
    let not_tried = |attempts: &mut Vec<ExecutorAttempt>, from: usize| {
        for n in &names[from..] {
            attempts.push(attempt(n, ExecutorOutcome::NotTried, None));
        }
    };
    let mut attempts = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        match try_entry(name) {
            Step::Ran(output) => {
                attempts.push(attempt(name, ExecutorOutcome::Ran, None));
                not_tried(&mut attempts, i + 1);
                return Ok(Walked {
                    attempts,
                    executor: name.to_string(),
                    index: i,
                    output,
                });
            }
            Step::Skip(outcome, reason) => {
                attempts.push(attempt(name, outcome, Some(reason)));
                if no_substitute {
                    not_tried(&mut attempts, i + 1);
                    return Err(ChainError::SubstitutionRefused { attempts });
                }
            }
        }
    }
    Err(ChainError::NoneRan { attempts })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::{DeviceKind, Direction, Manifest, Plan, Unsupported};
    use crate::problem::DType;
    use crate::registry::RegistryEntry;
    use crate::trial::{RunOptions, VerifyMode, run_on};
    use std::sync::Arc;

    /// A stand-in for a GPU executor: the reference's numerics under another name, with a
    /// CUDA manifest limited to head_dim <= 128 and an exact gate that also refuses s_q > 64.
    struct FakeGpu;

    fn fake_manifest() -> Manifest {
        let mut m = crate::reference::manifest();
        m.name = "fake_gpu".into();
        m.device = DeviceKind::Cuda;
        m.head_dim_qk.max = 128;
        m.head_dim_v.max = 128;
        m
    }

    impl Executor for FakeGpu {
        fn name(&self) -> &str {
            "fake_gpu"
        }
        fn device_description(&self) -> String {
            "a fake device".into()
        }
        fn manifest(&self) -> Manifest {
            fake_manifest()
        }
        fn check(&self, p: &AttentionProblem) -> Result<(), Unsupported> {
            fake_manifest().admits(p)?;
            if p.seqlen_q > 64 {
                return Err(Unsupported::new("fake_gpu: seqlen_q above 64"));
            }
            Ok(())
        }
        fn plan(
            &self,
            p: &AttentionProblem,
            direction: Direction,
        ) -> Result<Arc<dyn Plan>, ExecError> {
            self.check(p)?;
            crate::reference::create(0)?.plan(p, direction)
        }
    }

    fn registry(fake_available: bool) -> Registry {
        let mut r = Registry::builtin();
        let probe: fn() -> Availability = if fake_available {
            || Availability::Available {
                detail: "fake".into(),
            }
        } else {
            || Availability::unavailable("no GPU: a fake device that is never there")
        };
        r.register(RegistryEntry::builtin(
            "fake_gpu",
            "a fake GPU executor",
            fake_manifest(),
            Some("fake"),
            |_| Ok(Arc::new(FakeGpu) as Arc<dyn Executor>),
            probe,
        ));
        r
    }

    /// Nondeterministic allowed (as TE's default), so `torch_flash`'s manifest admits it.
    fn problem(d: usize, s: usize) -> AttentionProblem {
        let mut p = AttentionProblem::new(1, 2, 1, s, s, d, d, DType::BF16);
        p.deterministic = false;
        p
    }

    fn opts() -> RunOptions {
        RunOptions {
            backward: true,
            verify: VerifyMode::Always,
            warmup: 0,
            iters: 1,
            ..RunOptions::default()
        }
    }

    fn outcomes(a: &[ExecutorAttempt]) -> Vec<(&str, ExecutorOutcome)> {
        a.iter().map(|a| (a.executor.as_str(), a.outcome)).collect()
    }

    /// [`walk`] for backend `B` with the default options, as most tests here need.
    fn walk_b<T>(
        r: &Registry,
        chain: &[&str],
        problem: Result<&AttentionProblem, &NotExpressible>,
        run: impl FnMut(&Arc<dyn Executor>, &AttentionProblem) -> Result<T, ExecError>,
    ) -> Result<Walked<T>, ChainError> {
        walk(r, "B", chain, problem, &ChainOptions::default(), run)
    }

    use ExecutorOutcome::{Failed, NotTried, Ran, Refused, Unavailable};

    #[test]
    fn the_first_entry_that_can_run_runs_and_the_rest_are_not_tried() {
        let r = registry(true);
        let p = problem(64, 32);
        let w = walk_b(&r, &["fake_gpu", "reference"], Ok(&p), |ex, p| {
            run_on(ex.as_ref(), p, 7, &opts())
        })
        .expect("fake_gpu runs");
        assert_eq!(
            outcomes(&w.attempts),
            [("fake_gpu", Ran), ("reference", NotTried)]
        );
        assert!(!w.is_substitute());
        assert_eq!(w.output.executor, "fake_gpu");
        assert!(w.output.verification.as_ref().is_some_and(|v| v.passed));
        assert_eq!(run_summary("B", &w.attempts), "selected B; ran on fake_gpu");
    }

    #[test]
    fn unavailable_and_refused_entries_are_recorded_with_their_reasons() {
        // Unavailable: the probe's reason.
        let r = registry(false);
        let p = problem(64, 32);
        let w = walk_b(
            &r,
            &["torch_flash", "fake_gpu", "reference"],
            Ok(&p),
            |ex, p| run_on(ex.as_ref(), p, 1, &opts()),
        )
        .expect("reference runs");
        assert_eq!(
            outcomes(&w.attempts),
            [
                ("torch_flash", Unavailable),
                ("fake_gpu", Unavailable),
                ("reference", Ran)
            ]
        );
        assert_eq!(
            w.attempts[0].reason.as_deref(),
            Some(crate::registry::HOST_ONLY)
        );
        assert!(w.is_substitute());
        assert_eq!(
            run_summary("B", &w.attempts),
            "selected B; ran on reference (substitute: torch_flash unavailable: provided by the \
             Python host; fake_gpu unavailable: no GPU: a fake device that is never there)"
        );
        // Refused by the manifest (head dim), then by the exact gate (s_q), on an available
        // executor.
        let r = registry(true);
        for (p, why) in [
            (problem(256, 32), "head_dim_qk 256 outside"),
            (problem(64, 96), "seqlen_q above 64"),
        ] {
            let w = walk_b(&r, &["fake_gpu", "reference"], Ok(&p), |ex, p| {
                run_on(ex.as_ref(), p, 1, &opts())
            })
            .expect("reference runs");
            assert_eq!(
                outcomes(&w.attempts),
                [("fake_gpu", Refused), ("reference", Ran)]
            );
            let reason = w.attempts[0].reason.as_deref().unwrap_or_default();
            assert!(reason.contains(why), "{reason}");
            assert_eq!(w.output.executor, "reference");
        }
    }

    #[test]
    fn a_refusal_or_a_failure_of_the_plan_step_moves_on() {
        let r = registry(true);
        let p = problem(64, 32);
        let w = walk_b(&r, &["fake_gpu", "reference"], Ok(&p), |ex, p| {
            if ex.name() == "fake_gpu" {
                Err(ExecError::Unsupported {
                    reason: "no plan for this graph".into(),
                })
            } else {
                run_on(ex.as_ref(), p, 1, &opts())
            }
        })
        .expect("reference runs");
        assert_eq!(
            outcomes(&w.attempts),
            [("fake_gpu", Refused), ("reference", Ran)]
        );
        let w = walk_b(&r, &["fake_gpu", "reference"], Ok(&p), |ex, _| {
            if ex.name() == "fake_gpu" {
                Err(ExecError::Backend {
                    library: "cuda",
                    message: "out of memory".into(),
                })
            } else {
                Ok(ex.name().to_string())
            }
        })
        .expect("a failed plan is replaced by the next entry");
        assert_eq!(
            outcomes(&w.attempts),
            [("fake_gpu", Failed), ("reference", Ran)]
        );
        assert!(w.is_substitute());
        let reason = w.attempts[0].reason.as_deref().unwrap_or_default();
        assert!(reason.contains("out of memory"), "{reason}");
        assert!(
            run_summary("B", &w.attempts).contains("fake_gpu failed: "),
            "{}",
            run_summary("B", &w.attempts)
        );
    }

    /// The rule's cases shared with the Python package's test (tests/fixtures/chain_cases.json):
    /// each entry's behaviour becomes the error its check or plan step would return.
    #[test]
    fn the_shared_cases_hold() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/chain_cases.json"
        );
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).expect("the case table"))
                .expect("json");
        let cases = doc["cases"].as_array().expect("cases");
        assert!(cases.len() >= 8, "the table holds the rule's cases");
        for c in cases {
            let name = c["name"].as_str().expect("name");
            let chain: Vec<(&str, &str)> = c["chain"]
                .as_array()
                .expect("chain")
                .iter()
                .map(|e| (e[0].as_str().expect("name"), e[1].as_str().expect("what")))
                .collect();
            let names: Vec<&str> = chain.iter().map(|e| e.0).collect();
            let no_substitute = c["no_substitute"].as_bool().expect("no_substitute");
            let walked = walk_entries("B", &names, no_substitute, |n| {
                let what = chain.iter().find(|e| e.0 == n).expect("entry").1;
                match what {
                    "runs" => Step::Ran(n.to_string()),
                    "refuses" => classify(ExecError::Unsupported {
                        reason: format!("{n} does not do this"),
                    }),
                    "unavailable" => classify(ExecError::NoDevice {
                        reason: format!("{n} has no device"),
                    }),
                    "fails" => classify(ExecError::Backend {
                        library: "cuda",
                        message: format!("{n}'s plan failed"),
                    }),
                    other => panic!("case {name}: unknown behaviour {other}"),
                }
            });
            let (attempts, runs, error) = match &walked {
                Ok(w) => {
                    assert_eq!(w.output, names[w.index], "case {name}");
                    assert_eq!(w.is_substitute(), w.index > 0, "case {name}");
                    (w.attempts.clone(), Some(w.index), None)
                }
                Err(e) => {
                    let why = match e {
                        ChainError::Empty { .. } => "empty",
                        ChainError::NoneRan { .. } => "none_ran",
                        ChainError::SubstitutionRefused { .. } => "substitution_refused",
                    };
                    (e.attempts().to_vec(), None, Some(why))
                }
            };
            let got: Vec<&str> = attempts.iter().map(|a| a.outcome.word()).collect();
            let want: Vec<&str> = c["outcomes"]
                .as_array()
                .expect("outcomes")
                .iter()
                .map(|o| o.as_str().expect("word"))
                .collect();
            assert_eq!(got, want, "case {name}");
            assert_eq!(runs, c["runs"].as_u64().map(|i| i as usize), "case {name}");
            assert_eq!(error, c["error"].as_str(), "case {name}");
            for a in &attempts {
                // Every entry that was tried and did not run says why, naming itself.
                if !matches!(a.outcome, Ran | NotTried) {
                    let reason = a.reason.as_deref().unwrap_or_default();
                    assert!(reason.contains(&a.executor), "case {name}: {reason}");
                }
            }
        }
    }

    #[test]
    fn no_substitute_turns_a_substitution_into_an_error() {
        let r = registry(false);
        let p = problem(64, 32);
        let no_sub = ChainOptions {
            no_substitute: true,
            ..ChainOptions::default()
        };
        let mut ran = false;
        let err = walk(
            &r,
            "B",
            &["fake_gpu", "reference"],
            Ok(&p),
            &no_sub,
            |_, _| {
                ran = true;
                Ok(())
            },
        )
        .expect_err("the first entry is unavailable");
        assert!(!ran, "nothing may run");
        assert!(matches!(err, ChainError::SubstitutionRefused { .. }));
        assert_eq!(
            outcomes(err.attempts()),
            [("fake_gpu", Unavailable), ("reference", NotTried)]
        );
        // The backend's own executor may still run.
        let ok = walk(&r, "B", &["reference"], Ok(&p), &no_sub, |_, _| Ok(()));
        assert!(ok.is_ok_and(|w| !w.is_substitute()));
    }

    #[test]
    fn a_configuration_no_executor_expresses_is_refused_by_every_entry() {
        let r = registry(true);
        let why = NotExpressible {
            fact: "attention_dropout".into(),
            value: "0.1".into(),
            why: "executors apply no dropout".into(),
        };
        let err = walk_b(
            &r,
            &["fake_gpu", "torch_flash", "reference"],
            Err(&why),
            |_, _| Ok(()),
        )
        .expect_err("nothing runs");
        assert_eq!(
            outcomes(err.attempts()),
            [
                ("fake_gpu", Refused),
                ("torch_flash", Refused),
                ("reference", Refused)
            ]
        );
        for a in err.attempts() {
            assert_eq!(
                a.reason.as_deref(),
                Some("attention_dropout = 0.1: executors apply no dropout")
            );
        }
        assert!(matches!(err, ChainError::NoneRan { .. }));
        assert_eq!(
            err.to_string(),
            "no executor of the chain could run: fake_gpu, torch_flash, reference refused: \
             attention_dropout = 0.1: executors apply no dropout"
        );
    }

    #[test]
    fn an_empty_chain_and_an_unknown_name_are_reported() {
        let r = registry(true);
        let p = problem(64, 32);
        let empty: [&str; 0] = [];
        let err = walk_b(&r, &empty, Ok(&p), |_, _| Ok(())).expect_err("nothing to walk");
        assert!(matches!(err, ChainError::Empty { .. }), "{err}");
        let w = walk_b(&r, &["nope", "reference"], Ok(&p), |_, _| Ok(())).expect("reference runs");
        assert_eq!(
            outcomes(&w.attempts),
            [("nope", Unavailable), ("reference", Ran)]
        );
    }

    #[test]
    fn the_reference_refuses_problems_above_its_size_limit() {
        // What keeps the te chains' last entry honest on big problems: refused, not run.
        let r = Registry::builtin();
        let p = AttentionProblem::new(2, 8, 4, 8192, 8192, 512, 512, DType::BF16);
        let err = walk(
            &r,
            "UnfusedDotProductAttention",
            &["chunked", "reference"],
            Ok(&p),
            &ChainOptions::default(),
            |_, _| Ok(()),
        );
        match err {
            // A GPU machine with the `cuda` feature runs chunked.
            Ok(w) => assert_eq!(w.executor, "chunked"),
            Err(e) => {
                let a = e.attempts();
                assert_eq!(a[1].outcome, Refused, "{e}");
                assert!(
                    a[1].reason
                        .as_deref()
                        .unwrap_or_default()
                        .contains("score elements"),
                    "{e}"
                );
            }
        }
    }
}
