import json
import logging

import pytest

import attn_policy
from attn_policy import PolicyError, PolicyViolation

CFG = {"head_dim_qk": 128, "head_dim_v": 128, "device_compute_capability": [9, 0], "qkv_dtype": "bf16"}


@pytest.fixture()
def policy():
    return attn_policy.Policy.load("te")


def test_select_decision_api(policy):
    d = policy.select(CFG)
    assert d.selected in policy.backend_names
    names = [b.name for b in d.backends]
    assert names == policy.backend_names
    sel = [b for b in d.backends if b.status == "selected"]
    assert [b.name for b in sel] == [d.selected]
    doc = d.to_dict()
    assert doc["schema"] == "attn-policy/explain/v1"
    assert doc["selected"] == d.selected
    assert d.explain().startswith(f"selected: {d.selected}")
    assert json.loads(d.to_json()) == doc
    assert len(d.te_tuple()) == 6 and len(d.te_tuple(frost=True)) == 7


def test_renderings_read_one_explanation(policy):
    d = policy.select(CFG)
    doc = d.to_dict()
    # Fields the explanation model added to explain/v1.
    assert doc["input"]["head_dim_qk"] == 128 and doc["input"]["sm"] == 90
    assert doc["provenance"] == {}  # a plain config dict: sources unknown
    assert doc["executor"] is None and doc["executor_chain"] == []
    # The TE tuple, the declines and the repr agree with the document.
    by_name = {b["name"]: b for b in doc["backends"]}
    te_names = ("FlashAttention", "FusedAttention", "UnfusedDotProductAttention")

    def eligible(name):
        return by_name[name]["status"] in ("selected", "outranked")

    def reported(name):
        v = by_name[name]["variant"]
        return v["value"] if eligible(name) and v else None

    t = d.te_tuple(frost=True)
    assert t[5] == [eligible(n) for n in te_names]
    assert (t[0], t[2], t[4], t[6]) == tuple(doc["selected"] == n for n in te_names + ("FrostAttention",))
    assert (t[1], t[3]) == (reported("FlashAttention"), reported("FusedAttention"))
    for name, b in by_name.items():
        assert d._d.declined_by(name) == b["declined_by"]
    assert d._d.declined_by("NoSuchBackend") == []
    statuses = " ".join(f"{b['name']}={b['status']}" for b in doc["backends"])
    assert repr(d._d) == f'<Decision selected="{doc["selected"]}" {statuses}>'
    assert d.explain() == d.explain()


def test_declines_carry_rule_id_reason_location_values(policy):
    d = policy.select({"head_dim_qk": 1024, "head_dim_v": 1024, "device_compute_capability": [8, 0]})
    declined = [r for b in d.backends for r in b.declined_by]
    assert declined
    for r in declined:
        assert r.id and r.reason and r.layer
        assert r.location.startswith("rules/te/")
        assert isinstance(r.values, dict)


def test_object_config_is_read_through_attributes(policy):
    class Cfg:
        def __init__(self):
            self.__dict__.update(CFG)

    assert policy.select(Cfg()).selected == policy.select(CFG).selected


def test_bad_config_raises_policy_error_with_cli_message(policy):
    with pytest.raises(PolicyError) as e:
        policy.select({"head_dimqk": 1})
    assert str(e.value) == "invalid config: head_dimqk: unknown fact (did you mean `head_dim_qk`?)"
    assert isinstance(e.value, ValueError)
    with pytest.raises(PolicyError):
        policy.select({"qkv_dtype": "int3"})


def test_bad_pack_raises_with_diagnostics(tmp_path):
    with pytest.raises(PolicyError, match="unknown pack `tee`.*did you mean `te`"):
        attn_policy.Policy.load("tee")
    (tmp_path / "pack.yaml").write_text("name: broken\nbackends: [nope.yaml]\n")
    with pytest.raises(PolicyError) as e:
        attn_policy.Policy.load(tmp_path)
    assert e.value.diagnostics and all("message" in d for d in e.value.diagnostics)


def test_cache_hits_and_environment_in_key(policy):
    policy.cache_clear()
    policy.select(CFG)
    policy.select(CFG)
    s = policy.cache_stats()
    assert (s["hits"], s["misses"]) == (1, 1)
    other = dict(CFG, env={"NVTE_FLASH_ATTN": "0"})
    policy.select(other)
    assert policy.cache_stats()["misses"] == 2


def test_parity_switches_off_guard_layer():
    p = attn_policy.Policy.load("te", parity=True)
    assert "guard" in p.select(CFG).to_dict()["layers_disabled"]


# -- check mode ----------------------------------------------------------------------------

DECLINED_FLASH = {"head_dim_qk": 1024, "head_dim_v": 1024, "device_compute_capability": [8, 0]}


def test_check_allows_and_declines(policy):
    d = policy.select(CFG)
    assert policy.check(CFG, d.selected).allowed
    v = policy.check(DECLINED_FLASH, "FlashAttention", mode="audit")
    assert not v.allowed and v.declined_by and v.status == "declined"
    with pytest.raises(PolicyError, match="unknown backend"):
        policy.check(CFG, "Flash")


def test_enforce_raises_with_explanation(policy):
    with pytest.raises(PolicyViolation) as e:
        policy.check(DECLINED_FLASH, "FlashAttention", mode="enforce")
    assert "FlashAttention is not allowed here" in str(e.value)
    assert e.value.verdict.declined_by[0].id in str(e.value)


def test_warn_logs_once_per_site_backend_rule(policy, caplog):
    with caplog.at_level(logging.WARNING, logger="attn_policy"):
        for _ in range(5):
            policy.check(DECLINED_FLASH, "FlashAttention", mode="warn")
    rules = {r.id for r in policy.check(DECLINED_FLASH, "FlashAttention", mode="audit").declined_by}
    assert len(caplog.records) == len(rules)


def test_audit_report_summarises_per_rule(policy):
    policy.reset_report()
    for _ in range(3):
        policy.check(DECLINED_FLASH, "FlashAttention", mode="audit")
    policy.check(CFG, policy.select(CFG).selected, mode="audit")
    r = policy.report_dict()
    assert r["calls"] == 4 and r["declined"] == 3
    assert all(x["count"] == 3 for x in r["rules"])
    text = policy.report()
    assert "75% of calls (3) fell back from FlashAttention to" in text
