"""attn_policy.torch on a CUDA GPU (skipped without one): numerics by the FlashAttention
criterion against float64 and torch SDPA, CUDA-graph capture/replay bitwise equal to eager,
side streams, the loaded cuDNN, and torch.compile(fullgraph=True) of a model using the op.

Run with ``-s`` to see the tables; ``GPU_SUMMARY=path`` also writes them to a file."""

import gc
import math

import pytest
from _summary import Rows

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import attn_policy.torch as apt  # noqa: E402
from attn_policy import _native  # noqa: E402

DEV = torch.device("cuda", 0)
ROWS = Rows()
note = ROWS.note



def allowed_mask(sq, skv, causal, left, device):
    """Bottom-right diagonal (s_q == s_kv here, so also top-left): causal and a left window."""
    i = torch.arange(sq, device=device).unsqueeze(1) + (skv - sq)
    j = torch.arange(skv, device=device).unsqueeze(0)
    ok = torch.ones(sq, skv, dtype=torch.bool, device=device)
    if causal:
        ok &= j <= i
    if left >= 0:
        ok &= j >= i - left
    return ok


def math_attention(q, k, v, allowed, scale, softmax_dtype):
    """Textbook attention in q's dtype (scores and probabilities stored in it), softmax in
    ``softmax_dtype``; GQA by repetition."""
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, 1)
    v = v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s.to(softmax_dtype), -1).to(q.dtype)
    return p @ v


def test_environment_and_loaded_cudnn():
    ok, detail = _native.cudnn_library()
    tv = torch.backends.cudnn.version()
    note(f"torch {torch.__version__}, torch.backends.cudnn.version() = {tv}; cudnn executor: {ok} {detail}")
    for e in apt.executors():
        note(f"  executor {e['name']:<16} {e['availability']:<11} {e.get('reason') or e.get('detail')}")
    assert ok, detail
    # The executor uses the libcudnn torch loaded: same version.
    major, minor, patch = tv // 10000, (tv // 100) % 100, tv % 100
    assert f"cuDNN {major}.{minor}.{patch}" in detail, detail
    assert "already loaded in this process" in detail, detail


def test_cudnn_version_mismatch_is_refused_naming_both():
    q = torch.randn(1, 64, 2, 64, device=DEV, dtype=torch.bfloat16)
    call = apt._Call(q, q, q, 1, 1, -1, 0, False, 0.125, 0.0, False)
    with pytest.raises(_native.ExecutorRefused) as e:
        _native.make_plan("cudnn", 0, call.problem, (9, 1, 0))
    msg = str(e.value)
    note(f"mismatch refusal: {msg}")
    assert "9.1.0" in msg and "this process has cuDNN" in msg


CASES = [
    (d, hq, hkv, mask)
    for d in (64, 128, 256, 512)
    for hq, hkv in ((16, 2), (8, 8))
    for mask in ("causal", "window")
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"d{c[0]}-h{c[1]}k{c[2]}-{c[3]}")
def test_numerics_meet_the_flash_attention_criterion(case):
    d, hq, hkv, mask = case
    b, s = 2, 1024
    left = 255 if mask == "window" else -1
    g = torch.Generator(device=DEV).manual_seed(d * 100 + hq + (mask == "window"))
    q = torch.randn(b, s, hq, d, device=DEV, generator=g).to(torch.bfloat16)
    k = torch.randn(b, s, hkv, d, device=DEV, generator=g).to(torch.bfloat16)
    v = torch.randn(b, s, hkv, d, device=DEV, generator=g).to(torch.bfloat16)
    do = torch.randn(b, s, hq, d, device=DEV, generator=g).to(torch.bfloat16)
    scale = 1 / math.sqrt(d)
    window = (left, 0) if left >= 0 else None
    qa, ka, va = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    o, dec = apt.attention(qa, ka, va, layout="bshd", is_causal=True, window=window, return_decision=True)
    o.backward(do)
    torch.cuda.synchronize()
    allowed = allowed_mask(s, s, True, left, DEV)
    bhsd = lambda t: t.transpose(1, 2)  # noqa: E731
    # float64 reference and the naive bf16 baseline, with their gradients
    q64, k64, v64 = (bhsd(t).double().requires_grad_(True) for t in (q, k, v))
    o64 = math_attention(q64, k64, v64, allowed, scale, torch.float64)
    o64.backward(bhsd(do).double())
    qn, kn, vn = (bhsd(t).detach().clone().requires_grad_(True) for t in (q, k, v))
    on = math_attention(qn, kn, vn, allowed, scale, torch.float32)
    on.backward(bhsd(do))
    # torch SDPA for context
    qs, ks, vs = (bhsd(t).detach().clone().requires_grad_(True) for t in (q, k, v))
    os_ = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, attn_mask=allowed, scale=scale, enable_gqa=hq != hkv)
    os_.backward(bhsd(do))

    def err(a, ref):
        return (a.double() - ref.double()).abs().max().item()

    rows = []
    for name, ours, naive, sdpa, ref in (
        ("o", bhsd(o), on, os_, o64),
        ("dq", bhsd(qa.grad), qn.grad, qs.grad, q64.grad),
        ("dk", bhsd(ka.grad), kn.grad, ks.grad, k64.grad),
        ("dv", bhsd(va.grad), vn.grad, vs.grad, v64.grad),
    ):
        e, en, es = err(ours, ref), err(naive, ref), err(sdpa, ref)
        rows.append((name, e, en, es, e <= 2 * en + 1e-6))
    cells = " ".join(f"{n}:{e:.2e}/{en:.2e}{'' if ok else ' FAIL'}" for n, e, en, _, ok in rows)
    sd = " ".join(f"{n}:{es:.2e}" for n, _, _, es, _ in rows)
    note(f"d{d:<4} h{hq}/{hkv:<2} {mask:<6} {dec.backend or '-':<27} {dec.executor or '-':<11} ours/naive {cells} | sdpa {sd}")
    assert dec.executor is not None, dec.summary()
    bad = [r for r in rows if not r[4]]
    assert not bad, (dec.summary(), bad)


