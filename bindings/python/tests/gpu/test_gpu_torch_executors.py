"""attn_policy.torch on a CUDA GPU, the parts added for issue 14's Python side (skipped without
one): the executors torch provides (torch_cudnn, torch_efficient, torch_flash) by the
FlashAttention criterion through packs whose chains start with them, the eager path against the
op, the TE drop-in's live probes, and why FROST cannot run in Python here. A separate file from
test_gpu_torch.py so that a failing kernel here cannot spoil that suite's CUDA context (the
runner script runs the two in separate processes).

Run with ``-s`` to see the rows; ``GPU_SUMMARY=path`` also writes them to a file."""

import math
import sys
from pathlib import Path

import pytest
from _summary import Rows

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_torch import pack_with_chains  # noqa: E402

import attn_policy.torch as apt  # noqa: E402

DEV = torch.device("cuda", 0)
ROWS = Rows()
note = ROWS.note



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


def _pack_running(tmp_path, first):
    """A copy of the te pack in which every backend's chain is [first, reference]."""
    backends = ("FlashAttention", "FusedAttention", "FrostAttention", "UnfusedDotProductAttention")
    return pack_with_chains(tmp_path, {b: [first, "reference"] for b in backends})


TORCH_EXECUTOR_CASES = [
    # executor, d, heads, s_q, s_kv, causal, diagonal
    ("torch_cudnn", 128, 8, 1024, 1024, True, "top_left"),
    ("torch_cudnn", 64, 8, 512, 512, False, "top_left"),
    ("torch_efficient", 128, 8, 1024, 1024, True, "top_left"),
    ("torch_efficient", 256, 4, 384, 1024, True, "bottom_right"),
    ("torch_flash", 128, 8, 512, 1024, True, "bottom_right"),
]


@pytest.mark.parametrize("case", TORCH_EXECUTOR_CASES, ids=lambda c: f"{c[0]}-d{c[1]}-s{c[3]}x{c[4]}-{'causal' if c[5] else 'nomask'}")
def test_torch_executors_meet_the_flash_attention_criterion(tmp_path, case):
    name, d, h, sq, skv, causal, diagonal = case
    policy = _pack_running(tmp_path, name)
    b = 2
    g = torch.Generator(device=DEV).manual_seed(d + sq)
    q = torch.randn(b, sq, h, d, device=DEV, generator=g).to(torch.bfloat16)
    k = torch.randn(b, skv, h, d, device=DEV, generator=g).to(torch.bfloat16)
    v = torch.randn(b, skv, h, d, device=DEV, generator=g).to(torch.bfloat16)
    do = torch.randn(b, sq, h, d, device=DEV, generator=g).to(torch.bfloat16)
    qa, ka, va = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    o, dec = apt.attention(qa, ka, va, layout="bshd", is_causal=causal, diagonal=diagonal, policy=policy,
                           return_decision=True)
    o.backward(do)
    torch.cuda.synchronize()
    assert dec.executor == name, dec.summary() + " | " + "; ".join(f"{c.executor} {c.outcome}: {c.reason}" for c in dec.chain)
    scale = 1 / math.sqrt(d)
    i = torch.arange(sq, device=DEV).unsqueeze(1) + ((skv - sq) if diagonal == "bottom_right" else 0)
    j = torch.arange(skv, device=DEV).unsqueeze(0)
    allowed = (j <= i) if causal else torch.ones(sq, skv, dtype=torch.bool, device=DEV)
    bhsd = lambda t: t.transpose(1, 2)  # noqa: E731
    q64, k64, v64 = (bhsd(t).double().requires_grad_(True) for t in (q, k, v))
    o64 = math_attention(q64, k64, v64, allowed, scale, torch.float64)
    o64.backward(bhsd(do).double())
    qn, kn, vn = (bhsd(t).detach().clone().requires_grad_(True) for t in (q, k, v))
    on = math_attention(qn, kn, vn, allowed, scale, torch.float32)
    on.backward(bhsd(do))

    def err(a, ref):
        return (a.double() - ref.double()).abs().max().item()

    rows = []
    for n, ours, naive, ref in (("o", bhsd(o), on, o64), ("dq", bhsd(qa.grad), qn.grad, q64.grad),
                                ("dk", bhsd(ka.grad), kn.grad, k64.grad), ("dv", bhsd(va.grad), vn.grad, v64.grad)):
        e, en = err(ours, ref), err(naive, ref)
        rows.append((n, e, en, e <= 2 * en + 1e-6))
    cells = " ".join(f"{n}:{e:.2e}/{en:.2e}{'' if ok else ' FAIL'}" for n, e, en, ok in rows)
    note(f"{name:<15} d{d} h{h} s{sq}x{skv} {'causal ' + diagonal if causal else 'no mask'}: "
         f"{dec.backend} ran on {dec.executor}; ours/naive {cells}")
    assert all(r[3] for r in rows), rows


