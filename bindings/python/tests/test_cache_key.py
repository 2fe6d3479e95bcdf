"""The input memo in front of the decision cache is never stale: its key covers every fact
(dict content, nested objects, environment facts and their sources, process switches), so a
changed input never hits the entry of the old one, and an equal input does."""
import copy
import types

import pytest

import attn_policy
from attn_policy import te

from test_te import DelayedScaling, Format, te_params

BASE = {
    "head_dim_qk": 128,
    "head_dim_v": 128,
    "qkv_layout": "bshd_bshd_bshd",
    "device_compute_capability": [9, 0],
    "cudnn_version": [9, 12, 0],
    "flash_attn_versions": {"v2": "2.8.3"},
    "env": {},
}


def fresh(config):
    """The decision of an uncached policy (the reference)."""
    return attn_policy.Policy.load("te", cache_size=0).select(copy.deepcopy(config)).to_dict()


def stats(p):
    s = p.cache_stats()
    return s["hits"], s["misses"]


def test_equal_content_hits_and_mutated_dict_misses():
    p = attn_policy.Policy.load("te")
    cfg = copy.deepcopy(BASE)
    a = p.select(cfg)
    # An equal dict built from other objects (other str objects too) hits.
    b = p.select({"".join(k): v for k, v in copy.deepcopy(BASE).items()})
    assert stats(p) == (1, 1)
    assert b.to_dict() == a.to_dict()
    # In-place changes: a top-level value, a nested switch, a nested version string.
    changes = [
        lambda c: c.__setitem__("head_dim_qk", 256),
        lambda c: c["env"].__setitem__("NVTE_FLASH_ATTN", "0"),
        lambda c: c["flash_attn_versions"].__setitem__("v2", "2.7.4"),
        lambda c: c["device_compute_capability"].__setitem__(0, 10),
        lambda c: c["cudnn_version"].__setitem__(2, 1),
    ]
    for n, change in enumerate(changes, 1):
        change(cfg)
        d = p.select(cfg)
        assert stats(p) == (1, 1 + n), f"change {n} must miss"
        assert d.to_dict() == fresh(cfg), f"change {n}"
    # The flash-attn switch really matters here.
    assert p.select(dict(BASE, env={"NVTE_FLASH_ATTN": "0"})).status("FlashAttention") != a.status("FlashAttention")


@pytest.mark.parametrize(
    "x, y",
    [
        ({"attention_dropout": 0.0}, {"attention_dropout": -0.0}),  # float bit pattern
        ({"attention_dropout": 0.1}, {"attention_dropout": 0.1 + 2**-56}),  # one ulp
        ({"deterministic": True}, {"deterministic": 1}),  # bool vs int
        ({"cudnn_version": [9, 12, 0]}, {"cudnn_version": [9, 12, 1]}),  # one version part
        ({"flash_attn_versions": {"v2": "2.8.3"}}, {"flash_attn_versions": {"v2": "2.8.3rc1"}}),
        ({"env": {"NVTE_FUSED_ATTN": "0"}}, {"env": {"NVTE_FUSED_ATTN": "1"}}),
    ],
)
def test_one_different_fact_is_a_different_key(x, y):
    p = attn_policy.Policy.load("te")
    cx, cy = dict(BASE, **x), dict(BASE, **y)
    try:
        dx = p.select(cx).to_dict()
    except attn_policy.PolicyError:
        dx = None
    try:
        dy = p.select(cy).to_dict()
    except attn_policy.PolicyError:
        dy = None
    hits, _ = stats(p)
    assert hits == 0, f"{x} and {y} must not share an entry"
    if dx is not None:
        assert dx == fresh(cx)
    if dy is not None:
        assert dy == fresh(cy)


def test_json_string_configs_are_keyed_by_their_text():
    p = attn_policy.Policy.load("te")
    a = p.select('{"head_dim_qk": 128, "head_dim_v": 128}')
    b = p.select('{"head_dim_qk": 256, "head_dim_v": 256}')
    assert stats(p) == (0, 2)
    assert a.to_dict() != b.to_dict()


