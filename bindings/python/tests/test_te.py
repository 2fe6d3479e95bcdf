import enum
import types

import pytest

import attn_policy
from attn_policy import te


def expected(rec):
    d = rec["decision"]
    return (
        d["use_flash_attention"],
        d["flash_attention_backend"],
        d["use_fused_attention"],
        d["fused_attention_backend"],
        d["use_unfused_attention"],
        d["available_backends"],
    )


# The corpus was recorded with cuDNN accepting every graph (emulated probes): its answers are
# given explicitly (the drop-in's own probes are live, and unknown where they cannot run).
SUPPORTED = {"cuda_device": True, "fused_attn_graph": True, "frost_plan": True}

# Measured with the te pack at the time of writing: 298 of the first 300 records agree.
# The pack is being completed in parallel; the threshold leaves room for it to move a little.
AGREEMENT_THRESHOLD = 0.95


def test_drop_in_agrees_with_te_on_corpus(valid_corpus):
    te.clear_environment()
    records = [r for r in valid_corpus if r["decision"] is not None]
    agree = sum(
        tuple(te.get_attention_backend(types.SimpleNamespace(**r["config"]), frost=False, probe=SUPPORTED)) == expected(r)
        for r in records
    )
    rate = agree / len(records)
    print(f"TE drop-in agreement: {agree}/{len(records)} = {rate:.3f}")
    assert rate >= AGREEMENT_THRESHOLD


def test_dict_namespace_and_select_agree(valid_corpus):
    p = attn_policy.Policy.load("te")
    for r in valid_corpus[:50]:
        if r["decision"] is None:
            continue
        a = te.get_attention_backend(r["config"], frost=False, probe=SUPPORTED)
        b = te.get_attention_backend(types.SimpleNamespace(**r["config"]), frost=False, probe=SUPPORTED)
        assert a == b
        # select() on the plain config (probes answered as in conformance runs)
        cfg = dict(r["config"], probe=SUPPORTED)
        assert p.select(cfg).te_tuple() == a
        # the same answers as an attribute of the object
        c = te.get_attention_backend(types.SimpleNamespace(**r["config"], probe=SUPPORTED), frost=False)
        assert c == a


def test_records_te_refuses_are_input_errors(corpus):
    """Head counts TE's constructor refuses are refused by the drop-in, naming the fact,
    instead of being decided (issue 15: one validation for every front end)."""
    from conftest import te_accepts

    bad = [r for r in corpus if not te_accepts(r["config"])]
    assert bad, "the corpus slice holds no record with KV heads that do not divide query heads"
    for r in bad[:20]:
        with pytest.raises(attn_policy.PolicyError, match="num_gqa_groups"):
            te.get_attention_backend(types.SimpleNamespace(**r["config"]), frost=False, probe=SUPPORTED)


# --- TE's own objects, imitated (torch is not installed here) ---------------------------


class dtype:  # torch.dtype's class name is "dtype" and str() gives "torch.bfloat16"
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


class Size(tuple):  # torch.Size is a tuple subclass
    pass


class Tensor:
    pass


class Float8Tensor:
    pass


class Format(enum.Enum):
    E4M3 = 1
    HYBRID = 3


class DelayedScaling:
    def __init__(self):
        self.fp8_dpa = True
        self.fp8_mha = False
        self.fp8_format = Format.HYBRID
        self.reduce_amax = True


class CacheManager:
    max_pages_per_seq = 8


class InferenceParams:
    def __init__(self):
        self.is_paged = True
        self.page_size = 64
        self.total_num_pages = 128
        self.cache_manager = CacheManager()


def te_params(**over):
    base = dict(
        qkv_type=Tensor,
        qkv_dtype=dtype("bfloat16"),
        qkv_layout="bshd_bshd_bshd",
        batch_size=2,
        num_heads=16,
        num_gqa_groups=16,
        max_seqlen_q=512,
        max_seqlen_kv=512,
        head_dim_qk=128,
        head_dim_v=128,
        attn_mask_type="causal",
        window_size=(-1, 0),
        alibi_slopes_shape=None,
        core_attention_bias_type="no_bias",
        core_attention_bias_shape=None,
        fp8=False,
        fp8_meta={},
        inference_params=None,
    )
    base.update(over)
    return types.SimpleNamespace(**base)


