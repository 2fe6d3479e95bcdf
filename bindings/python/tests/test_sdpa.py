"""attn_policy.sdpa on the CPU: tensors explained *as if* on a GPU (sm and cudnn passed), the
process state monkeypatched. With PyTorch installed the tensors are real (meta-device, so no
memory); without it (CI installs no torch) a minimal stand-in module supplies the handful of
attributes explain_sdpa reads. The H200 parity test is tests/gpu/test_sdpa_parity.py."""

import sys
import types
from pathlib import Path

import pytest

from attn_policy import PolicyError

CORPUS = Path(__file__).resolve().parents[3] / "tests/corpora/torch-2.11-sdpa-corpus-a.jsonl.gz"

try:  # a real PyTorch, when the environment has one
    import torch as _real_torch  # noqa: F401

    REAL = True
except ImportError:
    REAL = False


# ---- a stand-in for the few torch attributes explain_sdpa reads ---------------------------


class _Dtype:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


class _Device:
    def __init__(self, type_):
        self.type = type_

    def __str__(self):
        return self.type


class _Tensor:
    """Metadata only: shape, strides, dtype, requires_grad."""

    def __init__(self, shape, dtype, strides=None, requires_grad=False):
        self.shape = tuple(shape)
        self.dtype = dtype
        if strides is None:
            strides, acc = [], 1
            for s in reversed(self.shape):
                strides.insert(0, acc)
                acc *= max(s, 1)
        self._strides = tuple(strides)
        self.requires_grad = requires_grad
        self.is_nested = False
        self.layout = _STRIDED
        self.device = _Device("cpu")

    def dim(self):
        return len(self.shape)

    def size(self, d):
        return self.shape[d]

    def stride(self, d):
        return self._strides[d]

    def transpose(self, a, b):
        shape, strides = list(self.shape), list(self._strides)
        shape[a], shape[b] = shape[b], shape[a]
        strides[a], strides[b] = strides[b], strides[a]
        return _Tensor(shape, self.dtype, strides, self.requires_grad)

    def every_other_last(self):
        """x[..., ::2] of a tensor twice as wide in its last dimension."""
        shape = list(self.shape)
        shape[-1] //= 2
        strides = list(self._strides)
        strides[-1] *= 2
        return _Tensor(shape, self.dtype, strides, self.requires_grad)


_STRIDED = object()


def _fake_torch():
    t = types.ModuleType("torch")
    t.__version__ = "2.11.0+fake"
    for name in ("float16", "bfloat16", "float32", "float64", "bool", "int32"):
        setattr(t, name, _Dtype(name))
    t.strided = _STRIDED
    state = {"flash": True, "mem_efficient": True, "math": True, "cudnn": True, "grad": True}
    t._state = state
    cuda_backend = types.SimpleNamespace(
        flash_sdp_enabled=lambda: state["flash"],
        mem_efficient_sdp_enabled=lambda: state["mem_efficient"],
        math_sdp_enabled=lambda: state["math"],
        cudnn_sdp_enabled=lambda: state["cudnn"],
    )
    cudnn_backend = types.SimpleNamespace(is_available=lambda: False, version=lambda: None)
    t.backends = types.SimpleNamespace(cuda=cuda_backend, cudnn=cudnn_backend)
    t._C = types.SimpleNamespace()
    t.is_grad_enabled = lambda: state["grad"]
    t.are_deterministic_algorithms_enabled = lambda: False
    t.is_deterministic_algorithms_warn_only_enabled = lambda: False
    functional = types.ModuleType("torch.nn.functional")
    functional.scaled_dot_product_attention = lambda *a, **kw: "ran"
    t.nn = types.SimpleNamespace(functional=functional)
    return t


@pytest.fixture
def torch(monkeypatch):
    if REAL:
        import torch as real

        yield real
        for name in ("flash", "mem_efficient", "math", "cudnn"):
            getattr(real.backends.cuda, f"enable_{name}_sdp")(True)
        return
    fake = _fake_torch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    yield fake


def tensor(torch, shape, dtype, layout="bhsd", requires_grad=False):
    """A [b, h, s, d] tensor in a corpus layout: bhsd, bshd_view, noncontig_lastdim."""
    b, h, s, d = shape
    if REAL:
        meta = dict(dtype=dtype, device="meta")
        if layout == "bshd_view":
            x = torch.empty(b, s, h, d, **meta).transpose(1, 2)
        elif layout == "noncontig_lastdim":
            x = torch.empty(b, h, s, 2 * d, **meta)[..., ::2]
        else:
            x = torch.empty(b, h, s, d, **meta)
        return x.requires_grad_(requires_grad) if dtype.is_floating_point else x
    if layout == "bshd_view":
        x = _Tensor((b, s, h, d), dtype).transpose(1, 2)
    elif layout == "noncontig_lastdim":
        x = _Tensor((b, h, s, 2 * d), dtype).every_other_last()
    else:
        x = _Tensor((b, h, s, d), dtype)
    x.requires_grad = requires_grad
    return x


DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


def from_record(torch, config):
    """q, k, v, mask and SDPA arguments of a corpus record's config (README.torch.md)."""
    dt = getattr(torch, DTYPES[config["dtype"]])
    b, hq, hkv = config["batch"], config["heads_q"], config["heads_kv"]
    sq, skv = config["seqlen_q"], config["seqlen_kv"]
    dqk, dv, lay, rg = config["head_dim_qk"], config["head_dim_v"], config["layout"], config["requires_grad"]
    q = tensor(torch, (b, hq, sq, dqk), dt, lay, rg)
    k = tensor(torch, (b, hkv, skv, dqk), dt, lay, rg)
    v = tensor(torch, (b, hkv, skv, dv), dt, lay, rg)
    kind = config["attn_mask"]
    mask = None
    if kind == "bool":
        mask = tensor(torch, (b, hq, sq, skv), torch.bool)
    elif kind == "bool_bcast":
        mask = tensor(torch, (1, 1, sq, skv), torch.bool)
    elif kind == "float":
        mask = tensor(torch, (b, 1, sq, skv), dt)
    return q, k, v, mask


@pytest.fixture(scope="module")
def records():
    from conftest import read_corpus

    return read_corpus(CORPUS, 300)


def test_corpus_records_decide_as_pytorch_did(torch, records):
    from attn_policy.sdpa import explain_sdpa

    seen = set()
    for rec in records:
        c = rec["config"]
        q, k, v, mask = from_record(torch, c)
        d = explain_sdpa(
            q, k, v, attn_mask=mask, dropout_p=c["dropout_p"], is_causal=c["is_causal"],
            scale=c["scale"], enable_gqa=c["enable_gqa"], sm=rec["torch"]["sm"],
            cudnn=rec["torch"]["cudnn"],
            # the corpus ran under use_deterministic_algorithms(deterministic, warn_only=True)
            deterministic=c["deterministic"], deterministic_warn_only=True,
        )
        assert d.selected == rec["choice"], (c, d.explain())
        for b, ok in rec["eligible"].items():
            assert d.eligible(b) == ok, (b, c, d.explain())
        seen.add(rec["choice"])
    assert seen == {"flash", "efficient", "cudnn", "math"}


def test_reads_layout_mask_and_grad_from_the_tensors(torch):
    from attn_policy.sdpa import explain_sdpa

    q = tensor(torch, (2, 8, 128, 64), torch.float16, "noncontig_lastdim", requires_grad=True)
    k = tensor(torch, (2, 8, 128, 64), torch.float16)
    mask = tensor(torch, (1, 1, 128, 128), torch.bool)
    d = explain_sdpa(q, k, k, attn_mask=mask, sm=90, cudnn="9.19.0")
    assert d.facts["stride_last_q"] == 2 and d.facts["stride_last_k"] == 1
    assert d.facts["requires_grad"] is True
    assert d.facts["attn_mask"] == {"dtype": "bool", "shape": [1, 1, 128, 128], "stride_last": 1, "requires_grad": False}
    assert d.selected == "math"
    first = d.first_reasons()
    assert first == {"flash": "flash.mask", "efficient": "efficient.stride", "cudnn": "cudnn.stride"}
    # every reason of a backend, in PyTorch's order, with the values it read
    r = d.reasons("flash")
    assert [x["id"] for x in r] == ["flash.mask", "flash.stride"]
    assert r[1]["values"]["stride_last_q"] == 2
    assert "cudnn" in d.explain()


def test_gqa_head_dim_512_on_hopper_is_math_only(torch):
    from attn_policy.sdpa import explain_sdpa

    q = tensor(torch, (1, 32, 1024, 512), torch.bfloat16)
    kv = tensor(torch, (1, 8, 1024, 512), torch.bfloat16)
    d = explain_sdpa(q, kv, kv, is_causal=True, enable_gqa=True, sm=(9, 0), cudnn=91900)
    assert d.selected == "math" and d.sdp_backend == "MATH"
    assert d.first_reasons() == {
        "flash": "flash.head_dim",
        "efficient": "efficient.heads",
        "cudnn": "cudnn.head_dim_limit",
    }


