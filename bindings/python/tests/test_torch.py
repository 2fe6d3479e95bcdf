"""attn_policy.torch on CPU tensors: the same Python code the GPU runs, through the float64
reference. Skipped where torch is not installed."""

import logging
import math
import os
import re
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import attn_policy  # noqa: E402
import attn_policy.torch as apt  # noqa: E402


def oracle(q, k, v, *, causal=False, bottom_right=False, window=None, scale=None):
    """Float64 attention on bhsd tensors, written independently of the package: explicit
    (query, key) admissibility; rows with no admissible key give 0."""
    q, k, v = (t.double() for t in (q, k, v))
    b, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = q @ k.transpose(-1, -2) * scale
    off = skv - sq if bottom_right else 0
    left, right = (-1, -1) if window is None else window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    allowed = torch.ones(sq, skv, dtype=torch.bool)
    for i in range(sq):
        for j in range(skv):
            c = i + off
            if left >= 0 and j < c - left:
                allowed[i, j] = False
            if right >= 0 and j > c + right:
                allowed[i, j] = False
    s = s.masked_fill(~allowed, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)
    denom = p.sum(-1, keepdim=True)
    p = torch.where(denom > 0, p / denom.clamp_min(1e-300), torch.zeros_like(p))
    return p @ v


def to_layout(t, layout):
    """A bhsd tensor as a `layout` tensor (a view where possible: strides differ per layout)."""
    if layout == "bhsd":
        return t
    if layout == "bshd":
        return t.transpose(1, 2).contiguous()
    return t.permute(2, 0, 1, 3).contiguous()


def from_layout(t, layout):
    if layout == "bhsd":
        return t
    if layout == "bshd":
        return t.transpose(1, 2)
    return t.permute(1, 2, 0, 3)


CASES = [
    # (b, hq, hkv, sq, skv, d, causal, bottom_right, window)
    (2, 4, 2, 7, 7, 16, False, False, None),  # GQA, no mask
    (1, 4, 1, 6, 10, 8, True, False, None),  # MQA, causal top-left, rectangular
    (1, 2, 2, 6, 10, 8, True, True, None),  # causal bottom-right (KV-cache style)
    (1, 2, 2, 9, 5, 8, True, True, None),  # bottom-right, s_q > s_kv: empty first rows
    (2, 4, 2, 8, 8, 16, True, False, (3, 0)),  # sliding window, causal
    (1, 2, 1, 5, 11, 8, False, True, (2, 1)),  # window around the bottom-right diagonal
    (1, 2, 2, 1, 9, 8, True, True, None),  # decoding: one query row
    # One-sided windows without causality: TE's window check takes both sides bounded, so the
    # decision states the open side as s_q + s_kv (the executors still get -1).
    (1, 2, 1, 6, 9, 8, False, False, (-1, 2)),
    (1, 2, 2, 7, 5, 8, False, True, (1, -1)),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("layout", ["bhsd", "bshd", "sbhd"])
def test_forward_and_backward_match_float64(case, layout):
    b, hq, hkv, sq, skv, d, causal, br, window = case
    g = torch.Generator().manual_seed(hash((case, layout)) % 2**31)
    qb = torch.randn(b, hq, sq, d, dtype=torch.float64, generator=g)
    kb = torch.randn(b, hkv, skv, d, dtype=torch.float64, generator=g)
    vb = torch.randn(b, hkv, skv, d, dtype=torch.float64, generator=g)
    q, k, v = (to_layout(t, layout).detach().clone().requires_grad_(True) for t in (qb, kb, vb))
    o = apt.attention(
        q, k, v, layout=layout, is_causal=causal, diagonal="bottom_right" if br else "top_left", window=window
    )
    assert o.shape == (*q.shape[:-1], d)
    qr, kr, vr = (t.detach().clone().requires_grad_(True) for t in (qb, kb, vb))
    want = oracle(qr, kr, vr, causal=causal, bottom_right=br, window=window)
    torch.testing.assert_close(from_layout(o, layout), want, atol=1e-12, rtol=1e-12)
    do = torch.randn(want.shape, dtype=torch.float64, generator=g)
    (from_layout(o, layout) * do).sum().backward()
    (want * do).sum().backward()
    for got, ref in ((q.grad, qr.grad), (k.grad, kr.grad), (v.grad, vr.grad)):
        torch.testing.assert_close(from_layout(got, layout), ref, atol=1e-11, rtol=1e-11)


def test_strided_views_of_a_packed_tensor_are_read_in_place():
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(2, 6, 3, 4, 8, dtype=torch.float64, generator=g)  # [b, s, 3, h, d]
    q, k, v = (qkv[:, :, i] for i in range(3))  # bshd views, seq stride 3*h*d
    assert not q.is_contiguous()
    o = apt.attention(q, k, v, layout="bshd", is_causal=True)
    want = oracle(*(t.transpose(1, 2) for t in (q, k, v)), causal=True)
    torch.testing.assert_close(o.transpose(1, 2), want, atol=1e-12, rtol=1e-12)


def test_bf16_meets_the_flash_attention_criterion_against_float64():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 4, 64, 32, generator=g).to(torch.bfloat16) for _ in range(3))
    o = apt.attention(q, k, v, is_causal=True)
    exact = oracle(q, k, v, causal=True)
    # naive same-dtype attention: every stored intermediate in bf16
    s = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(32))
    s = s.masked_fill(torch.ones(64, 64, dtype=torch.bool).triu(1), float("-inf"))
    naive = torch.softmax(s.float(), -1).to(torch.bfloat16) @ v
    err = (o.double() - exact).abs().max().item()
    naive_err = (naive.double() - exact).abs().max().item()
    assert err <= 2 * naive_err, (err, naive_err)