def test_translates_te_objects():
    te.set_environment(device_compute_capability=(9, 0), cudnn_version=(9, 12, 0), flash_attn_versions={"v2": "2.8.3"})
    try:
        plain = te.select(te_params(qkv_type="Tensor", qkv_dtype="bf16", window_size=[-1, 0]))
        objs = te.select(te_params(window_size=Size((-1, 0))))
        assert objs.to_dict()["backends"] == plain.to_dict()["backends"]
        fp8 = te.select(
            te_params(qkv_type=Float8Tensor, fp8=True, fp8_meta={"recipe": DelayedScaling()}, qkv_dtype=dtype("float8_e4m3fn"))
        )
        text = fp8.explain()
        assert fp8.selected is None or isinstance(fp8.selected, str)
        assert "from set_environment" in text
        inf = te.select(te_params(inference_params=InferenceParams(), qkv_layout="bshd_bshd_bshd"))
        assert inf.to_dict()["selected"] == inf.selected
        with pytest.raises(attn_policy.PolicyError, match="qkv_dtype"):
            te.select(te_params(qkv_dtype=dtype("int8")))
    finally:
        te.clear_environment()


def test_provenance_sources():
    te.clear_environment()
    te.set_environment(cudnn_version=(9, 12, 0))
    try:
        d = te.select(te_params(device_compute_capability=[10, 0]), flash_attn_versions={"v2": None})
        prov = d.provenance
        assert prov["device_compute_capability"] == "object"
        assert prov["flash_attn_versions"] == "argument"
        assert prov["cudnn_version"] == "set_environment"
        assert prov["cudnn_frontend_version"] == "probe"  # importlib.metadata: not installed
        assert d.to_dict()["provenance"] == prov
        assert "facts from the environment" in d.explain()
    finally:
        te.clear_environment()
    # No torch here: device and cuDNN fall back to the schema defaults, and say so.
    d = te.select(te_params())
    assert d.provenance["device_compute_capability"] == "default"


def test_env_switches_are_read_per_call(monkeypatch):
    params = te_params()
    monkeypatch.delenv("NVTE_FLASH_ATTN", raising=False)
    first = te.select(params)
    monkeypatch.setenv("NVTE_FLASH_ATTN", "0")
    second = te.select(params)
    assert second.provenance.get("env.NVTE_FLASH_ATTN") == "os.environ"
    assert second.status("FlashAttention") in ("disabled", "declined")
    assert first.provenance.get("env.NVTE_FLASH_ATTN") is None


def test_frost_arity():
    assert len(te.get_attention_backend(te_params(), frost=True)) == 7
    assert len(te.get_attention_backend(te_params(), frost=False)) == 6
    with pytest.raises(attn_policy.PolicyError, match="unknown environment fact"):
        te.get_attention_backend(te_params(), cudnn=(9, 1, 0))


def test_bad_arguments_are_refused_not_decided_for_the_defaults():
    # None or a str has none of AttentionParams' fields: every fact took its default, and a
    # decision came back.
    for bad in (None, "params", 128, [128]):
        for call in (te.select, te.get_attention_backend):
            with pytest.raises(attn_policy.PolicyError, match="attention_params must be TransformerEngine's"):
                call(bad)
    with pytest.raises(attn_policy.PolicyError, match=r"cudnn_verison \(did you mean `cudnn_version`\?\)"):
        te.select(te_params(), cudnn_verison=(9, 1, 0))
    with pytest.raises(attn_policy.PolicyError, match="has no get_attention_backend to replace"):
        te.install(types.SimpleNamespace())


def test_probes_are_live_and_unknown_where_nothing_can_answer():
    """No probe is answered "supported" by default: without torch (this venv) or a GPU every
    probe this process cannot measure stays unknown, and says so; `probe=` answers them."""
    te.clear_environment()
    d = te.select(te_params())
    prov = d.provenance
    for name in ("probe.fused_attn_graph", "probe.frost_plan"):
        assert prov[name] == "default", prov
    try:
        import torch  # noqa: F401

        has_torch = True
    except ImportError:
        has_torch = False
    if not has_torch:
        assert prov["probe.cuda_device"] == "default"
    # FU.40 reads probe.fused_attn_graph: unknown, so FusedAttention is undecided, not selected.
    assert d.status("FusedAttention") == "undecided", d.explain()
    given = te.select(te_params(), probe=SUPPORTED)
    assert given.provenance["probe"] == "argument"
    assert given.status("FusedAttention") != "undecided"
    # Given on the object: the object's wins, and nothing is measured.
    obj = te.select(te_params(probe={"fused_attn_graph": False}))
    assert not any(k.startswith("probe") for k in obj.provenance), obj.provenance
    assert obj.status("FusedAttention") == "declined"
    assert "FU.40" in obj.explain()
