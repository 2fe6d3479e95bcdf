"""The executor chain walk's rule, from the same case table as the Rust walk's test
(tests/fixtures/chain_cases.json at the repository root, read by adapters/src/chain.rs too):
``_native.walk_chain`` is the Rust walk itself, trying each entry through a Python callable.
Then the rule inside ``attn_policy.torch``: a failed plan moves on to a substitute, recorded as
``failed`` and logged once at WARNING. No GPU needed."""

import json
import logging
from pathlib import Path

import pytest

from attn_policy import _native

CASES = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "chain_cases.json"

RAISES = {
    "refuses": (_native.ExecutorRefused, "does not do this"),
    "unavailable": (_native.ExecutorUnavailable, "has no device"),
    "fails": (_native.ExecutorFailed, "plan failed"),
}


def _cases():
    return json.loads(CASES.read_text())["cases"]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["name"])
def test_the_shared_cases_hold(case):
    behaviour = dict(case["chain"])
    tried = []

    def try_entry(name):
        tried.append(name)
        what = behaviour[name]
        if what == "runs":
            return f"runner of {name}"
        exc, words = RAISES[what]
        raise exc(f"{name} {words}")

    names = [n for n, _ in case["chain"]]
    index, outcomes, error, runner = _native.walk_chain("B", names, case["no_substitute"], try_entry)
    assert [o for _, o, _ in outcomes] == case["outcomes"]
    assert [n for n, _, _ in outcomes] == names
    assert index == case["runs"]
    assert error == case["error"]
    if index is None:
        assert runner is None
    else:
        assert runner == f"runner of {names[index]}"
    # Nothing after the entry that runs (or after a refused substitution) is tried.
    assert tried == [n for (n, _, _), o in zip(outcomes, case["outcomes"]) if o != "not_tried"]
    for n, o, reason in outcomes:
        if o in ("refused", "unavailable", "failed"):
            assert reason.startswith(n), reason


def test_an_error_that_is_no_executor_answer_ends_the_walk():
    tried = []

    def try_entry(name):
        tried.append(name)
        raise KeyError(name)

    with pytest.raises(KeyError):
        _native.walk_chain("B", ["a", "b"], False, try_entry)
    assert tried == ["a"]


def test_a_failed_plan_inside_attention_moves_on_and_warns_once(monkeypatch, caplog):
    torch = pytest.importorskip("torch")
    import attn_policy.torch as apt
    from attn_policy import _chain

    real = _chain._runner_for
    seen = []

    def runner_for(name, *args):
        if not seen:
            seen.append(name)
            raise _native.ExecutorFailed("cudnn: out of memory while planning")
        return real(name, *args)

    monkeypatch.setattr(_chain, "_runner_for", runner_for)
    apt.clear_cache()
    try:
        q = torch.randn(1, 2, 16, 8, dtype=torch.float32)
        with caplog.at_level(logging.WARNING, logger="attn_policy.torch"):
            o, d = apt.attention(q, q, q, return_decision=True)
            apt.attention(q, q, q)  # the same signature: decided once, logged once
        first = d.chain[0]
        assert (first.executor, first.outcome) == (seen[0], "failed")
        assert "out of memory" in first.reason
        assert d.substitute and d.executor is not None and d.executor != seen[0]
        assert [e.outcome for e in d.chain].count("ran") == 1
        warnings = [r for r in caplog.records if "substitute" in r.getMessage()]
        assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING, warnings
        assert torch.isfinite(o).all()
        # no_substitute: the failed plan is an error, nothing else was tried.
        with pytest.raises(apt.SubstitutionRefused, match="substitution refused") as e:
            seen.clear()
            apt.attention(q, q, q, no_substitute=True)
        outcomes = [c.outcome for c in e.value.decision.chain]
        assert outcomes[0] == "failed" and set(outcomes[1:]) <= {"not_tried"}, outcomes
    finally:
        apt.clear_cache()
