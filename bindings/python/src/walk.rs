//! `_native.walk_chain`: the Python package's executor chain walk, with the same rule as the
//! CLI's: it is [`attn_policy_adapters::chain::walk_entries`] itself, trying each entry through
//! a Python callable (the Python host's checks and plan step for that executor).
//!
//! The callable returns what runs the entry (a runner) or raises `ExecutorRefused`
//! (`refused`), `ExecutorUnavailable` (`unavailable`) or `ExecutorFailed` (`failed`), and the
//! walk moves on; any other exception is not an executor's answer but an error of the call
//! (bad tensors, a bug) and ends the walk, raised as it is.

use attn_policy::ExecutorOutcome;
use attn_policy_adapters::chain::{ChainError, Step, walk_entries};
use pyo3::prelude::*;

use crate::torch_ops::{ExecutorFailed, ExecutorRefused, ExecutorUnavailable};

/// One entry's outcome as the Python package records it: `(executor, outcome, reason)`.
type Outcome = (String, &'static str, String);

/// How a walk ended: the index of the entry that runs (None: nothing runs), every entry's
/// outcome, why nothing runs (`"empty"`, `"none_ran"`, `"substitution_refused"`; None when an
/// entry runs) and what the callable returned for the entry that runs.
type Walk = (
    Option<usize>,
    Vec<Outcome>,
    Option<&'static str>,
    Option<Py<PyAny>>,
);

/// Walks `chain` for `backend`: `try_entry(name)` is called on each entry in order until one
/// returns; see the module docs.
#[pyfunction]
#[pyo3(signature = (backend, chain, no_substitute, try_entry))]
fn walk_chain(
    py: Python<'_>,
    backend: &str,
    chain: Vec<String>,
    no_substitute: bool,
    try_entry: Bound<'_, PyAny>,
) -> PyResult<Walk> {
    let names: Vec<&str> = chain.iter().map(String::as_str).collect();
    let mut raised: Option<PyErr> = None;
    let walked = walk_entries(backend, &names, no_substitute, |name| {
        if raised.is_some() {
            // The walk is over (its error is raised below); nothing else is tried.
            return Step::Skip(ExecutorOutcome::NotTried, String::new());
        }
        match try_entry.call1((name,)) {
            Ok(runner) => Step::Ran(runner.unbind()),
            Err(e) => {
                let reason = e.value(py).to_string();
                if e.is_instance_of::<ExecutorRefused>(py) {
                    Step::Skip(ExecutorOutcome::Refused, reason)
                } else if e.is_instance_of::<ExecutorUnavailable>(py) {
                    Step::Skip(ExecutorOutcome::Unavailable, reason)
                } else if e.is_instance_of::<ExecutorFailed>(py) {
                    Step::Skip(ExecutorOutcome::Failed, reason)
                } else {
                    raised = Some(e);
                    Step::Skip(ExecutorOutcome::NotTried, String::new())
                }
            }
        }
    });
    if let Some(e) = raised {
        return Err(e);
    }
    let outcomes = |attempts: &[attn_policy::ExecutorAttempt]| -> Vec<Outcome> {
        attempts
            .iter()
            .map(|a| {
                (
                    a.executor.clone(),
                    a.outcome.word(),
                    a.reason.clone().unwrap_or_default(),
                )
            })
            .collect()
    };
    Ok(match walked {
        Ok(w) => (Some(w.index), outcomes(&w.attempts), None, Some(w.output)),
        Err(e) => {
            let why = match &e {
                ChainError::Empty { .. } => "empty",
                ChainError::NoneRan { .. } => "none_ran",
                ChainError::SubstitutionRefused { .. } => "substitution_refused",
            };
            (None, outcomes(e.attempts()), Some(why), None)
        }
    })
}

/// Registers `walk_chain` on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(walk_chain, m)?)
}
