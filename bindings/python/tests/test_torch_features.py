"""attn_policy.torch.attention's features on CPU (the float64 reference executor): logit
soft-capping, the off-by-one and learnable sinks, padded batches (right and left) and packed THD,
against a float64 reference written here in PyTorch (per sequence, padding rows O = 0), their
gradients (the learnable sink's included) by autograd and by ``gradcheck``, the facts the
decision is made on, declines, bad inputs, and the per-signature cache with lengths."""

import math
import os

import pytest

torch = pytest.importorskip("torch")

import attn_policy.torch as apt  # noqa: E402
from attn_policy import _chain  # noqa: E402


# ---------------------------------------------------------------------------------------------
# The reference: float64 PyTorch, one sequence at a time, in its own coordinates.


def _to_bhsd(t, layout):
    return {"bhsd": t, "bshd": t.transpose(1, 2), "sbhd": t.permute(1, 2, 0, 3)}[layout]


def _from_bhsd(t, layout):
    return {"bhsd": t, "bshd": t.transpose(1, 2), "sbhd": t.permute(2, 0, 1, 3)}[layout]


def _one(q, k, v, causal, bottom_right, window, scale, softcap, sink):
    """One sequence ``[h, s, d]``: O ``[h_q, s_q, d_v]``; rows with no key get 0."""
    return _one_lse(q, k, v, causal, bottom_right, window, scale, softcap, sink)[0]


