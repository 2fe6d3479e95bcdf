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


@pytest.mark.parametrize(
    "key, value, message",
    [
        # NaN and infinities were read as JSON null: "must not be null (expected int)".
        ("head_dim_qk", float("nan"), "invalid config: head_dim_qk: nan is not a finite number"),
        ("attention_dropout", float("inf"), "invalid config: attention_dropout: inf is not a finite number"),
        ("attention_dropout", float("-inf"), "invalid config: attention_dropout: -inf is not a finite number"),
        # An int past 64 bits was read as its float rounding ("1.1805916207174113e+21 ...").
        ("head_dim_qk", 2**70, "invalid config: head_dim_qk: 1180591620717411303424 does not fit a 64-bit integer"),
        ("max_seqlen_q", 2**63, "invalid config: max_seqlen_q: 9223372036854775808 does not fit a 64-bit integer"),
    ],
)
def test_a_number_no_fact_can_hold_is_named_as_given(policy, key, value, message):
    for config in (dict(CFG, **{key: value}), NotADict(dict(CFG, **{key: value}))):
        with pytest.raises(PolicyError) as e:
            policy.select(config)
        assert str(e.value) == message


class NotADict(dict):
    """A dict subclass: read through the other reader (``dict_json``)."""


def test_bad_types_and_values_are_refused_naming_the_fact(policy):
    cases = [
        ({"head_dim_qk": "128"}, 'head_dim_qk: expected an integer, found "128"'),
        ({"head_dim_qk": None}, "head_dim_qk: must not be null"),
        ({"head_dim_qk": True}, "head_dim_qk: expected an integer, found true"),
        ({"head_dim_qk": -128}, "head_dim_qk: must be > 0, found -128"),
        ({"head_dim_qk": {"a": 1}}, 'head_dim_qk: expected an integer, found {"a":1}'),
        ({"attn_mask_type": "casual"}, "did you mean `causal`?"),
    ]
    for extra, fragment in cases:
        with pytest.raises(PolicyError, match="invalid config: ") as e:
            policy.select(dict(CFG, **extra))
        assert fragment in str(e.value), (extra, str(e.value))
    for config, fragment in [([1, 2], "expected a dict of facts, found list"), (None, "found NoneType"),
                             ("head_dim_qk", "not JSON"), ("[1]", "expected an object of facts")]:
        with pytest.raises(PolicyError, match="invalid config: ") as e:
            policy.select(config)
        assert fragment in str(e.value), (config, str(e.value))


def test_a_probe_or_derived_fact_given_as_an_input_says_how_to_give_it(policy):
    # Both were "unknown fact", with no hint, though docs/facts.md lists them by these names.
    with pytest.raises(PolicyError) as e:
        policy.select(dict(CFG, **{"probe.fused_attn_graph": True}))
    assert str(e.value) == ('invalid config: probe.fused_attn_graph: a probe answer, given under `probe`: '
                            '{"probe": {"fused_attn_graph": true}} (true, false or null)')
    assert policy.select(dict(CFG, probe={"fused_attn_graph": True})).selected == "FusedAttention"
    with pytest.raises(PolicyError, match=r"invalid config: sm: derived from the input facts, not one of them "
                                          r"\(major \* 10 \+ minor"):
        policy.select(dict(CFG, sm=90))


def test_load_refuses_arguments_of_the_wrong_type_naming_them():
    # A lone str for a list was iterated: overlays "s", "i", "t", ... and layers_off "g", ...
    with pytest.raises(TypeError, match=r"overlays must be a list; found str 'site.yaml' \(write overlays=\['site.yaml'\]\)"):
        attn_policy.Policy.load("te", overlays="site.yaml")
    with pytest.raises(TypeError, match=r"layers_off must be a list; found str 'guard'"):
        attn_policy.Policy.load("te", layers_off="guard")
    with pytest.raises(TypeError, match="layers_off must hold str; found int 1"):
        attn_policy.Policy.load("te", layers_off=[1])
    with pytest.raises(TypeError, match="pack must be a str or os.PathLike; found NoneType"):
        attn_policy.Policy.load(None)
    with pytest.raises(TypeError, match="parity must be True or False; found 'yes'"):
        attn_policy.Policy.load("te", parity="yes")
    with pytest.raises(TypeError, match="cache_size must be an int"):
        attn_policy.Policy.load("te", cache_size="4096")
    # "can't convert negative int to unsigned" (an OverflowError) before.
    with pytest.raises(PolicyError, match="cache_size must be >= 0 .*found -1"):
        attn_policy.Policy.load("te", cache_size=-1)
    with pytest.raises(PolicyError, match="pack `te` has no layer `gaurd`; layers: capability, guard"):
        attn_policy.Policy.load("te", layers_off=["gaurd"])
    assert attn_policy.Policy.load("te", layers_off=("guard",), overlays=[]).name == "te"


def test_check_refuses_a_backend_that_is_not_a_name(policy):
    with pytest.raises(TypeError, match="backend must be a backend name \\(str\\); found NoneType"):
        policy.check(CFG, None)


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


def test_the_package_docstring_example_runs_as_written():
    """``help(attn_policy)`` opens with this example; it claimed FusedAttention for a config
    that leaves FusedAttention pending its probe."""
    import doctest

    result = doctest.testmod(attn_policy, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 4 and result.failed == 0


def test_a_backend_declined_for_want_of_a_variant_says_why(policy):
    """FlashAttention without flash-attn is declined by no rule: none of its variants applies.
    Its verdict had no reason and ``report()`` said "<declined>: FlashAttention is declined"."""
    config = {"head_dim_qk": 256, "head_dim_v": 256, "device_compute_capability": [9, 0]}
    policy.reset_report()
    v = policy.check(config, "FlashAttention", mode="audit")
    assert not v.allowed and v.status == "declined"
    assert [r.id for r in v.declined_by] == ["FlashAttention:FA4", "FlashAttention:FA3", "FlashAttention:FA2"]
    assert all(r.kind == "unavailable_variant" and r.layer == "variant" for r in v.declined_by)
    assert v.declined_by[0].values == {"flash_attn_versions.v4": None}
    assert "FA4 not available: `flash_attn_versions.v4 != null` is false" in v.explain()
    assert "<declined>" not in policy.report() and "because of FlashAttention:FA2: FA2 not available" in policy.report()


def test_help_documents_every_public_function_and_member():
    """``help(attn_policy.Policy)`` and the others: every public function, method and property
    of the package's exported classes has a docstring."""
    import inspect

    missing = []
    for name in attn_policy.__all__:
        obj = getattr(attn_policy, name)
        if inspect.isfunction(obj) and not inspect.getdoc(obj):
            missing.append(name)
        if inspect.isclass(obj):
            if not obj.__doc__:
                missing.append(name)
            for member, f in vars(obj).items():
                if member.startswith("_"):
                    continue
                target = f.__func__ if isinstance(f, (classmethod, staticmethod)) else f
                if (inspect.isfunction(target) or isinstance(target, property)) and not inspect.getdoc(target):
                    missing.append(f"{name}.{member}")
    assert not missing, missing
