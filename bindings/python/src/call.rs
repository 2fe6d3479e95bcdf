//! `_native.NativeCall`: the account of one call, the object under the Python package's one
//! result model (`attn_policy.Explanation`): the decision, the executor chain as the walk left
//! it (`walk_chain`'s entries), where the call's facts came from, and what a call of another
//! kind adds (`context_parallel`: the per-step calls and their work; `sdpa`: PyTorch's own
//! choice). Its document is [`Explanation::to_call_json`]'s (`attn-policy/call/v1`, what
//! `attn-policy run --json` prints), the extra fields through [`CallExtras::extra`].

use attn_policy::{CallExtras, ExecutorAttempt, ExecutorOutcome, Explanation};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use serde_json::{Map, Value as Json};

use crate::{NativeDecision, to_py};

/// What the call was: one attention call (its chain walked), a context-parallel call (its
/// per-step calls), or an explanation of PyTorch's SDPA choice (nothing runs).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Call,
    ContextParallel,
    Sdpa,
}

impl Kind {
    fn parse(word: &str) -> PyResult<Kind> {
        match word {
            "call" => Ok(Kind::Call),
            "context_parallel" => Ok(Kind::ContextParallel),
            "sdpa" => Ok(Kind::Sdpa),
            other => Err(PyValueError::new_err(format!(
                "unknown call kind `{other}` (call, context_parallel, sdpa)"
            ))),
        }
    }

    fn word(self) -> &'static str {
        match self {
            Kind::Call => "call",
            Kind::ContextParallel => "context_parallel",
            Kind::Sdpa => "sdpa",
        }
    }
}

