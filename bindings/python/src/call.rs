//! What `_native.NativeCall` (lib.rs, beside the `NativeDecision` it holds) reads: the kinds of
//! call and the chain outcomes by their words. A `NativeCall` is the account of one call, the
//! object under the Python package's one result model (`attn_policy.Explanation`): the
//! decision, the executor chain as the walk left it (`walk_chain`'s entries), where the call's
//! facts came from, and what a call of another kind adds (`context_parallel`: the per-step
//! calls and their work; `sdpa`: PyTorch's own choice). Its document is
//! `Explanation::to_call_json`'s (`attn-policy/call/v1`, what `attn-policy run --json`
//! prints), the extra fields through `CallExtras::extra`.

use attn_policy::ExecutorOutcome;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// What the call was: one attention call (its chain walked), a context-parallel call (its
/// per-step calls), or an explanation of PyTorch's SDPA choice (nothing runs).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Call,
    ContextParallel,
    Sdpa,
}

impl Kind {
    pub(crate) fn parse(word: &str) -> PyResult<Kind> {
        match word {
            "call" => Ok(Kind::Call),
            "context_parallel" => Ok(Kind::ContextParallel),
            "sdpa" => Ok(Kind::Sdpa),
            other => Err(PyValueError::new_err(format!(
                "unknown call kind `{other}` (call, context_parallel, sdpa)"
            ))),
        }
    }

    pub(crate) fn word(self) -> &'static str {
        match self {
            Kind::Call => "call",
            Kind::ContextParallel => "context_parallel",
            Kind::Sdpa => "sdpa",
        }
    }
}

pub(crate) fn outcome(word: &str) -> PyResult<ExecutorOutcome> {
    Ok(match word {
        "ran" => ExecutorOutcome::Ran,
        "refused" => ExecutorOutcome::Refused,
        "unavailable" => ExecutorOutcome::Unavailable,
        "failed" => ExecutorOutcome::Failed,
        "not_tried" => ExecutorOutcome::NotTried,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown chain outcome `{other}` (ran, refused, unavailable, failed, not_tried)"
            )));
        }
    })
}
