"""One result model: a call's :class:`attn_policy.Explanation` (``attention``, ``cp_attention``,
``explain_sdpa``): its ``to_dict()`` is the call document (``attn-policy/call/v1``,
docs/schema/call-v1.json) that ``attn-policy run --json`` prints, built by the Rust explanation
model, a context-parallel call's and an SDPA explanation's own fields in its ``extra``; the
config a call decided with, fed to the CLI, decides the same; the names of the classes it
replaced still work, deprecated."""

import json
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import attn_policy  # noqa: E402
import attn_policy.torch as apt  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = json.loads((ROOT / "docs" / "schema" / "call-v1.json").read_text())
TYPES = {"string": str, "boolean": bool, "object": dict, "array": list, "null": type(None)}


def _check(doc):
    """The call schema's own constraints (it is flat: required keys, no others, types)."""
    assert set(doc) == set(SCHEMA["required"]) == set(SCHEMA["properties"]), sorted(doc)
    for key, spec in SCHEMA["properties"].items():
        if "const" in spec:
            assert doc[key] == spec["const"], key
            continue
        kinds = spec["type"] if isinstance(spec["type"], list) else [spec["type"]]
        assert any(isinstance(doc[key], TYPES[k]) and not (k != "boolean" and isinstance(doc[key], bool))
                   for k in kinds), (key, doc[key])
    outcomes = SCHEMA["properties"]["executor_chain"]["items"]["properties"]["outcome"]["enum"]
    for e in doc["executor_chain"]:
        assert set(e) == {"executor", "outcome", "reason"} and e["outcome"] in outcomes, e
    assert doc["decision"]["schema"] == "attn-policy/explain/v1"
    extra = doc["extra"]
    if extra is not None:
        spec = SCHEMA["$defs"][extra["kind"]]
        assert set(extra) == set(spec["required"]) == set(spec["properties"]), sorted(extra)
        assert extra["kind"] == spec["properties"]["kind"]["const"]
        if extra["kind"] == "context_parallel":
            items = spec["properties"]["work"]["items"]
            blocks = items["properties"]["blocks"]["items"]
            for w in extra["work"]:
                assert set(w) == set(items["required"]), w
                assert all(set(b) == set(blocks["required"]) for b in w["blocks"]), w
            for step in extra["steps"]:
                _check(step)
    try:
        import jsonschema
    except ImportError:  # the torch venvs of bindings/test.sh: the checks above
        return
    jsonschema.validate(doc, SCHEMA)


def _call(**kw):
    q = torch.randn(1, 2, 16, 8, dtype=torch.float32)
    return apt.attention(q, q, q, return_decision=True, **kw)[1]


def test_to_dict_is_the_call_document():
    d = _call(is_causal=True)
    doc = d.to_dict()
    _check(doc)
    assert doc["pack"] == d.pack and doc["backend"] == d.backend and doc["executor"] == d.executor
    assert doc["substitute"] == d.substitute
    assert doc["executor_chain"] == doc["decision"]["executor_chain"]
    assert [e["executor"] for e in doc["executor_chain"]] == [e.executor for e in d.chain]
    assert doc["decision"]["executor"] == d.executor
    assert doc["decision"]["provenance"] == d.provenance
    assert doc["error"] is None and doc["fallback"] is None and doc["extra"] is None
    assert isinstance(d, attn_policy.Explanation) and d.kind == "call"
    assert all(isinstance(e, attn_policy.ExecutorAttempt) for e in d.executor_chain)
    assert d.chain == d.executor_chain and json.loads(d.to_json()) == doc
    # Declined and fell back: the chain says why, `fallback` and `error` are filled.
    d = _call(dropout_p=0.1, on_decline="fallback")
    doc = d.to_dict()
    _check(doc)
    assert doc["executor"] is None and doc["fallback"] and doc["error"], doc


def _cli():
    exe = os.environ.get("ATTN_POLICY_BIN")
    if exe:
        return exe
    for build in ("release", "debug"):
        p = ROOT / "target" / build / "attn-policy"
        if p.exists():
            return str(p)
    return shutil.which("attn-policy")


def test_the_cli_decides_a_call_s_config_the_same(tmp_path):
    exe = _cli()
    if exe is None:
        pytest.skip("no attn-policy binary (cargo build -p attn-policy-cli, or ATTN_POLICY_BIN)")
    for kw in ({}, {"is_causal": True}, {"window": (4, 0)}, {"dropout_p": 0.1, "on_decline": "fallback"}):
        d = _call(**kw)
        config = d.decision._d.config
        path = tmp_path / "call.json"
        path.write_text(json.dumps(config))
        out = subprocess.run([exe, "explain", str(path), "--pack", "te", "--json"],
                             capture_output=True, text=True)
        assert out.returncode in (0, 1), out.stderr
        cli = json.loads(out.stdout)
        py = d.to_dict()["decision"]
        for key in ("selected", "variant", "preference", "pending_probes", "provisional",
                    "layers_disabled", "backends", "input"):
            assert py[key] == cli[key], (kw, key)