def test_process_flags_are_read(torch, monkeypatch):
    from attn_policy.sdpa import explain_sdpa

    q = tensor(torch, (1, 8, 256, 128), torch.float16)
    assert explain_sdpa(q, q, q, sm=90, cudnn=91900).selected == "cudnn"
    if REAL:
        torch.backends.cuda.enable_cudnn_sdp(False)
    else:
        monkeypatch.setitem(torch._state, "cudnn", False)
    d = explain_sdpa(q, q, q, sm=90, cudnn=91900)
    assert d.selected == "flash"
    assert d.decision.status("cudnn") == "disabled"
    # the same GPU without cuDNN's preference (cuDNN 9.15.0): flash first anyway
    assert explain_sdpa(q, q, q, sm=90, cudnn="9.15.0").selected == "flash"
    # overrides set any fact
    d = explain_sdpa(q, q, q, sm=90, cudnn=91900, flash_sdp_enabled=False)
    assert d.selected == "efficient"
    monkeypatch.setenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1")
    d = explain_sdpa(q, q, q, sm=90, cudnn=91900, cudnn_sdp_enabled=True, flash_sdp_enabled=False)
    assert d.decision.to_dict()["preference"]["id"] == "default"
    assert d.selected == "efficient"


def test_grad_mode_and_architecture(torch, monkeypatch):
    from attn_policy.sdpa import explain_sdpa

    q = tensor(torch, (1, 4, 64, 200), torch.float16, requires_grad=True)
    d = explain_sdpa(q, q, q, sm=86, cudnn=91900)
    assert d.first_reasons()["flash"] == "flash.train_head_dim"
    if REAL:
        with torch.no_grad():
            d = explain_sdpa(q, q, q, sm=86, cudnn=91900)
    else:
        monkeypatch.setitem(torch._state, "grad", False)
        d = explain_sdpa(q, q, q, sm=86, cudnn=91900)
    assert d.eligible("flash")


def test_inputs_the_pack_does_not_model_are_refused(torch):
    from attn_policy.sdpa import SdpaError, explain_sdpa

    q = tensor(torch, (1, 4, 64, 64), torch.float16)
    with pytest.raises(SdpaError, match="not a CUDA device"):
        explain_sdpa(q, q, q)
    assert issubclass(SdpaError, PolicyError)
    with pytest.raises(SdpaError, match="CausalBias"):
        explain_sdpa(q, q, q, attn_mask=object(), sm=90, cudnn=91900)
    with pytest.raises(PolicyError, match="invalid config"):
        explain_sdpa(q, q, q, sm=90, cudnn=91900, heads_kv=0)


def test_arguments_sdpa_would_refuse_are_refused_naming_them(torch):
    # A list failed with "'list' object has no attribute 'dim'" (an AttributeError, which
    # log_sdpa_decisions let escape instead of leaving the refusal to SDPA); a str is_causal
    # was read by its truth value ("no" as causal).
    from attn_policy.sdpa import SdpaError, explain_sdpa

    q = tensor(torch, (1, 4, 64, 64), torch.float16)
    with pytest.raises(SdpaError, match="key must be a torch.Tensor; found list"):
        explain_sdpa(q, [1.0], q, sm=90, cudnn=91900)
    with pytest.raises(SdpaError, match="is_causal must be True or False; found str 'no'"):
        explain_sdpa(q, q, q, is_causal="no", sm=90, cudnn=91900)
    with pytest.raises(SdpaError, match="enable_gqa must be True or False; found NoneType"):
        explain_sdpa(q, q, q, enable_gqa=None, sm=90, cudnn=91900)
    with pytest.raises(SdpaError, match="dropout_p must be a float; found str '0.5'"):
        explain_sdpa(q, q, q, dropout_p="0.5", sm=90, cudnn=91900)
    assert explain_sdpa(q, q, q, is_causal=1, dropout_p=0, sm=90, cudnn=91900).facts["is_causal"] is True


def test_log_sdpa_decisions_explains_each_call_and_runs_it(torch, caplog):
    from attn_policy.sdpa import log_sdpa_decisions

    F = torch.nn.functional
    original = F.scaled_dot_product_attention
    if REAL:
        q = torch.randn(1, 2, 8, 16, dtype=torch.float32)
    else:
        q = tensor(torch, (1, 2, 8, 16), torch.float32)
    with caplog.at_level("INFO", logger="attn_policy.sdpa"):
        with log_sdpa_decisions(sm=90, cudnn=91900) as calls:
            out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
            F.scaled_dot_product_attention(q, q, q, enable_gqa=True)
    assert F.scaled_dot_product_attention is original
    assert out is not None
    assert [c.selected for c in calls] == ["efficient", "efficient"]
    assert calls[0].facts["is_causal"] is True and calls[1].facts["enable_gqa"] is True
    assert "SDPA -> efficient" in caplog.text and "flash: flash.dtype" in caplog.text