@pytest.mark.parametrize("d,left", [(256, 1023), (512, -1)], ids=["sliding-d256-w1024", "global-d512"])
def test_gemma4_shapes_meet_the_flash_attention_criterion(d, left):
    """The reduced Gemma 4 of bench/gemma4_train.py: s 4096, 8 query heads per KV head, the
    sliding layers' window of 1024 keys and the global layer's d512, through the te pack as
    transformers calls it (bhsd views of bshd tensors, causal bottom-right, scale 1.0); SDPA's
    math kernel (float32 softmax) for context."""
    b, s, hq, hkv = 1, 4096, 8, 1
    g = torch.Generator(device=DEV).manual_seed(d + 7)
    q, k, v = (torch.randn(b, s, h, d, device=DEV, generator=g).to(torch.bfloat16).transpose(1, 2) for h in (hq, hkv, hkv))
    do = torch.randn(b, hq, s, d, device=DEV, generator=g).to(torch.bfloat16)
    qa, ka, va = (t.detach().requires_grad_(True) for t in (q, k, v))
    window = (left, 0) if left >= 0 else None
    o, dec = apt.attention(qa, ka, va, is_causal=True, diagonal="bottom_right", window=window, scale=1.0,
                           return_decision=True)
    o.backward(do)
    allowed = torch.ones(s, s, dtype=torch.bool, device=DEV).tril()
    if left >= 0:
        allowed &= ~torch.ones(s, s, dtype=torch.bool, device=DEV).tril(-left - 1)
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    o64 = math_attention(q64, k64, v64, allowed, 1.0, torch.float64)
    o64.backward(do.double())
    qn, kn, vn = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    on = math_attention(qn, kn, vn, allowed, 1.0, torch.float32)
    on.backward(do)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qs, ks, vs = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    with sdpa_kernel([SDPBackend.MATH]):
        os_ = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, attn_mask=allowed, scale=1.0, enable_gqa=True)
    os_.backward(do)

    def err(a, ref):
        return (a.double() - ref.double()).abs().max().item()

    rows = []
    for n, ours, naive, sd, ref in (("o", o, on, os_, o64), ("dq", qa.grad, qn.grad, qs.grad, q64.grad),
                                    ("dk", ka.grad, kn.grad, ks.grad, k64.grad), ("dv", va.grad, vn.grad, vs.grad, v64.grad)):
        e, en, es = err(ours, ref), err(naive, ref), err(sd, ref)
        rows.append((n, e, en, es, e <= 2 * en + 1e-6))
    cells = " ".join(f"{n}:{e:.2e}/{en:.2e}{'' if ok else ' FAIL'}" for n, e, en, _, ok in rows)
    sdc = " ".join(f"{n}:{es:.2e}" for n, _, _, es, _ in rows)
    note(f"gemma4 shape d{d} {'window ' + str(left + 1) if left >= 0 else 'causal'} s{s} h{hq}/{hkv}: {dec.backend} "
         f"ran on {dec.executor}; ours/naive {cells} | sdpa math {sdc}")
    assert all(r[4] for r in rows), rows


FUSED_CASES = [
    # d_qk, d_v, causal, diagonal, s_q, s_kv
    (512, 512, True, "top_left", 700, 700),
    (264, 264, False, "top_left", 300, 450),
    (512, 320, True, "bottom_right", 200, 520),
]