fn outcome(word: &str) -> PyResult<ExecutorOutcome> {
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

/// One call's account. Immutable: built once per call signature, when the call is decided.
#[pyclass(frozen, module = "attn_policy._native")]
pub(crate) struct NativeCall {
    kind: Kind,
    /// None: nothing was decided (a context-parallel call refused before its pre-flight).
    decision: Option<Py<NativeDecision>>,
    pack: String,
    attempts: Vec<ExecutorAttempt>,
    /// Where the call's facts came from (replacing the decision's own), when the caller knows.
    provenance: Option<Vec<(String, String)>>,
    fallback: Option<String>,
    substitution_refused: bool,
    problem: String,
    /// The error of a call of another kind, as the caller states it (a call's is derived).
    error: Option<String>,
    /// The kind's own fields (beside `kind`, the SDPA facts and the per-step documents).
    extra: Map<String, Json>,
    steps: Vec<Py<NativeCall>>,
}

impl NativeCall {
    fn decided(&self) -> Option<&NativeDecision> {
        self.decision.as_ref().map(|d| d.get())
    }

    fn provenance_pairs(&self) -> Vec<(String, String)> {
        match (&self.provenance, self.decided()) {
            (Some(p), _) => p.clone(),
            (None, Some(d)) => d
                .provenance
                .iter()
                .map(|(k, s)| (k.clone(), (*s).to_string()))
                .collect(),
            (None, None) => Vec::new(),
        }
    }

    fn ran(&self) -> Option<usize> {
        self.attempts
            .iter()
            .position(|a| a.outcome == ExecutorOutcome::Ran)
    }

    fn selected(&self) -> Option<String> {
        let d = self.decided()?;
        d.decision
            .selected
            .map(|s| d.policy.policy().backends[s as usize].name.clone())
    }

    /// Why nothing ran: for one call, from its decision and walk (as `attn-policy run` says
    /// it); for another kind, as its caller stated it.
    fn error_text(&self) -> Option<String> {
        if self.kind != Kind::Call {
            return self.error.clone();
        }
        let selected = self.decided().and_then(|d| d.decision.selected);
        match (selected, self.ran().is_some()) {
            (_, true) => None,
            (None, false) => Some("no backend selected".to_string()),
            (Some(_), false) if self.attempts.is_empty() => {
                Some("the selected backend has no executor chain".to_string())
            }
            (Some(_), false) => Some(attn_policy_adapters::chain::summarize(&self.attempts)),
        }
    }

    fn extra_json(&self) -> PyResult<Option<Json>> {
        if self.kind == Kind::Call {
            return Ok(None);
        }
        let mut m = Map::with_capacity(self.extra.len() + 2);
        m.insert("kind".into(), Json::String(self.kind.word().into()));
        m.extend(self.extra.clone());
        match self.kind {
            Kind::Sdpa => {
                // The facts PyTorch's choice was decided on: the decision's config.
                let facts = self.decided().map_or(Json::Null, |d| (*d.config).clone());
                m.insert("facts".into(), facts);
            }
            Kind::ContextParallel => {
                let steps = self
                    .steps
                    .iter()
                    .map(|s| s.get().document())
                    .collect::<PyResult<Vec<_>>>()?;
                m.insert("steps".into(), Json::Array(steps));
            }
            Kind::Call => {}
        }
        Ok(Some(Json::Object(m)))
    }

    /// The call document (`attn-policy/call/v1`).
    fn document(&self) -> PyResult<Json> {
        let Some(d) = self.decided() else {
            return Err(PyValueError::new_err(
                "this explanation has no decision to describe",
            ));
        };
        let ex = Explanation::new(d.policy.policy(), &d.facts, &d.decision)
            .with_provenance(self.provenance_pairs())
            .with_executor_chain(self.attempts.clone());
        Ok(ex.to_call_json(CallExtras {
            fallback: self.fallback.clone(),
            error: self.error_text(),
            extra: self.extra_json()?,
            ..CallExtras::default()
        }))
    }
}

#[pymethods]
impl NativeCall {
    /// `decision`: the `NativeDecision` (None: nothing decided); `chain`: the walk's
    /// `(executor, outcome, reason)` entries (`walk_chain`'s); `provenance`: where the call's
    /// facts came from (None: the decision's own); `pack`: None for the decision's pack;
    /// `kind`: `call`, `context_parallel` or `sdpa`; `error`: why a call of another kind did
    /// not run; `extra`: that kind's fields (a dict of plain values); `steps`: a
    /// context-parallel call's per-step calls.
    #[new]
    #[pyo3(signature = (decision, chain, provenance=None, *, pack=None, fallback=None,
                        substitution_refused=false, problem=String::new(), kind="call",
                        error=None, extra=None, steps=Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        decision: Option<Py<NativeDecision>>,
        chain: Vec<(String, String, String)>,
        provenance: Option<Vec<(String, String)>>,
        pack: Option<String>,
        fallback: Option<String>,
        substitution_refused: bool,
        problem: String,
        kind: &str,
        error: Option<String>,
        extra: Option<Bound<'_, PyAny>>,
        steps: Vec<Py<NativeCall>>,
    ) -> PyResult<Self> {
        let attempts = chain
            .into_iter()
            .map(|(executor, o, reason)| {
                Ok(ExecutorAttempt {
                    executor,
                    outcome: outcome(&o)?,
                    reason: (!reason.is_empty()).then_some(reason),
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let extra = match extra {
            None => Map::new(),
            Some(x) if x.is_none() => Map::new(),
            Some(x) => match pythonize::depythonize::<Json>(&x) {
                Ok(Json::Object(m)) => m,
                Ok(_) => return Err(PyValueError::new_err("extra must be a dict")),
                Err(e) => return Err(PyValueError::new_err(format!("extra: {e}"))),
            },
        };
        let pack = match (pack, &decision) {
            (Some(p), _) => p,
            (None, Some(d)) => d.get().policy.policy().name.clone(),
            (None, None) => {
                return Err(PyValueError::new_err(
                    "a call without a decision names its pack",
                ));
            }
        };
        Ok(NativeCall {
            kind: Kind::parse(kind)?,
            decision,
            pack,
            attempts,
            provenance,
            fallback,
            substitution_refused,
            problem,
            error,
            extra,
            steps,
        })
    }

    /// `call`, `context_parallel` or `sdpa`.
    #[getter]
    fn kind(&self) -> &'static str {
        self.kind.word()
    }

    #[getter]
    fn pack(&self) -> String {
        self.pack.clone()
    }

    /// The `NativeDecision`, or None.
    #[getter]
    fn decision(&self, py: Python<'_>) -> Option<Py<NativeDecision>> {
        self.decision.as_ref().map(|d| d.clone_ref(py))
    }

    /// The selected backend, or None.
    #[getter]
    fn backend(&self) -> Option<String> {
        self.selected()
    }

    /// The executor that ran (the chain entry whose outcome is `ran`), or None.
    #[getter]
    fn executor(&self) -> Option<String> {
        self.ran().map(|i| self.attempts[i].executor.clone())
    }

    /// The executor that ran is not the chain's first entry.
    #[getter]
    fn substitute(&self) -> bool {
        self.ran().is_some_and(|i| i > 0)
    }

    /// The chain as walked: `(executor, outcome, reason)`, reason "" where none.
    #[getter]
    fn executor_chain(&self) -> Vec<(String, &'static str, String)> {
        self.attempts
            .iter()
            .map(|a| {
                (
                    a.executor.clone(),
                    a.outcome.word(),
                    a.reason.clone().unwrap_or_default(),
                )
            })
            .collect()
    }

    /// Where each fact came from, in order: `(fact, source)`.
    #[getter]
    fn provenance(&self) -> Vec<(String, String)> {
        self.provenance_pairs()
    }

    #[getter]
    fn fallback(&self) -> Option<String> {
        self.fallback.clone()
    }

    #[getter]
    fn substitution_refused(&self) -> bool {
        self.substitution_refused
    }

    #[getter]
    fn problem(&self) -> String {
        self.problem.clone()
    }

    /// The document's `error`: why nothing ran (None when something ran, or nothing had to).
    #[getter]
    fn error(&self) -> Option<String> {
        self.error_text()
    }

    /// The document's `extra` (None for one attention call).
    #[getter]
    fn extra(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match self.extra_json()? {
            Some(x) => to_py(py, &x),
            None => Ok(py.None()),
        }
    }

    /// The kind's own fields as the caller gave them (the document's `extra` without `kind`,
    /// the SDPA facts and the per-step documents): cheap to read.
    #[getter]
    fn fields(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_py(py, &Json::Object(self.extra.clone()))
    }

    /// A context-parallel call's per-step calls.
    #[getter]
    fn steps(&self, py: Python<'_>) -> Vec<Py<NativeCall>> {
        self.steps.iter().map(|s| s.clone_ref(py)).collect()
    }

    /// The call document (`attn-policy/call/v1`, docs/schema/call-v1.json): what `attn-policy
    /// run --json` prints, its `extra` this kind's fields.
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_py(py, &self.document()?)
    }

    /// The call document as compact JSON text.
    fn to_json(&self) -> PyResult<String> {
        Ok(self.document()?.to_string())
    }
}