def test_gradcheck_in_float64_on_tiny_shapes():
    g = torch.Generator().manual_seed(7)
    for causal, br, window in [(False, False, None), (True, True, None), (True, False, (2, 0))]:
        q = torch.randn(1, 2, 3, 4, dtype=torch.float64, generator=g, requires_grad=True)
        k = torch.randn(1, 1, 5, 4, dtype=torch.float64, generator=g, requires_grad=True)
        v = torch.randn(1, 1, 5, 4, dtype=torch.float64, generator=g, requires_grad=True)
        f = lambda q, k, v: apt.attention(  # noqa: E731
            q, k, v, is_causal=causal, diagonal="bottom_right" if br else "top_left", window=window
        )
        assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-6, atol=1e-8)


def test_opcheck_passes():
    g = torch.Generator().manual_seed(11)
    q = torch.randn(1, 2, 4, 8, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(1, 1, 6, 8, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(1, 1, 6, 8, dtype=torch.float64, generator=g, requires_grad=True)
    # layout bhsd, causal bottom-right, no window, scale, no dropout, training, te, raise
    args = (q, k, v, 0, 2, -1, 0, True, 0.35, 0.0, True, 0, 0, False)
    torch.library.opcheck(torch.ops.attn_policy.attention.default, args)


class TinyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 3 * 16, dtype=torch.float64)
        self.out = torch.nn.Linear(16, 16, dtype=torch.float64)

    def forward(self, x):  # x: [b, s, 16]
        b, s, _ = x.shape
        q, k, v = self.proj(x).view(b, s, 3, 2, 8).unbind(2)
        o = apt.attention(q, k, v, layout="bshd", is_causal=True)
        return self.out(o.reshape(b, s, 16))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_traces_the_op(backend):
    if backend == "inductor" and shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("inductor on CPU needs a C compiler")
    torch.manual_seed(0)
    m = TinyModel()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    want = m(x)
    torch._dynamo.reset()
    cm = torch.compile(m, fullgraph=True, backend=backend)
    got = cm(x)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    got.sum().backward()  # the registered backward runs inside the compiled graph


def test_decision_names_the_pack_backend_executor_and_substitutes():
    q = torch.randn(1, 2, 4, 8, dtype=torch.float32)
    o, d = apt.attention(q, q, q, is_causal=True, return_decision=True)
    assert d.pack == "te"
    assert d.backend is not None
    assert d.executor == "reference"
    chain = d.to_dict()["executor_chain"]
    assert chain[-1] == {"executor": "reference", "outcome": "ran", "reason": None}
    # On the CPU every GPU entry before the reference is unavailable, with its reason.
    for e in chain[:-1]:
        assert e["outcome"] in ("unavailable", "refused") and e["reason"], e
    assert d.substitute == (len(chain) > 1)
    if d.substitute:
        assert "substitute" in d.summary()
    assert "deterministic" in d.provenance


def test_no_substitute_turns_a_substitution_into_an_error():
    q = torch.randn(1, 2, 4, 8, dtype=torch.float32)
    _, d = apt.attention(q, q, q, return_decision=True)
    if not d.substitute:
        pytest.skip("the backend's first executor ran here")
    with pytest.raises(apt.SubstitutionRefused, match="substitution refused"):
        apt.attention(q, q, q, no_substitute=True)


def test_dropout_is_declined_with_reasons_and_fallback_logs(caplog):
    q = torch.randn(1, 2, 4, 8, dtype=torch.float32)
    with pytest.raises(apt.AttentionDeclined) as e:
        apt.attention(q, q, q, dropout_p=0.1)
    assert "dropout" in str(e.value)
    with caplog.at_level(logging.WARNING, logger="attn_policy.torch"):
        o, d = apt.attention(q, q, q, dropout_p=0.1, on_decline="fallback", return_decision=True)
    assert o.shape == q.shape
    assert d.fallback and "dropout" in d.fallback
    assert any("falling back to torch SDPA" in r.message for r in caplog.records)


def test_bad_arguments_are_policy_errors():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(attn_policy.PolicyError, match="layout"):
        apt.attention(q, q, q, layout="bsh")
    with pytest.raises(attn_policy.PolicyError, match="diagonal"):
        apt.attention(q, q, q, diagonal="middle")
    with pytest.raises(attn_policy.PolicyError, match="4-D"):
        apt.attention(q[0], q[0], q[0])
    with pytest.raises(ValueError, match="heads_q"):
        apt.attention(q, q[:, :1].expand(1, 3, 4, 8).contiguous(), q[:, :1].expand(1, 3, 4, 8).contiguous())


def test_cached_signature_is_a_hit():
    apt.clear_cache()
    q = torch.randn(1, 2, 4, 8)
    apt.attention(q, q, q)
    apt.attention(torch.randn(1, 2, 4, 8), q, q)
    info = apt.cache_info()
    assert info["misses"] == 1 and info["hits"] >= 1


def test_dot_product_attention_module_mirrors_te():
    torch.manual_seed(1)
    s, b, h, g, d = 6, 2, 4, 2, 8
    m = apt.DotProductAttention(h, d, num_gqa_groups=g, qkv_format="sbhd", attn_mask_type="causal", window_size=(2, 0))
    q = torch.randn(s, b, h, d, dtype=torch.float64)
    k = torch.randn(s, b, g, d, dtype=torch.float64)
    v = torch.randn(s, b, g, d, dtype=torch.float64)
    out = m(q, k, v)
    assert out.shape == (s, b, h * d)
    want = oracle(*(t.permute(1, 2, 0, 3) for t in (q, k, v)), causal=True, window=(2, 0))
    torch.testing.assert_close(out.view(s, b, h, d).permute(1, 2, 0, 3), want, atol=1e-12, rtol=1e-12)
    with pytest.raises(attn_policy.PolicyError, match="padding"):
        m(q, k, v, attn_mask_type="padding")
    with pytest.raises(attn_policy.PolicyError, match="not supported here"):
        apt.DotProductAttention(h, d, fp8=True)


def test_dot_product_attention_refuses_what_te_refuses():
    # Each was taken before: a str head count, an unknown mask kind until the first forward,
    # and tensors with other heads or head dims than the module's (run with the tensors' own).
    for kw, fragment in [(dict(num_attention_heads="8", kv_channels=8), "num_attention_heads must be an int > 0; found '8'"),
                         (dict(num_attention_heads=4, kv_channels=0), "kv_channels must be an int > 0"),
                         (dict(num_attention_heads=4, kv_channels=(8, 8, 8)), "kv_channels must be an int > 0"),
                         (dict(num_attention_heads=4, kv_channels=8, num_gqa_groups=0), "num_gqa_groups must be"),
                         (dict(num_attention_heads=4, kv_channels=8, num_gqa_groups=3), "not a multiple of num_gqa_groups"),
                         (dict(num_attention_heads=4, kv_channels=8, attn_mask_type="casual"), "attn_mask_type 'casual'")]:
        with pytest.raises(attn_policy.PolicyError, match=re.escape(fragment)):
            apt.DotProductAttention(**kw)
    m = apt.DotProductAttention(4, 8, num_gqa_groups=2, qkv_format="bshd")
    q, kv = torch.randn(1, 6, 4, 8), torch.randn(1, 6, 2, 8)
    assert m(q, kv, kv).shape == (1, 6, 32)
    with pytest.raises(apt.InvalidInput, match=r"query_layer has 3 heads of dim 8 .*built for 4 heads of dim 8"):
        m(torch.randn(1, 6, 3, 8), kv, kv)
    with pytest.raises(apt.InvalidInput, match=r"key_layer has 4 heads of dim 8 .*built for 2 heads of dim 8"):
        m(q, q, kv)
    with pytest.raises(apt.InvalidInput, match=r"value_layer has 2 heads of dim 16"):
        m(q, kv, torch.randn(1, 6, 2, 16))
    mla = apt.DotProductAttention(2, (16, 8), qkv_format="bhsd")
    assert mla(torch.randn(1, 2, 4, 16), torch.randn(1, 2, 4, 16), torch.randn(1, 2, 4, 8)).shape == (1, 2, 4, 8)


def test_executors_list_every_executor_with_availability():
    names = {e["name"]: e for e in apt.executors()}
    assert set(names) >= {"reference", "chunked", "fused", "cudnn", "frost", "torch_flash", "torch_efficient", "torch_cudnn", "torch_math"}
    assert names["reference"]["availability"] == "available"
    assert names["torch_math"]["availability"] == "available"
    for n, e in names.items():
        if e["availability"] == "unavailable":
            assert e["reason"], n
    if not torch.cuda.is_available():
        # Wired, and unavailable here only for want of a GPU.
        for n in ("torch_flash", "torch_efficient", "torch_cudnn"):
            assert names[n]["availability"] == "unavailable" and "CUDA device" in names[n]["reason"], names[n]


def rules_te():
    """rules/te of the checkout: ``ATTN_POLICY_REPO``, else the working directory, else this
    file's repository. The GPU runner scripts carry these tests away from the checkout, so the
    file's own location is the last guess, not the only one."""
    bases = [Path(os.environ["ATTN_POLICY_REPO"])] if os.environ.get("ATTN_POLICY_REPO") else []
    for base in bases + [Path.cwd(), Path(__file__).resolve().parents[3]]:
        if (base / "rules" / "te" / "pack.yaml").is_file():
            return base / "rules" / "te"
    raise FileNotFoundError("rules/te not found: run from the repository root or set ATTN_POLICY_REPO")


def pack_with_chains(tmp_path, chains):
    """A copy of the te pack whose `executors:` chains are ``chains`` (backend -> names)."""
    dst = tmp_path / "te"
    shutil.copytree(rules_te(), dst)
    text = (dst / "pack.yaml").read_text()
    head = text[: text.index("\nexecutors:")]
    body = "".join(f"  - backend: {b}\n    chain: [{', '.join(c)}]\n" for b, c in chains.items())
    (dst / "pack.yaml").write_text(head + "\nexecutors:\n" + body)
    return attn_policy.Policy.load(str(dst))


def test_chains_are_the_packs_data(tmp_path):
    te_pack = attn_policy.Policy.load("te")
    assert apt.executor_chain("te", "FusedAttention") == ("cudnn", "chunked", "reference")
    assert apt.executor_chain(None, "FlashAttention") == ("torch_flash", "cudnn", "chunked", "reference")
    # The declared chain; `fused` is `if_admitted` (in the chain that runs a decision only where
    # its manifest admits it: SM90, head dims 264..512, ...).
    assert apt.executor_chain(te_pack, "UnfusedDotProductAttention") == ("fused", "chunked", "reference")
    assert apt.executor_chain("native", "cudnn") == ("cudnn", "chunked", "reference")
    # A bare ValueError and an AttributeError before.
    with pytest.raises(attn_policy.PolicyError, match=r'pack te has no backend "Fused" \(backends: FlashAttention, '):
        apt.executor_chain("te", "Fused")
    with pytest.raises(attn_policy.PolicyError, match=r'backend FlashAttention has no variant "FA5" \(variants: FA4, FA3, FA2'):
        apt.executor_chain("te", "FlashAttention", "FA5")
    with pytest.raises(TypeError, match="policy must be an attn_policy.Policy, a pack name or None; found int"):
        apt.executor_chain(3, "FusedAttention")
    q = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    _, d = apt.attention(q, q, q, is_causal=True, return_decision=True)
    assert d.backend == "UnfusedDotProductAttention", d.summary()
    # The chain that ran is the declared one without `fused`, which does not admit head dim 8
    # (nor a CPU tensor): it is left out, not refused, so `chunked` is the own executor.
    assert [e.executor for e in d.chain] == ["chunked", "reference"]
    assert [e.executor for e in d.chain] == list(d.decision._d.executor_chain)
    # Another pack's data, another chain: the same call now runs on torch_math, first entry.
    chains = {
        "FlashAttention": ["torch_flash", "reference"],
        "FusedAttention": ["cudnn", "reference"],
        "FrostAttention": ["frost", "reference"],
        "UnfusedDotProductAttention": ["torch_math", "reference"],
    }
    mine = pack_with_chains(tmp_path, chains)
    o, d = apt.attention(q, q, q, is_causal=True, policy=mine, return_decision=True)
    assert d.backend == "UnfusedDotProductAttention", d.summary()
    assert [(e.executor, e.outcome) for e in d.chain] == [("torch_math", "ran"), ("reference", "not_tried")]
    assert not d.substitute
    torch.testing.assert_close(o, oracle(q, q, q, causal=True), atol=1e-12, rtol=1e-12)


def test_a_chain_naming_an_unknown_executor_does_not_load(tmp_path):
    with pytest.raises(attn_policy.PolicyError) as e:
        pack_with_chains(tmp_path, {"FusedAttention": ["cudnn", "no_such_executor"]})
    assert "no_such_executor" in str(e.value) and "pack.yaml" in str(e.value)


def test_frost_is_unavailable_in_python_with_the_precise_reason(tmp_path):
    mine = pack_with_chains(tmp_path, {"UnfusedDotProductAttention": ["frost", "reference"]})
    q = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    _, d = apt.attention(q, q, q, is_causal=True, policy=mine, return_decision=True)
    frost = d.chain[0]
    assert frost.executor == "frost" and frost.outcome == "unavailable"
    assert "not in this wheel" in frost.reason and "CUDA device" in frost.reason, frost.reason
    assert d.executor == "reference" and d.substitute
    # What else would decline it, from the frontend's and CuTe DSL's versions and the manifest.
    qb = torch.randn(1, 4, 8, 512, dtype=torch.bfloat16)
    why = apt._frost_unavailable(apt._Call(qb, qb, qb, 0, 1, -1, 0, False, 0.05, 0.0, True))
    assert "nvidia-cudnn-frontend" in why and "nvidia-cutlass-dsl" in why, why


def test_the_te_drop_in_probes_with_the_same_code():
    from attn_policy import te

    te.clear_environment()
    te.reprobe()
    import types

    p = types.SimpleNamespace(
        qkv_type="Tensor", qkv_dtype="bf16", qkv_layout="bshd_bshd_bshd", batch_size=2, num_heads=8,
        num_gqa_groups=8, max_seqlen_q=256, max_seqlen_kv=256, head_dim_qk=128, head_dim_v=128,
        attn_mask_type="causal", window_size=(-1, 0),
    )
    d = te.select(p)
    prov = d.provenance
    # torch is installed here: whether a GPU is present was measured.
    assert prov["probe.cuda_device"] == "probe"
    if not torch.cuda.is_available():
        assert prov["probe.fused_attn_graph"] == "default"
        assert d.status("FusedAttention") == "undecided"


@pytest.mark.parametrize("node", ["python", "cpp"])
def test_eager_calls_skip_the_dispatcher_and_equal_the_op(eager_node_mode, node):
    from torch.utils._python_dispatch import TorchDispatchMode

    if node == "cpp" and apt.eager_node.compiler() is None:
        pytest.skip("no C++ compiler ($CXX, c++, g++) for the C++ eager node")
    eager_node_mode(node)

    g = torch.Generator().manual_seed(23)
    q, k, v = (torch.randn(1, 4, 6, 8, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(3))
    do = torch.randn(1, 4, 6, 8, dtype=torch.float64, generator=g)
    apt.clear_cache()
    apt.attention(q, k, v, is_causal=True, window=(2, 0))  # decided and planned

    def op_events(f):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            out = f()
        return out, [e.key for e in prof.key_averages() if "attn_policy::" in e.key]

    o, seen = op_events(lambda: apt.attention(q, k, v, is_causal=True, window=(2, 0)))
    assert seen == [], seen
    assert (type(o.grad_fn).__name__ == "_EagerBackward") == (node == "python"), type(o.grad_fn)
    args = (0, 1, 2, 0, False, 1 / math.sqrt(8), 0.0, True, 0, 0, False)
    (o_op, _), seen = op_events(lambda: torch.ops.attn_policy.attention(q, k, v, *args))
    assert "attn_policy::attention" in seen, seen  # the check above can see the op
    assert torch.equal(o, o_op)
    ga = torch.autograd.grad(o, (q, k, v), do)
    gb = torch.autograd.grad(o_op, (q, k, v), do)
    for a, b in zip(ga, gb):
        assert torch.equal(a, b)
    # Without grad: the same O.
    with torch.no_grad():
        assert torch.equal(apt.attention(q, k, v, is_causal=True, window=(2, 0)), o)

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    # Under a dispatch mode the call is the op, so the mode sees it.
    with Ops() as mode:
        o_mode = apt.attention(q.detach(), k.detach(), v.detach(), is_causal=True, window=(2, 0))
    assert "attn_policy.attention.default" in mode.names, mode.names
    assert torch.equal(o_mode, o.detach())


def test_eager_path_checks_inputs_like_the_op():
    q = torch.randn(1, 2, 4, 8, dtype=torch.float64)
    apt.attention(q, q, q)
    with pytest.raises(attn_policy.PolicyError, match="one dtype"):
        apt.attention(q, q.float(), q.float())
    # A strided (non-contiguous head dim) view is copied first, every call.
    t = torch.randn(1, 2, 8, 4, dtype=torch.float64).transpose(-1, -2)
    assert t.stride()[-1] != 1
    for _ in range(2):
        torch.testing.assert_close(apt.attention(t, t, t), oracle(t, t, t), atol=1e-12, rtol=1e-12)


def test_gradients_of_strided_views_keep_their_strides():
    g = torch.Generator().manual_seed(13)
    qkv = torch.randn(2, 6, 3, 4, 8, dtype=torch.float64, generator=g, requires_grad=True)
    q, k, v = qkv.unbind(2)
    o = apt.attention(q, k, v, layout="bshd", is_causal=True)
    do = torch.randn(o.shape, dtype=torch.float64, generator=g)
    (o * do).sum().backward()
    ref = qkv.detach().clone().requires_grad_(True)
    want = oracle(*(t.transpose(1, 2) for t in ref.unbind(2)), causal=True)
    (want * do.transpose(1, 2)).sum().backward()
    torch.testing.assert_close(qkv.grad, ref.grad, atol=1e-11, rtol=1e-11)


def test_gradient_checkpointing_through_the_op():
    from torch.utils.checkpoint import checkpoint

    g = torch.Generator().manual_seed(17)
    q, k, v = (torch.randn(1, 4, 6, 8, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(3))
    f = lambda q, k, v: apt.attention(q, k, v, is_causal=True, window=(3, 0)).square().sum()  # noqa: E731
    def grads(loss):
        for t in (q, k, v):
            t.grad = None
        loss.backward()
        return [t.grad.clone() for t in (q, k, v)]

    plain = grads(f(q, k, v))
    for reentrant in (False, True):
        ck = grads(checkpoint(f, q, k, v, use_reentrant=reentrant))
        for a, b in zip(plain, ck):
            torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_concurrent_calls_from_threads_agree():
    import concurrent.futures

    apt.clear_cache()
    g = torch.Generator().manual_seed(19)
    inputs = [
        tuple(torch.randn(1, 2, 5 + i % 3, 8, dtype=torch.float64, generator=g) for _ in range(3)) for i in range(12)
    ]
    want = [oracle(q, k, v, causal=True) for q, k, v in inputs]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda t: apt.attention(*t, is_causal=True), inputs))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    assert apt.cache_info()["entries"] == 3


def test_double_backward_is_refused_clearly(eager_node_mode):
    eager_node_mode("python")  # the C++ node's refusal: test_eager_node.py
    q, k, v = (torch.randn(1, 2, 4, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    o = apt.attention(q, k, v, is_causal=True)
    with pytest.raises(attn_policy.PolicyError, match="double backward"):
        torch.autograd.grad(o.sum(), (q, k, v), create_graph=True)