@pytest.mark.parametrize("case", FUSED_CASES, ids=lambda c: f"d{c[0]}-{c[1]}-{'causal-' + c[3] if c[2] else 'nomask'}-s{c[4]}x{c[5]}")
def test_native_pack_runs_the_fused_kernels_on_hopper(case):
    """The native pack on an sm90 GPU: under torch.no_grad() the fused kernel runs (through
    torch's stream and allocator), meets the FlashAttention criterion and replays bit for bit in
    a CUDA graph; with gradients the fused executor runs forward and backward, dQ, dK and dV meet
    the criterion and a second backward is bitwise identical."""
    if torch.cuda.get_device_capability(DEV) != (9, 0):
        pytest.skip("the fused kernel runs on sm90 only")
    import attn_policy

    d, dv, causal, diagonal, sq, skv = case
    policy = attn_policy.Policy.load("native")
    b, hq, hkv = 2, 8, 2
    g = torch.Generator(device=DEV).manual_seed(d + dv + sq)
    q = torch.randn(b, sq, hq, d, device=DEV, generator=g).to(torch.bfloat16)
    k = torch.randn(b, skv, hkv, d, device=DEV, generator=g).to(torch.bfloat16)
    v = torch.randn(b, skv, hkv, dv, device=DEV, generator=g).to(torch.bfloat16)
    kw = dict(layout="bshd", is_causal=causal, diagonal=diagonal, policy=policy)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        o, dec = apt.attention(q, k, v, return_decision=True, **kw)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert dec.backend == "fused" and dec.executor == "fused" and not dec.substitute, dec.summary()

    scale = 1 / math.sqrt(d)
    i = torch.arange(sq, device=DEV).unsqueeze(1) + ((skv - sq) if diagonal == "bottom_right" else 0)
    j = torch.arange(skv, device=DEV).unsqueeze(0)
    allowed = (j <= i) if causal else torch.ones(sq, skv, dtype=torch.bool, device=DEV)
    bhsd = lambda t: t.transpose(1, 2)  # noqa: E731
    o64 = math_attention(*(bhsd(t).double() for t in (q, k, v)), allowed, scale, torch.float64)
    on = math_attention(*(bhsd(t) for t in (q, k, v)), allowed, scale, torch.float32)
    # Rows with no admitted key: 0 here, NaN in the textbook softmax.
    o64, on = o64.nan_to_num(0.0), on.nan_to_num(0.0)
    e = (bhsd(o).double() - o64).abs().max().item()
    en = (on.double() - o64).abs().max().item()

    # A CUDA graph of the same call replays bit for bit (the variant was compiled by the call
    # above, so the capture does no host work but encode two TMA descriptors).
    with torch.no_grad():
        graph = torch.cuda.CUDAGraph()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            apt.attention(q, k, v, **kw)  # warm-up on the capture stream
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            captured = apt.attention(q, k, v, **kw)
        graph.replay()
        torch.cuda.synchronize()
        replay_equal = torch.equal(captured, o)

    # Training: gradients through the fused executor against fp64 and naive bf16 autograd.
    do = torch.randn(b, sq, hq, dv, device=DEV, generator=g).to(torch.bfloat16)
    qa, ka, va = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    o_train, dec_train = apt.attention(qa, ka, va, return_decision=True, **kw)
    grads = torch.autograd.grad(o_train, (qa, ka, va), do)
    again = torch.autograd.grad(apt.attention(qa, ka, va, **kw), (qa, ka, va), do)
    deterministic = all(torch.equal(x, y) for x, y in zip(grads, again))

    def textbook_grads(dtype):
        leaves = [bhsd(t).detach().to(dtype).requires_grad_(True) for t in (q, k, v)]
        out = math_attention(*leaves, allowed, scale, torch.float64 if dtype == torch.float64 else torch.float32)
        return [x.nan_to_num(0.0) for x in torch.autograd.grad(out, leaves, bhsd(do).to(dtype))]

    exact, naive = textbook_grads(torch.float64), textbook_grads(torch.bfloat16)
    ratios = []
    for name, ours, ex, nv in zip(("dq", "dk", "dv"), grads, exact, naive):
        eg = (bhsd(ours).double() - ex).abs().max().item()
        eng = (nv.double() - ex).abs().max().item()
        ratios.append(f"{name} {eg:.2e}/{eng:.2e}")
        assert eg <= 2 * eng + 1e-6, (name, eg, eng)
    note(f"native pack d{d}/{dv} {'causal ' + diagonal if causal else 'no mask'} s{sq}x{skv}: inference "
         f"{dec.summary()}; ours/naive o:{e:.2e}/{en:.2e}; graph replay bitwise equal: {replay_equal}; "
         f"training: {dec_train.summary()}; ours/naive {', '.join(ratios)}; second backward bitwise equal: {deterministic}")
    assert e <= 2 * en + 1e-6, (e, en)
    assert replay_equal
    assert dec_train.backend == "fused" and dec_train.executor == "fused", dec_train.summary()
    assert deterministic


