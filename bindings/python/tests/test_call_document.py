"""One result model: ``CallDecision.to_dict()`` is the call document (``attn-policy/call/v1``,
docs/schema/call-v1.json) that ``attn-policy run --json`` prints, built by the Rust explanation
model; and the config a call decided with, fed to the CLI, decides the same."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

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
    assert doc["error"] is None and doc["fallback"] is None
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
