"""The native side's features (`_native.make_problem(..., softcap=, softmax=, seqlens=)` and the
plans' `sink` / `d_sink` pointers) on the CPU reference, against float64 torch autograd:
soft-capping, off-by-one and learnable sinks, padded (either side) and packed sequences, GQA,
a causal mask per sequence, head_dim_v != head_dim_qk. The Python API builds on these."""

import pytest

torch = pytest.importorskip("torch")

from attn_policy import _native  # noqa: E402

B, H, HKV, SQ, SKV, D, DV = 2, 4, 2, 5, 6, 4, 3
QL, KVL = [3, 5], [4, 6]
SCALE, CAP = 0.5, 1.5


def _avail(t):
    return t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()


def _bshd(t):
    s = t.stride()
    return (s[0], s[2], s[1])


def _want(q, k, v, sink, packing, softmax):
    """O (zeros in padding) and LSE (-inf in padding) by torch, per sequence."""
    o = torch.zeros(B, SQ, H, DV, dtype=q.dtype)
    lse = torch.full((B, H, SQ), float("-inf"), dtype=q.dtype)
    for i in range(B):
        right = packing == "padded_right"
        qs = slice(0, QL[i]) if right else slice(SQ - QL[i], SQ)
        ks = slice(0, KVL[i]) if right else slice(SKV - KVL[i], SKV)
        qq = q[i, qs].transpose(0, 1)
        kk = k[i, ks].transpose(0, 1).repeat_interleave(H // HKV, 0)
        vv = v[i, ks].transpose(0, 1).repeat_interleave(H // HKV, 0)
        s = CAP * torch.tanh(SCALE * qq @ kk.transpose(1, 2) / CAP)
        allowed = torch.ones(QL[i], KVL[i], dtype=torch.bool).tril()  # causal, top-left
        s = s.masked_fill(~allowed, float("-inf"))
        if softmax != "vanilla":
            logit = sink if softmax == "learnable" else torch.zeros(H, dtype=q.dtype)
            s = torch.cat([s, logit.view(H, 1, 1).expand(H, QL[i], 1)], -1)
        l = torch.logsumexp(s, -1)
        p = torch.exp(s - l[..., None])[..., : KVL[i]]
        o[i, qs] = (p @ vv).transpose(0, 1)
        lse[i, :, qs] = l
    return o, lse


@pytest.mark.parametrize("packing", ["padded_right", "padded_left"])
@pytest.mark.parametrize("softmax", ["vanilla", "off-by-one", "learnable"])
def test_padded_softcap_and_sinks_match_torch(packing, softmax):
    torch.manual_seed(1)
    dt = torch.float64
    q, do = torch.randn(B, SQ, H, D, dtype=dt), torch.randn(B, SQ, H, DV, dtype=dt)
    k, v = torch.randn(B, SKV, HKV, D, dtype=dt), torch.randn(B, SKV, HKV, DV, dtype=dt)
    sink = torch.randn(H, dtype=torch.float32)
    o, lse = torch.empty(B, SQ, H, DV, dtype=dt), torch.empty(B, H, SQ, dtype=dt)
    problem = _native.make_problem(
        "float64", (B, H, HKV, SQ, SKV, D, DV), (_bshd(q), _bshd(k), _bshd(v), _bshd(o)),
        1, -1, -1, False, SCALE, True, softcap=CAP, softmax=softmax, seqlens=(packing, QL, KVL))
    plan = _native.make_plan("reference", None, problem)
    learnable = softmax == "learnable"
    fwd = [t.data_ptr() for t in (q, k, v, o, lse)] + [[_avail(t) for t in (q, k, v, o, lse)]]
    if learnable:
        with pytest.raises(_native.InvalidInput, match="needs sink"):
            plan.forward(*fwd)
        short = torch.zeros(H - 1, dtype=torch.float32)
        with pytest.raises(_native.InvalidInput, match="sink's sizes and strides reach"):
            plan.forward(*fwd, sink=short.data_ptr(), sink_avail=_avail(short))
        plan.forward(*fwd, sink=sink.data_ptr(), sink_avail=_avail(sink))
    else:
        with pytest.raises(_native.InvalidInput, match="only learnable takes sink logits"):
            plan.forward(*fwd, sink=sink.data_ptr(), sink_avail=_avail(sink))
        plan.forward(*fwd)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    sr = sink.double().requires_grad_()
    o_want, lse_want = _want(qr, kr, vr, sr, packing, softmax)
    torch.testing.assert_close(o, o_want.detach(), rtol=0, atol=1e-12)
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_want))
    torch.testing.assert_close(lse.nan_to_num(neginf=0.0), lse_want.detach().nan_to_num(neginf=0.0),
                               rtol=0, atol=1e-12)
    (o_want * do).sum().backward()
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    d_sink = torch.full((H,), float("nan"), dtype=torch.float32)
    ts = (q, k, v, o, do, lse, dq, dk, dv)
    bwd = [t.data_ptr() for t in ts] + [[_avail(t) for t in ts]]
    if learnable:
        with pytest.raises(_native.InvalidInput, match="needs d_sink"):
            plan.backward(*bwd, sink=sink.data_ptr(), sink_avail=_avail(sink))
        plan.backward(*bwd, sink=sink.data_ptr(), d_sink=d_sink.data_ptr(),
                      sink_avail=_avail(sink), d_sink_avail=_avail(d_sink))
        torch.testing.assert_close(d_sink.double(), sr.grad, rtol=1e-5, atol=1e-6)
    else:
        plan.backward(*bwd)
    for got, want in ((dq, qr.grad), (dk, kr.grad), (dv, vr.grad)):
        # Every element written: padding rows and keys get 0, as torch's gradient.
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_packed_thd_equals_each_sequence():
    torch.manual_seed(2)
    dt = torch.float64
    t_q, t_kv = sum(QL), sum(KVL)
    q, k, v = torch.randn(t_q, H, D, dtype=dt), torch.randn(t_kv, HKV, D, dtype=dt), torch.randn(t_kv, HKV, DV, dtype=dt)
    o, lse = torch.full((t_q, H, DV), float("nan"), dtype=dt), torch.empty(1, H, t_q, dtype=dt)

    def thd(t):  # (batch, head, seq): the batch stride is ignored for a packed batch
        return (0, t.stride(1), t.stride(0))

    problem = _native.make_problem(
        "float64", (B, H, HKV, max(QL), max(KVL), D, DV), (thd(q), thd(k), thd(v), thd(o)),
        2, -1, -1, True, SCALE, True, seqlens=("packed", QL, KVL))
    plan = _native.make_plan("reference", None, problem)
    plan.forward(*[t.data_ptr() for t in (q, k, v, o, lse)], [_avail(t) for t in (q, k, v, o, lse)])
    cq, ckv = 0, 0
    for lq, lkv in zip(QL, KVL):
        qq = q[cq:cq + lq].transpose(0, 1)
        kk = k[ckv:ckv + lkv].transpose(0, 1).repeat_interleave(H // HKV, 0)
        vv = v[ckv:ckv + lkv].transpose(0, 1).repeat_interleave(H // HKV, 0)
        s = SCALE * qq @ kk.transpose(1, 2)
        # Causal bottom-right in the sequence's own coordinates: query i sees j <= i + lkv - lq.
        allowed = torch.ones(lq, lkv, dtype=torch.bool).tril(lkv - lq)
        p = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1)
        torch.testing.assert_close(o[cq:cq + lq].transpose(0, 1), p @ vv, rtol=0, atol=1e-12)
        cq, ckv = cq + lq, ckv + lkv


def test_the_defaults_are_todays_problem_and_bad_names_are_refused():
    args = ("float16", (1, 2, 2, 4, 4, 8, 8), ((64, 8, 16),) * 4, 0, -1, -1, False, 0.3, True)
    plain = _native.make_problem(*args)
    assert plain.to_json() == _native.make_problem(*args, softcap=None, softmax="vanilla", seqlens=None).to_json()
    assert '"softmax":"vanilla"' in plain.to_json() and '"seqlens":null' in plain.to_json()
    with pytest.raises(_native.InvalidInput, match="vanilla"):
        _native.make_problem(*args, softmax="sinky")
    with pytest.raises(_native.InvalidInput, match="padded_right"):
        _native.make_problem(*args, seqlens=("ragged", [4], [4]))
    with pytest.raises(_native.InvalidInput, match="softcap"):
        _native.make_problem(*args, softcap=-1.0)
    with pytest.raises(_native.InvalidInput, match="seqlens"):
        _native.make_problem(*args, seqlens=("padded_right", [5], [4]))