# ---------------------------------------------------------------------------------------------
# Context parallelism and SDPA: the same model, their own fields in `extra`.


@pytest.fixture(scope="module")
def world1():
    """A gloo process group of one rank, in this process."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    if created:
        dist.destroy_process_group()


def test_a_context_parallel_call_is_the_same_model(world1):
    import attn_policy.context_parallel as cp

    q = torch.randn(1, 2, 8, 8, dtype=torch.float64)
    o, d = cp.cp_attention(q, q, q, cp_group=world1, is_causal=True, return_decision=True)
    assert isinstance(d, attn_policy.Explanation) and d.kind == "context_parallel"
    assert (d.comm_type, d.cp_size, d.cp_rank, d.declined) == ("p2p", 1, 0, "")
    assert d.preflight is d.decision and d.backend == d.preflight.selected and d.pack == "native"
    assert d.steps and all(s.kind == "call" and s.executor for s in d.steps)
    assert "native pre-flight admitted" in d.summary()
    doc = d.to_dict()
    _check(doc)
    extra = doc["extra"]
    assert (extra["kind"], extra["comm_type"], extra["cp_size"], extra["cp_rank"]) == ("context_parallel", "p2p", 1, 0)
    assert extra["declined"] is None and doc["error"] is None
    assert extra["steps"] == [s.to_dict() for s in d.steps]
    assert len(extra["work"]) == len(d.work) and sum(len(w["blocks"]) for w in extra["work"]) == sum(
        len(w.blocks) for w in d.work)
    # Declined (dropout): the exception carries the same model, with why.
    with pytest.raises(cp.ContextParallelDeclined) as e:
        cp.cp_attention(q, q, q, cp_group=world1, cp_comm_type="all_gather", dropout_p=0.1)
    d = e.value.decision
    assert d.kind == "context_parallel" and d.declined and "declined" in d.summary()
    doc = d.to_dict()
    _check(doc)
    assert doc["extra"]["declined"] == d.declined == doc["error"]


def test_an_sdpa_explanation_is_the_same_model():
    from attn_policy.sdpa import BACKENDS, explain_sdpa

    q = torch.randn(1, 2, 128, 64, dtype=torch.float16)
    d = explain_sdpa(q, q, q, is_causal=True, sm=90, cudnn=91900)
    assert isinstance(d, attn_policy.Explanation) and d.kind == "sdpa"
    assert d.selected == d.backend and d.sdp_backend == BACKENDS[d.selected]
    assert d.executor is None and d.executor_chain == [] and d.error is None
    doc = d.to_dict()
    _check(doc)
    extra = doc["extra"]
    assert extra["kind"] == "sdpa" and extra["sdp_backend"] == d.sdp_backend
    assert extra["facts"] == d.facts and extra["facts"]["is_causal"] is True and extra["facts"]["sm"] == 90
    assert extra["assumptions"] == d.assumptions
    assert doc["backend"] == doc["decision"]["selected"] == d.selected and doc["pack"] == "torch"


# ---------------------------------------------------------------------------------------------
# The names of the classes Explanation replaced: deprecated aliases for one release.


def test_the_deprecated_names_warn_once_and_resolve():
    import attn_policy._model as model
    import attn_policy.context_parallel as cp
    import attn_policy.sdpa as sdpa

    cases = [
        (apt, "CallDecision", attn_policy.Explanation),
        (apt, "ChainEntry", attn_policy.ExecutorAttempt),
        (apt, "SdpaDecision", attn_policy.Explanation),
        (apt, "CPDecision", attn_policy.Explanation),
        (cp, "CPDecision", attn_policy.Explanation),
        (sdpa, "SdpaDecision", attn_policy.Explanation),
    ]
    model._warned.clear()
    for module, name, new in cases:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert getattr(module, name) is new
            assert getattr(module, name) is new  # warned once
        assert [w.category for w in caught] == [DeprecationWarning], (module.__name__, name, caught)
        assert f"{module.__name__}.{name} is deprecated" in str(caught[0].message)
        assert name not in module.__all__
    # `from ... import` works too, and existing code keeps working with the alias.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from attn_policy.torch import CallDecision, ChainEntry
    d = _call(is_causal=True)
    assert isinstance(d, CallDecision) and isinstance(d.chain[0], ChainEntry)
    assert ChainEntry("reference", "ran") == attn_policy.ExecutorAttempt("reference", "ran", "")
    with pytest.raises(AttributeError):
        apt.NoSuchName  # noqa: B018