def _step(q, k, v, do, **kw):
    o = apt.attention(q, k, v, layout="bshd", **kw)
    grads = torch.autograd.grad(o, (q, k, v), do)
    # O without its autograd graph: a graph kept alive holds AccumulateGrad nodes of q, k, v
    # made on the default stream, which a later capture's backward would then wait on (the
    # first d128 capture failed so on the H200: "would make the legacy stream depend on a
    # capturing blocking stream", with torch's AccumulateGrad stream warning).
    return (o.detach(), *grads)


@pytest.mark.parametrize("d,deterministic", [(128, False), (256, False), (512, True)])
def test_cuda_graph_replay_is_bitwise_equal_to_eager(d, deterministic):
    _graph_case(d, deterministic)


def _graph_case(d, deterministic):
    torch.use_deterministic_algorithms(deterministic)
    try:
        g = torch.Generator(device=DEV).manual_seed(d)
        b, s, hq, hkv = 2, 512, 8, 2
        q, k, v = (
            torch.randn(b, s, h, d, device=DEV, generator=g).to(torch.bfloat16).requires_grad_(True)
            for h in (hq, hkv, hkv)
        )
        do = torch.randn(b, s, hq, d, device=DEV, generator=g).to(torch.bfloat16)
        kw = dict(is_causal=True)
        o_dec, dec = apt.attention(q, k, v, layout="bshd", return_decision=True, **kw)
        # Drop that autograd graph: a live AccumulateGrad node made on the default stream would
        # make the captured backward depend on the legacy stream (torch warns about this).
        del o_dec
        note(f"cuda graph d{d} deterministic={deterministic}: {dec.summary()}")
        if dec.executor == "reference":
            # A host-copy substitute cannot be captured: the op says so instead of a CUDA error.
            with pytest.raises(Exception, match="cannot capture"):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    _step(q, k, v, do, **kw)
            pytest.skip(f"no capturable executor here: {dec.summary()}")
        eager = _step(q, k, v, do, **kw)
        again = _step(q, k, v, do, **kw)
        eager_repeatable = all(torch.equal(a, c) for a, c in zip(eager, again))
        # Fresh leaves for the capture, first used on the side stream: an autograd graph of the
        # eager steps that Python has not collected yet (a reference cycle lives until the cyclic
        # GC runs) keeps the leaves' AccumulateGrad nodes, made on the legacy default stream,
        # alive, and a captured backward must not wait on that stream. Seen on the H200: which
        # capture of the run failed moved between runs (d128 in one, d512 in the next).
        gc.collect()
        qc, kc, vc = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # warm-up on the capture stream
                _step(qc, kc, vc, do, **kw)
        torch.cuda.current_stream().wait_stream(side)
        gc.collect()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                captured = _step(qc, kc, vc, do, **kw)
        except Exception as e:
            note(f"  capture failed: {type(e).__name__}: {str(e).splitlines()[0]}")
            raise
        for t in captured:
            t.zero_()
        graph.replay()
        torch.cuda.synchronize()
        same = [torch.equal(a, c) for a, c in zip(eager, captured)]
        note(
            f"  executor {dec.executor}: eager twice bitwise equal: {eager_repeatable}; "
            f"replay == eager bitwise (o, dq, dk, dv): {same}"
        )
        if eager_repeatable:
            assert all(same)
        else:
            # A nondeterministic backward (atomics) differs run to run; the forward must not.
            assert same[0]
    finally:
        torch.use_deterministic_algorithms(False)