def test_te_attribute_and_object_changes_miss():
    te.clear_environment()
    p = attn_policy.Policy.load("te")
    te.set_policy(p)
    try:
        ns = te_params()
        first = te.get_attention_backend(ns, frost=False)
        assert te.get_attention_backend(ns, frost=False) == first
        assert stats(p) == (1, 1)
        ns.head_dim_qk = ns.head_dim_v = 256
        te.get_attention_backend(ns, frost=False)
        assert stats(p) == (1, 2)
        # A recipe object changed in place (read through its attributes) misses too.
        recipe = DelayedScaling()
        ns = te_params(fp8=True, fp8_meta={"recipe": recipe})
        a = te.select(ns)
        recipe.fp8_dpa = False
        b = te.select(ns)
        assert stats(p) == (1, 4)
        assert a.explain() != b.explain() or a.to_dict() == b.to_dict()
        recipe.fp8_format = Format.E4M3
        te.select(ns)
        assert stats(p) == (1, 5)
    finally:
        te.set_policy(None)
        te.clear_environment()


def test_te_environment_sources_and_switches_are_part_of_the_key(monkeypatch):
    te.clear_environment()
    p = attn_policy.Policy.load("te")
    te.set_policy(p)
    monkeypatch.delenv("NVTE_FLASH_ATTN", raising=False)
    try:
        ns = te_params()
        base = te.select(ns)
        # The same value from another source: same facts, other provenance; never the old one.
        by_arg = te.select(ns, cudnn_version=(9, 12, 0))
        te.set_environment(cudnn_version=(9, 12, 0))
        by_set = te.select(ns)
        assert by_arg.provenance["cudnn_version"] == "argument"
        assert by_set.provenance["cudnn_version"] == "set_environment"
        assert by_set.to_dict()["backends"] == by_arg.to_dict()["backends"]
        # One version differs: another decision input.
        other = te.select(ns, cudnn_version=(9, 1, 0))
        assert other.provenance["cudnn_version"] == "argument"
        # A process switch set between calls is read again.
        monkeypatch.setenv("NVTE_FLASH_ATTN", "0")
        off = te.select(ns)
        assert off.provenance.get("env.NVTE_FLASH_ATTN") == "os.environ"
        assert off.status("FlashAttention") in ("disabled", "declined")
        monkeypatch.setenv("NVTE_FLASH_ATTN", "1")
        on = te.select(ns)
        assert on.status("FlashAttention") == by_set.status("FlashAttention")
        # Switches given by the caller win over the process environment, and say so.
        given = te.select(ns, env={"NVTE_FLASH_ATTN": "0"})
        assert given.provenance["env.NVTE_FLASH_ATTN"] == "argument"
        assert given.status("FlashAttention") in ("disabled", "declined")
        # (Equal facts from other sources share the decision cache's entry, by_set with by_arg
        # and `on` with by_set; the input memo keeps each call's own provenance, checked above.)
        hits = stats(p)[0]
        # The same call again hits, with the same provenance.
        again = te.select(ns, env={"NVTE_FLASH_ATTN": "0"})
        assert stats(p)[0] == hits + 1
        assert again.provenance == given.provenance
        assert base.provenance.get("env.NVTE_FLASH_ATTN") is None
    finally:
        te.set_policy(None)
        te.clear_environment()


def test_te_decisions_match_an_uncached_policy(valid_corpus):
    te.clear_environment()
    cached = attn_policy.Policy.load("te")
    uncached = attn_policy.Policy.load("te", cache_size=0)
    try:
        for r in valid_corpus[:60]:
            ns = types.SimpleNamespace(**r["config"])
            te.set_policy(cached)
            a = te.get_attention_backend(ns, frost=False)
            a2 = te.get_attention_backend(ns, frost=False)
            te.set_policy(uncached)
            b = te.get_attention_backend(types.SimpleNamespace(**copy.deepcopy(r["config"])), frost=False)
            assert a == a2 == b
    finally:
        te.set_policy(None)