def _one_lse(q, k, v, causal, bottom_right, window, scale, softcap, sink):
    """O ``[h_q, s_q, d_v]`` and the LSE ``[h_q, s_q]`` of one sequence (the sink's term
    included; -inf for a row with no key)."""
    hq, sq, _ = q.shape
    hkv, skv, _ = k.shape
    if hq != hkv:
        k = k.repeat_interleave(hq // hkv, 0)
        v = v.repeat_interleave(hq // hkv, 0)
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    dev = q.device
    i = torch.arange(sq, device=dev)[:, None] + ((skv - sq) if bottom_right else 0)
    j = torch.arange(skv, device=dev)[None, :]
    ok = torch.ones(sq, skv, dtype=torch.bool, device=dev)
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    s = s.masked_fill(~ok, float("-inf"))
    if sink is not None:
        col = sink.to(s.dtype).reshape(hq, 1, 1).expand(hq, sq, 1)
        lse = torch.logsumexp(torch.cat([s, col], -1), -1, keepdim=True)
    else:
        lse = torch.logsumexp(s, -1, keepdim=True)
    empty = ~ok.any(-1)  # a row that sees no key is empty, whatever its sink
    lse = lse.masked_fill(empty[None, :, None], 0.0)
    p = torch.exp(s - lse).masked_fill(empty[None, :, None], 0.0)
    return p @ v, lse[..., 0].detach().masked_fill(empty[None, :], float("-inf"))


def reference(q, k, v, layout="bhsd", causal=False, bottom_right=False, window=None, scale=None,
              softcap=None, sink=None, lens_q=None, lens_kv=None, padding="right", cu_q=None, cu_kv=None,
              with_lse=False):
    """O of the call, from float64 tensor ops (differentiable: its gradients are the reference's);
    ``with_lse``: (O, LSE), the LSE as the op lays it out (``[b, h_q, s_q]``, ``[1, h_q, t_q]``
    packed; -inf in padding rows and rows with no key)."""
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if isinstance(sink, str):
        sink = torch.zeros(q.shape[-2] if layout == "thd" else _to_bhsd(q, layout).shape[1], dtype=torch.float64,
                           device=q.device)
    if layout == "thd":
        outs, lses = [], []
        for b in range(len(cu_q) - 1):
            qs = q[cu_q[b]:cu_q[b + 1]].transpose(0, 1)
            ks, vs = (t[cu_kv[b]:cu_kv[b + 1]].transpose(0, 1) for t in (k, v))
            o, lse = _one_lse(qs, ks, vs, causal, bottom_right, window, scale, softcap, sink)
            outs.append(o.transpose(0, 1))
            lses.append(lse)
        o = torch.cat(outs, 0)
        return (o, torch.cat(lses, -1).unsqueeze(0)) if with_lse else o
    qh, kh, vh = (_to_bhsd(t, layout) for t in (q, k, v))
    bsz, hq, sq, _ = qh.shape
    skv = kh.shape[2]
    rows, lses = [], []
    for b in range(bsz):
        lq = sq if lens_q is None else lens_q[b]
        lkv = skv if lens_kv is None else lens_kv[b]
        q0 = 0 if padding == "right" else sq - lq
        k0 = 0 if padding == "right" else skv - lkv
        o, lse = _one_lse(qh[b, :, q0:q0 + lq], kh[b, :, k0:k0 + lkv], vh[b, :, k0:k0 + lkv], causal, bottom_right,
                          window, scale, softcap, sink)
        pad = qh.new_zeros(hq, sq - lq, vh.shape[-1])
        rows.append(torch.cat([o, pad] if padding == "right" else [pad, o], 1))
        inf = lse.new_full((hq, sq - lq), float("-inf"))
        lses.append(torch.cat([lse, inf] if padding == "right" else [inf, lse], 1))
    o = _from_bhsd(torch.stack(rows, 0), layout)
    return (o, torch.stack(lses, 0)) if with_lse else o


def rand(*shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def qkv(b=2, hq=4, hkv=2, sq=7, skv=7, d=8, layout="bhsd", seed=0, grad=False):
    shape = {"bhsd": lambda h, s: (b, h, s, d), "bshd": lambda h, s: (b, s, h, d),
             "sbhd": lambda h, s: (s, b, h, d)}[layout]
    out = [rand(*shape(hq, sq), seed=seed), rand(*shape(hkv, skv), seed=seed + 1),
           rand(*shape(hkv, skv), seed=seed + 2)]
    return [t.requires_grad_(grad) for t in out]


def grads(o, inputs, seed=9):
    g = rand(*o.shape, seed=seed)
    return torch.autograd.grad(o, inputs, g)


def close(a, b, tol=1e-10):
    torch.testing.assert_close(a, b, atol=tol, rtol=tol)


@pytest.fixture(autouse=True)
def _fresh():
    apt.clear_cache()
    yield
    apt.clear_cache()


# ---------------------------------------------------------------------------------------------
# Soft-capping and sinks.


@pytest.mark.parametrize("layout", ["bhsd", "bshd", "sbhd"])
@pytest.mark.parametrize("causal,diagonal", [(False, "top_left"), (True, "top_left"), (True, "bottom_right")])
def test_softcap_matches_the_reference_with_gradients(layout, causal, diagonal):
    q, k, v = qkv(sq=5, skv=9, layout=layout, grad=True)
    o, d = apt.attention(q, k, v, layout=layout, is_causal=causal, diagonal=diagonal, softcap=2.5,
                         return_decision=True)
    r = reference(q, k, v, layout, causal, diagonal == "bottom_right", softcap=2.5)
    close(o, r)
    for a, b in zip(grads(o, (q, k, v)), grads(r, (q, k, v))):
        close(a, b)
    assert d.executor == "reference"
    # Without the cap the result differs (the feature is not dropped).
    assert not torch.allclose(o, reference(q, k, v, layout, causal, diagonal == "bottom_right"), atol=1e-6)


def test_off_by_one_sink_matches_the_reference():
    q, k, v = qkv(grad=True)
    o = apt.attention(q, k, v, is_causal=True, sink="off_by_one")
    r = reference(q, k, v, causal=True, sink="off_by_one")
    close(o, r)
    for a, b in zip(grads(o, (q, k, v)), grads(r, (q, k, v))):
        close(a, b)


@pytest.mark.parametrize("sink_dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_learnable_sink_gradient_flows_back_in_its_dtype(sink_dtype):
    q, k, v = qkv(grad=True)
    sink = (torch.arange(4, dtype=torch.float64) / 4 - 0.5).to(sink_dtype).requires_grad_(True)
    o = apt.attention(q, k, v, is_causal=True, window=(3, 0), sink=sink)
    s64 = sink.detach().to(torch.float64).requires_grad_(True)
    r = reference(q, k, v, causal=True, window=(3, 0), sink=s64)
    close(o, r, 1e-9)
    got = grads(o, (q, k, v, sink))
    want = grads(r, (q, k, v, s64))
    for a, b in zip(got[:3], want[:3]):
        close(a, b, 1e-9)
    assert got[3].dtype == sink_dtype and got[3].shape == (4,)
    tol = 1e-5 if sink_dtype != torch.bfloat16 else 2e-2
    torch.testing.assert_close(got[3].to(torch.float64), want[3], atol=tol, rtol=tol)
    # The sink's gradient without Q, K, V needing any (no_grad on them).
    o2 = apt.attention(q.detach(), k.detach(), v.detach(), is_causal=True, window=(3, 0), sink=sink)
    (d2,) = torch.autograd.grad(o2, sink, rand(*o2.shape, seed=9))
    torch.testing.assert_close(d2, got[3])


# ---------------------------------------------------------------------------------------------
# Padded batches and packed THD.


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize("causal,diagonal,sq,skv", [
    (False, "top_left", 6, 6), (True, "top_left", 6, 6), (True, "bottom_right", 3, 8), (False, "top_left", 4, 8),
])
def test_padded_batches_match_the_reference(padding, causal, diagonal, sq, skv):
    q, k, v = qkv(b=3, sq=sq, skv=skv, layout="bshd", grad=True)
    lq = [sq, 0, max(sq - 2, 1)]
    lkv = [skv, 2, skv - 3] if sq != skv else lq
    o, d = apt.attention(q, k, v, layout="bshd", is_causal=causal, diagonal=diagonal, seqlens_q=lq,
                         seqlens_kv=torch.tensor(lkv), padding=padding, return_decision=True)
    r = reference(q, k, v, "bshd", causal, diagonal == "bottom_right", lens_q=lq, lens_kv=lkv, padding=padding)
    close(o, r)
    # Padding rows are written: O = 0 there.
    for b, n in enumerate(lq):
        rows = o[b, n:] if padding == "right" else o[b, :sq - n]
        assert (rows == 0).all()
    gq, gk, gv = grads(o, (q, k, v))
    for a, b in zip((gq, gk, gv), grads(r, (q, k, v))):
        close(a, b)
    # Padding keys get no gradient.
    for b, n in enumerate(lkv):
        pad = slice(n, None) if padding == "right" else slice(0, skv - n)
        assert (gk[b, pad] == 0).all() and (gv[b, pad] == 0).all()
    config = d.decision._d.config
    want = {(False, "top_left"): "padding", (True, "top_left"): "padding_causal",
            (True, "bottom_right"): "padding_causal_bottom_right"}[(causal, diagonal)]
    assert config["attn_mask_type"] == want
    assert config["pad_between_seqs"] is False


def test_one_length_list_means_both_when_s_q_equals_s_kv():
    q, k, v = qkv(b=2, sq=6, skv=6)
    a = apt.attention(q, k, v, is_causal=True, seqlens_q=[6, 3])
    b = apt.attention(q, k, v, is_causal=True, seqlens_kv=[6, 3])
    c = apt.attention(q, k, v, is_causal=True, seqlens_q=[6, 3], seqlens_kv=[6, 3])
    close(a, c, 0)
    close(b, c, 0)
    with pytest.raises(apt.InvalidInput, match="both"):
        q2, k2, v2 = qkv(b=2, sq=2, skv=6)
        apt.attention(q2, k2, v2, seqlens_q=[2, 1])


def test_packed_thd_matches_the_reference_and_states_its_facts():
    cu_q, cu_kv = [0, 3, 3, 8], [0, 4, 6, 12]
    g = torch.Generator().manual_seed(3)
    q = torch.randn(8, 4, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(12, 2, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(12, 2, 8, generator=g, dtype=torch.float64, requires_grad=True)
    o, d = apt.attention(q, k, v, layout="thd", is_causal=True, diagonal="bottom_right", softcap=3.0,
                         cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32), cu_seqlens_kv=cu_kv,
                         return_decision=True)
    r = reference(q, k, v, "thd", True, True, softcap=3.0, cu_q=cu_q, cu_kv=cu_kv)
    assert o.shape == (8, 4, 8)
    close(o, r)
    for a, b in zip(grads(o, (q, k, v)), grads(r, (q, k, v))):
        close(a, b)
    c = d.decision._d.config
    assert c["qkv_layout"] == "thd_thd_thd"
    assert c["attn_mask_type"] == "padding_causal_bottom_right"
    assert (c["batch_size"], c["max_seqlen_q"], c["max_seqlen_kv"]) == (3, 5, 6)
    assert (c["num_tokens_q"], c["num_tokens_kv"]) == (8, 12)
    assert c["softcap"] == 3.0 and c["softmax_type"] == "vanilla" and c["pad_between_seqs"] is False
    # The op's LSE of a packed call is [1, h_q, t_q].
    args = apt._op_args(q, "thd", True, "bottom_right", None, None, 0.0, None, "raise", False, False)
    _, lse = torch.ops.attn_policy.attention(q.detach(), k.detach(), v.detach(), *args, 3.0, 0, None, 3,
                                             [3, 0, 5], [4, 2, 6])
    assert lse.shape == (1, 4, 8)


def test_the_facts_name_softcap_and_the_sink():
    q, k, v = qkv()
    _, d = apt.attention(q, k, v, softcap=4.0, sink=torch.zeros(4, dtype=torch.float64), return_decision=True)
    c = d.decision._d.config
    assert c["softcap"] == 4.0 and c["softmax_type"] == "learnable"
    assert c["attn_mask_type"] == "no_mask"
    _, d = apt.attention(q, k, v, sink="off_by_one", return_decision=True)
    assert d.decision._d.config["softmax_type"] == "off-by-one"
    _, d = apt.attention(q, k, v, return_decision=True)
    c = d.decision._d.config
    assert (c["softcap"], c["softmax_type"]) == (0.0, "vanilla")


# ---------------------------------------------------------------------------------------------
# gradcheck (float64, small shapes).


def test_gradcheck_softcap_padding_causal():
    q, k, v = qkv(b=2, hq=2, hkv=1, sq=4, skv=5, d=3, layout="bshd", grad=True)

    def f(q, k, v):
        return apt.attention(q, k, v, layout="bshd", is_causal=True, diagonal="bottom_right", softcap=1.5,
                             seqlens_q=[4, 2], seqlens_kv=[5, 3], padding="left")

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_gradcheck_learnable_sink():
    q, k, v = qkv(b=1, hq=2, hkv=2, sq=3, skv=4, d=3, grad=True)
    # Sink values and a step exactly representable in float32 (the executors read the logits
    # in fp32): the finite differences then see exactly the perturbed logits.
    sink = torch.tensor([0.25, -0.5], dtype=torch.float64, requires_grad=True)

    def f(q, k, v, sink):
        return apt.attention(q, k, v, is_causal=True, diagonal="bottom_right", sink=sink)

    assert torch.autograd.gradcheck(f, (q, k, v, sink), eps=2.0 ** -12, atol=1e-5, rtol=1e-3)


def test_gradcheck_packed_thd():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(5, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(5, 1, 3, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(5, 1, 3, generator=g, dtype=torch.float64, requires_grad=True)

    def f(q, k, v):
        return apt.attention(q, k, v, layout="thd", is_causal=True, cu_seqlens_q=[0, 2, 5])

    assert torch.autograd.gradcheck(f, (q, k, v))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_features_meet_the_flash_attention_criterion(dtype):
    # err(attn_policy, float64) <= 2 x err(naive same-dtype, float64), O and every gradient
    # (the sink's included), with every feature but packing at once (left padding, soft-cap,
    # a learnable sink, causal bottom-right, GQA).
    lo = [t.to(dtype) for t in qkv(b=2, hq=4, hkv=2, sq=12, skv=16, d=16, layout="bshd", seed=11)]
    sink32 = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float32)
    kw = dict(causal=True, bottom_right=True, softcap=4.0, lens_q=[12, 5], lens_kv=[16, 7], padding="left")
    ours_in = [t.clone().requires_grad_(True) for t in lo] + [sink32.clone().requires_grad_(True)]
    o = apt.attention(*ours_in[:3], layout="bshd", is_causal=True, diagonal="bottom_right", softcap=4.0,
                      sink=ours_in[3], seqlens_q=kw["lens_q"], seqlens_kv=kw["lens_kv"], padding="left")
    ex_in = [t.detach().double().requires_grad_(True) for t in ours_in]
    exact = reference(*ex_in[:3], "bshd", sink=ex_in[3], **kw)
    nv_in = [t.detach().clone().requires_grad_(True) for t in lo] + [sink32.to(dtype).requires_grad_(True)]
    naive = reference(*nv_in[:3], "bshd", sink=nv_in[3], **kw)
    g = rand(*o.shape, seed=12).to(dtype)
    got = (o, *torch.autograd.grad(o, ours_in, g))
    want = (exact, *torch.autograd.grad(exact, ex_in, g.double()))
    base = (naive, *torch.autograd.grad(naive, nv_in, g))
    for name, a, w, n in zip(("O", "dQ", "dK", "dV", "d_sink"), got, want, base):
        err = (a.double() - w).abs().max().item()
        naive_err = (n.double() - w).abs().max().item()
        assert err <= 2 * naive_err + 1e-6, (name, err, naive_err)


# ---------------------------------------------------------------------------------------------
# The cache: same shapes, other lengths.


def test_same_shapes_other_lengths_are_other_calls():
    q, k, v = qkv(b=2, sq=6, skv=6)
    before = apt.cache_info()["entries"]
    for lens in ([6, 2], [3, 5], [6, 2]):
        o = apt.attention(q, k, v, is_causal=True, seqlens_q=lens)
        close(o, reference(q, k, v, causal=True, lens_q=lens, lens_kv=lens))
    for side in ("right", "left"):
        o = apt.attention(q, k, v, seqlens_q=[4, 1], padding=side)
        close(o, reference(q, k, v, lens_q=[4, 1], lens_kv=[4, 1], padding=side))
    assert apt.cache_info()["entries"] - before == 4
    # Other caps and sink kinds too.
    for cap in (1.0, 2.0):
        close(apt.attention(q, k, v, softcap=cap), reference(q, k, v, softcap=cap))


# ---------------------------------------------------------------------------------------------
# Bad inputs: typed errors, before anything reads memory.


@pytest.mark.parametrize("kwargs,words", [
    ({"seqlens_q": [7, 7, 7]}, "entries for a batch of 2"),
    ({"seqlens_q": [8, 1]}, "outside 0..7"),
    ({"seqlens_q": [-1, 1]}, "outside 0..7"),
    ({"seqlens_q": torch.tensor([1.0, 2.0])}, "integer"),
    ({"seqlens_q": [3, 3], "padding": "middle"}, "padding must be"),
    ({"padding": "left"}, "applies to seqlens"),
    ({"softcap": 0.0}, "softcap"),
    ({"softcap": float("inf")}, "softcap"),
    ({"sink": "on"}, "sink"),
    ({"sink": torch.zeros(3, dtype=torch.float64)}, r"\[4\]"),
    ({"sink": torch.zeros(4, dtype=torch.int64)}, "floating-point"),
    ({"cu_seqlens_q": [0, 7]}, "layout 'thd'"),
])
def test_bad_feature_arguments_are_refused(kwargs, words):
    q, k, v = qkv(b=2, sq=7, skv=7)
    with pytest.raises((apt.InvalidInput, apt.PolicyError), match=words):
        apt.attention(q, k, v, **kwargs)


@pytest.mark.parametrize("cu_q,cu_kv,words", [
    ([0, 3, 9], None, "end at t = 8"),
    ([0, 3, 7], None, "end at t = 8"),
    ([1, 3, 8], None, "starting at 0"),
    ([0, 5, 3, 8], None, "must not decrease"),
    ([0], None, "b \\+ 1 >= 2"),
    ([0, 3, 8], [0, 8], "2 and 1 sequences"),
])
def test_bad_cu_seqlens_are_refused(cu_q, cu_kv, words):
    q = rand(8, 2, 4)
    with pytest.raises(apt.InvalidInput, match=words):
        apt.attention(q, q, q, layout="thd", cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv)


def test_thd_without_cu_seqlens_and_lengths_through_the_op_are_checked():
    q = rand(8, 2, 4)
    with pytest.raises(apt.InvalidInput, match="thd"):
        apt.attention(q, q, q, layout="thd")
    with pytest.raises(apt.InvalidInput, match="thd"):
        apt.attention(q, q, q, layout="thd", seqlens_q=[8])
    # The op checks the lengths it is given, whoever calls it.
    q4, k4, v4 = qkv(b=2, sq=4, skv=4)
    args = apt._op_args(q4, "bhsd", False, "top_left", None, None, 0.0, None, "raise", False, False)
    with pytest.raises(apt.InvalidInput, match="longer than"):
        torch.ops.attn_policy.attention(q4, k4, v4, *args, 0.0, 0, None, 1, [5, 1], [4, 1])
    args = apt._op_args(q, "thd", False, "top_left", None, None, 0.0, None, "raise", False, False)
    with pytest.raises(apt.InvalidInput, match="end at t"):
        torch.ops.attn_policy.attention(q, q, q, *args, 0.0, 0, None, 3, [3, 4], [3, 4])
    # A learnable softmax without its logits is an error, never a vanilla softmax.
    args = apt._op_args(q4, "bhsd", False, "top_left", None, None, 0.0, None, "raise", False, False)
    with pytest.raises(apt.InvalidInput, match="sink"):
        torch.ops.attn_policy.attention(q4, k4, v4, *args, 0.0, 2, None)


# ---------------------------------------------------------------------------------------------
# Declines: the manifests refuse what an executor cannot serve; nothing left, declined.


def test_manifests_refuse_the_features_they_do_not_serve():
    # (fp16, equal head counts: what the torch kernels' manifests take but for the features.)
    q, k, v = (t.to(torch.float16) for t in qkv(hq=2, hkv=2, sq=8, skv=8))
    call = apt._Call(q, k, v, 0, 1, -1, 0, False, 0.3, 0.0, False, 2.0, 0, 0, (), ())
    for name in ("torch_flash", "torch_efficient", "torch_cudnn"):
        why = apt._TORCH_EXECUTORS[name].check(call)
        assert why is not None and "soft-capping" in why, (name, why)
    # torch_math serves every feature (its manifest lists them all).
    assert apt._TORCH_EXECUTORS["torch_math"].check(call) is None
    call = apt._Call(q, k, v, 0, 0, -1, -1, False, 0.3, 0.0, False, 0.0, 0, 1, (3, 4), (3, 4))
    assert "per-sequence lengths" in (apt._TORCH_EXECUTORS["torch_cudnn"].check(call) or "")
    # torch_flash and torch_efficient serve padded and packed batches through their kernels'
    # varlen arguments (tests/test_torch_varlen.py; on CUDA only: their `available`), unless
    # switched off with ATTN_POLICY_TORCH_VARLEN=0.
    on = os.environ.get("ATTN_POLICY_TORCH_VARLEN") != "0"
    for name in ("torch_flash", "torch_efficient"):
        why = apt._TORCH_EXECUTORS[name].check(call)
        assert (why is None) if on else ("ATTN_POLICY_TORCH_VARLEN=0" in (why or "")), (name, why)
    assert apt._TORCH_EXECUTORS["torch_math"].check(call) is None
    assert call.problem.refusal_by_manifest("reference") is None
    assert call.problem.refusal_by_manifest("torch_math") is None


def test_a_feature_no_executor_serves_is_declined_with_the_reasons(monkeypatch):
    real = _chain._runner_for

    def runner_for(name, call, *args):
        if name == "reference":  # a machine whose chain has no reference
            raise apt._native.ExecutorUnavailable("reference: not on this machine (test)")
        return real(name, call, *args)

    monkeypatch.setattr(_chain, "_runner_for", runner_for)
    q, k, v = qkv()
    for on_decline in ("raise", "fallback"):
        apt.clear_cache()
        with pytest.raises(apt.AttentionDeclined) as e:
            apt.attention(q, k, v, softcap=2.0, on_decline=on_decline)
        msg = str(e.value)
        assert "reference" in msg and "not on this machine" in msg
        if on_decline == "fallback":
            assert "does not compute logit soft-capping" in msg
    # Without the feature the fallback runs torch SDPA (as before).
    apt.clear_cache()
    o = apt.attention(q, k, v, on_decline="fallback")
    close(o, reference(q, k, v), 1e-6)


# ---------------------------------------------------------------------------------------------
# The op: torch.compile still traces calls without features.


def test_compile_fullgraph_traces_a_call_without_features():
    q, k, v = qkv(b=1, hq=2, hkv=2, sq=4, skv=4, d=8)
    f = torch.compile(lambda q, k, v: apt.attention(q, k, v, is_causal=True), fullgraph=True, backend="eager")
    close(f(q, k, v), reference(q, k, v, causal=True))


def test_compile_fullgraph_traces_a_call_with_features_given_as_lists():
    # Lengths as lists (a tensor of lengths is read to the host: a graph break under compile).
    q, k, v = qkv(b=2, hq=4, hkv=2, sq=6, skv=6, d=8, grad=True)
    sink = torch.tensor([0.5, -1.0, 0.25, 2.0], dtype=torch.float64, requires_grad=True)

    def f(q, k, v, sink):
        return apt.attention(q, k, v, is_causal=True, softcap=3.0, sink=sink, seqlens_q=[6, 3], padding="left")

    eager, compiled = f(q, k, v, sink), torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v, sink)
    close(compiled, eager, 0)
    for a, b in zip(grads(compiled, (q, k, v, sink)), grads(eager, (q, k, v, sink))):
        close(a, b, 0)


def test_opcheck_passes_for_calls_with_features():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 6, 8, dtype=torch.float64, generator=g, requires_grad=True)
    sink = torch.randn(4, dtype=torch.float64, requires_grad=True)
    args = apt._op_args(q, "bhsd", True, "top_left", None, None, 0.0, None, "raise", False, True)
    torch.library.opcheck(torch.ops.attn_policy.attention.default, (q, q, q, *args, 2.0, 2, sink, 1, [6, 3], [6, 3]))
    t = torch.randn(9, 4, 8, dtype=torch.float64, generator=g, requires_grad=True)
    args = apt._op_args(t, "thd", True, "top_left", None, None, 0.0, None, "raise", False, True)
    torch.library.opcheck(torch.ops.attn_policy.attention.default, (t, t, t, *args, 0.0, 1, None, 3, [4, 5], [4, 5]))


def test_the_op_carries_the_sink_and_returns_its_gradient():
    q, k, v = qkv(b=1, hq=2, hkv=2, sq=4, skv=4, d=8, grad=True)
    sink = torch.tensor([0.5, -1.0], dtype=torch.float64, requires_grad=True)
    args = apt._op_args(q, "bhsd", True, "top_left", None, None, 0.0, None, "raise", False, True)
    o, _ = torch.ops.attn_policy.attention(q, k, v, *args, 0.0, 2, sink)
    s64 = sink.detach().clone().requires_grad_(True)
    r = reference(q, k, v, causal=True, sink=s64)
    close(o, r, 1e-9)
    got, want = grads(o, (q, k, v, sink)), grads(r, (q, k, v, s64))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# torch_math serves every feature: a pack whose every chain is [torch_math], against the float64
# reference here (the FlashAttention criterion for O, LSE and every gradient), the padding
# conventions exactly.

from test_torch import pack_with_chains  # noqa: E402  (one copy of the helper)


@pytest.fixture(scope="module")
def math_only(tmp_path_factory):
    import attn_policy
    backends = attn_policy.Policy.load("te").backend_names
    return pack_with_chains(tmp_path_factory.mktemp("math"), {b: ["torch_math"] for b in backends})


_PACKINGS = ("none", "right", "left", "packed")
# (is_causal, diagonal, window): no mask, causal both diagonals, a two-sided window (bottom-right),
# a causal sliding window.
_MASKS = ((False, "top_left", None), (True, "top_left", None), (True, "bottom_right", None),
          (False, "bottom_right", (3, 2)), (True, "top_left", (2, 0)))
_SINKS = (None, "off_by_one", "learnable")
_LAYOUT_OF = {"none": "sbhd", "right": "bshd", "left": "bhsd", "packed": "thd"}
# Padded: a full sequence, one without query rows, one without keys (all its rows empty), a
# shorter one; s_q != s_kv. Packed: the same kinds of sequences, one after another.
_B, _SQ, _SKV, _LQ, _LKV = 4, 9, 11, [9, 0, 6, 4], [11, 3, 0, 7]
_PQ, _PKV = [3, 0, 6, 4, 2], [4, 2, 7, 0, 5]
_CASES = [(p, c, s, m) for p in _PACKINGS for c in (None, 2.0) for s in _SINKS for m in range(len(_MASKS))]


def _rows(t, layout):
    """``[b, h, s, d]`` view of an O / dQ / dK-shaped tensor (``thd``: one batch of ``t`` rows)."""
    return t.transpose(0, 1).unsqueeze(0) if layout == "thd" else _to_bhsd(t, layout)


def _case_tensors(packing, dtype, seed):
    layout = _LAYOUT_OF[packing]
    hq, hkv, d = 4, 2, 16
    if packing == "packed":
        tq, tkv = sum(_PQ), sum(_PKV)
        q, k, v = rand(tq, hq, d, seed=seed), rand(tkv, hkv, d, seed=seed + 1), rand(tkv, hkv, d, seed=seed + 2)
    else:
        shape = {"sbhd": lambda h, s: (s, _B, h, d), "bshd": lambda h, s: (_B, s, h, d),
                 "bhsd": lambda h, s: (_B, h, s, d)}[layout]
        q = rand(*shape(hq, _SQ), seed=seed)
        k, v = rand(*shape(hkv, _SKV), seed=seed + 1), rand(*shape(hkv, _SKV), seed=seed + 2)
    return layout, [t.to(dtype) for t in (q, k, v)]


def _cu(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("packing,softcap,sink_kind,mask", _CASES)
def test_torch_math_serves_every_feature(math_only, packing, softcap, sink_kind, mask, dtype):
    causal, diagonal, window = _MASKS[mask]
    seed = 1000 + 10 * _CASES.index((packing, softcap, sink_kind, mask)) + {torch.bfloat16: 0, torch.float16: 3,
                                                                           torch.float32: 6}[dtype]
    layout, lo = _case_tensors(packing, dtype, seed)
    hq = 4
    sink32 = rand(hq, seed=seed + 7).to(torch.float32) if sink_kind == "learnable" else None
    # The call's keywords (attention()) and the reference's.
    kw = dict(layout=layout, is_causal=causal, diagonal=diagonal, window=window, softcap=softcap)
    rkw = dict(causal=causal, bottom_right=diagonal == "bottom_right", window=window, softcap=softcap)
    if packing == "packed":
        kw.update(cu_seqlens_q=_cu(_PQ), cu_seqlens_kv=_cu(_PKV))
        rkw.update(cu_q=_cu(_PQ), cu_kv=_cu(_PKV))
        lens = (3, _PQ, _PKV)
    elif packing != "none":
        kw.update(seqlens_q=_LQ, seqlens_kv=_LKV, padding=packing)
        rkw.update(lens_q=_LQ, lens_kv=_LKV, padding=packing)
        lens = (1 if packing == "right" else 2, _LQ, _LKV)
    else:
        lens = (0, [], [])
    softmax = _SINKS.index(sink_kind)
    ours_in = [t.clone().requires_grad_(True) for t in lo]
    if sink_kind == "learnable":
        ours_in.append(sink32.clone().requires_grad_(True))
    sink_arg = ours_in[3] if sink_kind == "learnable" else sink_kind

    o, d = apt.attention(*ours_in[:3], sink=sink_arg, policy=math_only, return_decision=True, **kw)
    assert d.executor == "torch_math" and not d.substitute, d.summary()
    assert [(e.executor, e.outcome) for e in d.chain] == [("torch_math", "ran")]
    g = rand(*o.shape, seed=seed + 8).to(dtype)
    got = (o, *torch.autograd.grad(o, ours_in, g))
    # The op (attention_backward / attention_backward_sink): the same runner, the same results,
    # and its LSE.
    args = apt._op_args(lo[0], layout, causal, diagonal, window, None, 0.0, math_only, "raise", False, True)
    op_in = [t.detach().clone().requires_grad_(True) for t in ours_in]
    o_op, lse = torch.ops.attn_policy.attention(*op_in[:3], *args, softcap or 0.0, softmax,
                                                op_in[3] if sink_kind == "learnable" else None, lens[0],
                                                list(lens[1]), list(lens[2]))
    assert lse.dtype == torch.float32 and lse.shape == (
        (1, hq, sum(_PQ)) if packing == "packed" else (_B, hq, _SQ))
    for a, b in zip(got, (o_op, *torch.autograd.grad(o_op, op_in, g))):
        torch.testing.assert_close(a, b, atol=0, rtol=0)

    def ref_sink(dt):
        if sink_kind == "off_by_one":
            return "off_by_one"
        return None if sink_kind is None else sink32.detach().to(dt).requires_grad_(True)

    ex_in = [t.detach().double().requires_grad_(True) for t in lo]
    ex_sink = ref_sink(torch.float64)
    exact, exact_lse = reference(*ex_in, sink=ex_sink, with_lse=True, **rkw, **({"layout": layout}))
    nv_in = [t.detach().clone().requires_grad_(True) for t in lo]
    nv_sink = ref_sink(dtype)
    naive, naive_lse = reference(*nv_in, sink=nv_sink, with_lse=True, **rkw, **({"layout": layout}))
    ex_leaves = ex_in + ([ex_sink] if sink_kind == "learnable" else [])
    nv_leaves = nv_in + ([nv_sink] if sink_kind == "learnable" else [])
    want = (exact, *torch.autograd.grad(exact, ex_leaves, g.double()))
    base = (naive, *torch.autograd.grad(naive, nv_leaves, g))
    names = ("O", "dQ", "dK", "dV", "d_sink")
    for name, a, w, n in zip(names, got, want, base):
        assert a.dtype == (torch.float32 if name == "d_sink" else dtype)
        err = (a.double() - w).abs().max().item()
        naive_err = (n.double() - w).abs().max().item()
        assert err <= 2 * naive_err + 1e-6, (name, err, naive_err)
    # The LSE: -inf exactly where the reference's is (padding rows, rows with no key), the
    # criterion elsewhere.
    empty = torch.isneginf(exact_lse)
    assert torch.equal(torch.isneginf(lse), empty)
    fin = ~empty
    err = (lse.double()[fin] - exact_lse[fin]).abs().max().item()
    naive_err = (naive_lse.double()[fin] - exact_lse[fin]).abs().max().item()
    assert err <= 2 * naive_err + 1e-6, ("LSE", err, naive_err)

    # Rows with no key (padding rows among them): O = 0, dQ = 0 exactly.
    o_rows, dq_rows = _rows(got[0], layout), _rows(got[1], layout)
    assert bool(empty.any()) or packing == "none"
    assert (o_rows[empty] == 0).all() and (dq_rows[empty] == 0).all()
    # Padding rows and keys, by position: O = 0, LSE = -inf, dQ = 0; dK = dV = 0.
    dk_rows, dv_rows = _rows(got[2], layout), _rows(got[3], layout)
    if packing in ("right", "left"):
        for b in range(_B):
            qpad = slice(_LQ[b], None) if packing == "right" else slice(0, _SQ - _LQ[b])
            kpad = slice(_LKV[b], None) if packing == "right" else slice(0, _SKV - _LKV[b])
            assert (o_rows[b, :, qpad] == 0).all() and (dq_rows[b, :, qpad] == 0).all()
            assert torch.isneginf(lse[b, :, qpad]).all()
            assert (dk_rows[b, :, kpad] == 0).all() and (dv_rows[b, :, kpad] == 0).all()
    if packing == "packed":
        # A sequence without keys: its rows empty; one without query rows: its keys get nothing.
        k0 = sum(_PKV[:1])
        assert (dk_rows[0, :, k0:k0 + _PKV[1]] == 0).all() and (dv_rows[0, :, k0:k0 + _PKV[1]] == 0).all()
    # The feature is not dropped: without it, the exact result differs.
    if softcap or sink_kind:
        plain = reference(*[t.detach() for t in ex_in], **dict(rkw, softcap=None), **({"layout": layout}))
        assert not torch.allclose(got[0].double(), plain, atol=1e-2)


def test_torch_math_runs_the_features_first_in_a_chain_and_still_refuses_dropout(tmp_path):
    import attn_policy
    backends = attn_policy.Policy.load("te").backend_names
    mine = pack_with_chains(tmp_path, {b: ["torch_math", "reference"] for b in backends})
    q, k, v = qkv(b=2, sq=6, skv=6, layout="bshd", grad=True)
    sink = torch.tensor([0.5, -1.0, 0.25, 2.0], dtype=torch.float32, requires_grad=True)
    for kw in ({"softcap": 2.0}, {"sink": "off_by_one"}, {"sink": sink}, {"seqlens_q": [6, 3], "padding": "left"},
               {"seqlens_q": [2, 5], "softcap": 3.0, "sink": sink}):
        o, d = apt.attention(q, k, v, layout="bshd", is_causal=True, policy=mine, return_decision=True, **kw)
        # Before torch_math served the features its manifest refused them and reference ran as
        # a substitute; now torch_math runs, the chain's own executor.
        assert [(e.executor, e.outcome) for e in d.chain] == [("torch_math", "ran"), ("reference", "not_tried")], kw
        assert not d.substitute
        r = reference(q, k, v, "bshd", True, sink=sink.detach().double() if kw.get("sink") is sink else kw.get("sink"),
                      softcap=kw.get("softcap"), lens_q=kw.get("seqlens_q"), lens_kv=kw.get("seqlens_q"),
                      padding=kw.get("padding", "right"))
        close(o, r, 1e-9 if "sink" not in kw or kw["sink"] == "off_by_one" else 1e-6)
    packed = rand(8, 4, 8)
    o, d = apt.attention(packed, packed[:, :2], packed[:, 2:], layout="thd", cu_seqlens_q=[0, 3, 8], policy=mine,
                         return_decision=True)
    assert d.executor == "torch_math"
    # What it cannot do it still refuses: dropout (with or without a feature).
    for feats in ((2.0, 0, 0, (), ()), (0.0, 1, 1, (6, 3), (6, 3)), (0.0, 0, 0, (), ())):
        call = apt._Call(q, k, v, 1, 1, -1, 0, False, 0.3, 0.1, True, *feats)
        assert "dropout" in (apt._TORCH_EXECUTORS["torch_math"].check(call) or "")


def test_torch_math_gradcheck_with_features(math_only):
    q, k, v = qkv(b=2, hq=2, hkv=1, sq=4, skv=5, d=3, layout="bshd", grad=True)
    sink = torch.tensor([0.25, -0.5], dtype=torch.float64, requires_grad=True)

    def padded(q, k, v, sink):
        return apt.attention(q, k, v, layout="bshd", is_causal=True, diagonal="bottom_right", softcap=1.5, sink=sink,
                             seqlens_q=[4, 2], seqlens_kv=[5, 0], padding="left", policy=math_only)

    # (Sink values and a step exactly representable in float32: the logits are read in fp32.)
    assert torch.autograd.gradcheck(padded, (q, k, v, sink), eps=2.0 ** -12, atol=1e-5, rtol=1e-3)
    g = torch.Generator().manual_seed(5)
    tq = torch.randn(5, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    tk = torch.randn(6, 1, 3, generator=g, dtype=torch.float64, requires_grad=True)
    tv = torch.randn(6, 1, 3, generator=g, dtype=torch.float64, requires_grad=True)

    def packed(q, k, v):
        return apt.attention(q, k, v, layout="thd", is_causal=True, window=(1, 0), softcap=2.0, sink="off_by_one",
                             cu_seqlens_q=[0, 2, 5], cu_seqlens_kv=[0, 4, 6], policy=math_only)

    assert torch.autograd.gradcheck(packed, (tq, tk, tv))
    _, d = apt.attention(tq, tk, tv, layout="thd", cu_seqlens_q=[0, 2, 5], cu_seqlens_kv=[0, 4, 6], policy=math_only,
                         return_decision=True)
    assert d.executor == "torch_math"