def test_side_stream_gives_the_same_bits_and_no_sync():
    torch.use_deterministic_algorithms(True)
    try:
        g = torch.Generator(device=DEV).manual_seed(9)
        q = torch.randn(2, 256, 8, 128, device=DEV, generator=g).to(torch.bfloat16)
        ref = apt.attention(q, q, q, layout="bshd", is_causal=True)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            out = apt.attention(q, q, q, layout="bshd", is_causal=True)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        assert torch.equal(ref, out)
        note("side stream: bitwise equal to the default stream")
    finally:
        torch.use_deterministic_algorithms(False)


class Block(torch.nn.Module):
    def __init__(self, d=128, h=8, kv=2):
        super().__init__()
        self.h, self.kv, self.d = h, kv, d
        self.qkv = torch.nn.Linear(h * d, (h + 2 * kv) * d, dtype=torch.bfloat16)
        self.out = torch.nn.Linear(h * d, h * d, dtype=torch.bfloat16)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split([self.h * self.d, self.kv * self.d, self.kv * self.d], -1)
        q = q.view(b, s, self.h, self.d)
        k = k.view(b, s, self.kv, self.d)
        v = v.view(b, s, self.kv, self.d)
        o = apt.attention(q, k, v, layout="bshd", is_causal=True, window=(255, 0))
        return self.out(o.reshape(b, s, -1))


def test_torch_compile_fullgraph_of_a_model_using_the_op():
    torch.manual_seed(0)
    m = Block().to(DEV)
    x = torch.randn(2, 512, 1024, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    want = m(x)
    torch._dynamo.reset()
    cm = torch.compile(m, fullgraph=True)
    got = cm(x)
    got.float().sum().backward()
    torch.cuda.synchronize()
    diff = (got.float() - want.float()).abs().max().item()
    note(f"torch.compile(fullgraph=True): max |compiled - eager| = {diff:.3e}; backward ran")
    assert diff < 2e-2


def test_transformers_gemma4_on_the_gpu_logs_executors_per_layer():
    pytest.importorskip("transformers.models.gemma4")
    import attn_policy.transformers as aptf
    from transformers.models.gemma4 import Gemma4ForCausalLM, Gemma4TextConfig

    cfg = Gemma4TextConfig(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
        num_attention_heads=8, num_key_value_heads=1, head_dim=256, global_head_dim=512,
        sliding_window=128, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        hidden_size_per_layer_input=16, vocab_size_per_layer_input=512, max_position_embeddings=1024,
    )
    import copy

    aptf.register(log_decisions=True)
    torch.manual_seed(0)
    # One config object per model: `_from_config` records the attention implementation on it.
    ours = Gemma4ForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="attn_policy", torch_dtype=torch.bfloat16).to(DEV).eval()
    ref = Gemma4ForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="sdpa", torch_dtype=torch.bfloat16).to(DEV).eval()
    assert ours.config._attn_implementation == "attn_policy", ours.config._attn_implementation
    ref.load_state_dict(ours.state_dict())
    ids = torch.randint(0, 512, (2, 384), device=DEV, generator=torch.Generator(device=DEV).manual_seed(3))
    aptf.decision_log.clear()
    with torch.no_grad():
        a = ours(ids).logits.float()
        b = ref(ids).logits.float()
    per_layer = sorted({(r["layer"], r["backend"], r["executor"]) for r in aptf.decision_log}, key=lambda x: (x[0] is None, x[0]))
    diff = (a - b).abs().max().item()
    note(f"gemma4 tiny bf16 on GPU: max |attn_policy - sdpa| logits = {diff:.3e} (max |logit| {b.abs().max().item():.2f}); layers: {per_layer}")
    with torch.no_grad():
        ga = ours.generate(ids[:1, :32], max_new_tokens=16, do_sample=False)
        gb = ref.generate(ids[:1, :32], max_new_tokens=16, do_sample=False)
    note(f"  greedy generate 16 tokens identical to sdpa: {ga.tolist() == gb.tolist()}")
    aptf.register()
    assert aptf.decision_log, "attn_policy was not called"
    assert all(r["executor"] not in (None, "reference") for r in aptf.decision_log)
    assert torch.isfinite(a).all()


def test_cuda_graph_deterministic_d128_last():
    # Last: a failed capture can leave the context unusable for later tests.
    _graph_case(128, True)


def test_write_summary():
    ROWS.write("w")