@pytest.mark.parametrize("node", ["cpp", "python"])
def test_eager_path_equals_the_op_on_the_gpu(eager_node_mode, node):
    """Both eager autograd nodes (attn_policy.eager_node) against the op, bitwise."""
    eager_node_mode(node)
    torch.use_deterministic_algorithms(True)
    try:
        g = torch.Generator(device=DEV).manual_seed(31)
        q, k, v = (torch.randn(2, 512, h, 128, device=DEV, generator=g).to(torch.bfloat16).requires_grad_(True)
                   for h in (8, 2, 2))
        do = torch.randn(2, 512, 8, 128, device=DEV, generator=g).to(torch.bfloat16)
        apt.attention(q, k, v, layout="bshd", is_causal=True)
        o, dec = apt.attention(q, k, v, layout="bshd", is_causal=True, return_decision=True)
        assert (type(o.grad_fn).__name__ == "_EagerBackward") == (node == "python"), type(o.grad_fn)
        assert apt.eager_node.status()["node"] == node
        args = (1, 1, -1, 0, False, 1 / math.sqrt(128), 0.0, True, 0, 0, False)
        o_op, _ = torch.ops.attn_policy.attention(q, k, v, *args)
        ga = torch.autograd.grad(o, (q, k, v), do)
        gb = torch.autograd.grad(o_op, (q, k, v), do)
        same = [torch.equal(o, o_op)] + [torch.equal(a, b) for a, b in zip(ga, gb)]
        note(f"eager path ({node} node) vs the op ({dec.executor}, deterministic): bitwise equal (o, dq, dk, dv): {same}")
        assert all(same)
    finally:
        torch.use_deterministic_algorithms(False)


def test_te_drop_in_probes_live_on_the_gpu():
    import types

    from attn_policy import te

    te.clear_environment()
    te.reprobe()
    rows = []
    for d in (128, 512):
        p = types.SimpleNamespace(
            qkv_type="Tensor", qkv_dtype="bf16", qkv_layout="bshd_bshd_bshd", batch_size=2, num_heads=16,
            num_gqa_groups=2, max_seqlen_q=1024, max_seqlen_kv=1024, head_dim_qk=d, head_dim_v=d,
            attn_mask_type="causal", window_size=(-1, 0), is_training=True,
        )
        dec = te.select(p)
        rows.append((d, dec.selected, dec.provenance.get("probe.fused_attn_graph"), dec.status("FusedAttention")))
        assert dec.provenance["probe.cuda_device"] == "probe"
        assert dec.provenance["probe.fused_attn_graph"] == "probe", dec.provenance
    note(f"TE drop-in live probes (d, selected, probe.fused_attn_graph source, FusedAttention): {rows}")
    assert rows[0][1] == "FusedAttention", rows
    assert rows[1][3] != "selected", rows


def test_frost_reports_why_it_cannot_run_here(tmp_path):
    policy = _pack_running(tmp_path, "frost")
    q = torch.randn(1, 256, 8, 512, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    o, dec = apt.attention(q, q, q, layout="bshd", is_causal=True, policy=policy, return_decision=True)
    frost = dec.chain[0]
    note(f"frost in Python on this GPU: {frost.outcome}: {frost.reason}")
    assert frost.executor == "frost" and frost.outcome == "unavailable" and "not in this wheel" in frost.reason
    assert "SM90 backward" in frost.reason  # training on sm_90: the forward-only FROST row


def test_write_summary():
    ROWS.write("w")
