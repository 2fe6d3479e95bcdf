"""``torch_flash`` / ``torch_efficient`` on padded and packed batches, on CPU: the gather/scatter
plan (attn_policy/_varlen.py) against direct computations, exactly; the two runners' whole
varlen path with the kernels replaced by float64 stand-ins that behave as the kernels do (packed
buffers, FlashAttention's ``[h, tokens]`` LSE with ``+inf`` and junk in empty rows, the
memory-efficient kernel's ``[sequences, h, rows]`` LSE, junk gradients where nothing flows;
float64 arithmetic, so they also dry-run the GPU test's plumbing on the CPU),
against the float64 reference, the padding conventions exactly and NaN in the inputs' padding;
and the gates. The kernels themselves run in tests/gpu/test_gpu_torch_varlen.py."""

import math
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_torch_features import _cu, _to_bhsd, rand, reference  # noqa: E402

import attn_policy.torch as apt  # noqa: E402
from attn_policy import _kernel_runners  # noqa: E402
from attn_policy._call import _layout_index, _window_args  # noqa: E402
from attn_policy._varlen import PACKED, VarlenPlan, visible_keys  # noqa: E402

INF = float("inf")

# (is_causal, diagonal, window): the grid's masks.
MASKS = {
    "none": (False, "top_left", None),
    "causal top-left": (True, "top_left", None),
    "causal bottom-right": (True, "bottom_right", None),
    "window": (True, "bottom_right", (3, 0)),
}

# torch_flash and torch_efficient serve lengths unless ATTN_POLICY_TORCH_VARLEN=0 (read once per
# process); bindings/test.sh runs this file a second time with it 0.
VARLEN_ON = os.environ.get("ATTN_POLICY_TORCH_VARLEN") != "0"
needs_varlen = pytest.mark.skipif(not VARLEN_ON, reason="switched off by ATTN_POLICY_TORCH_VARLEN=0")


def mask_args(name):
    causal, diagonal, window = MASKS[name]
    wl, wr = _window_args(window, causal)
    return (1 if causal else 0, wl, wr, diagonal == "bottom_right")


def allowed(lq, lkv, margs):
    """The sequence's mask by brute force, ``[lq, lkv]``."""
    mask, wl, wr, br = margs
    if mask != 0:
        wr = 0 if wr < 0 else min(wr, 0)
    i = torch.arange(lq)[:, None] + ((lkv - lq) if br else 0)
    j = torch.arange(lkv)[None, :]
    ok = torch.ones(lq, lkv, dtype=torch.bool)
    if wl >= 0:
        ok &= j >= i - wl
    if wr >= 0:
        ok &= j <= i + wr
    return ok


# ---------------------------------------------------------------------------------------------
# The plan, exactly.

LQ, LKV, SQ, SKV = [5, 0, 3, 1, 6], [7, 2, 0, 1, 4], 6, 7


def test_visible_keys_match_the_mask_by_brute_force():
    for name in MASKS:
        for lq, lkv in ((5, 7), (7, 5), (1, 1), (6, 6), (4, 1)):
            ok = allowed(lq, lkv, mask_args(name))
            lo, hi = visible_keys(lq, lkv, mask_args(name))
            for i in range(lq):
                cols = ok[i].nonzero().flatten().tolist()
                if cols:
                    assert (lo[i], hi[i]) == (cols[0], cols[-1]) and cols == list(range(lo[i], hi[i] + 1))
                else:
                    assert lo[i] > hi[i], (name, lq, lkv, i)


@pytest.mark.parametrize("packing", [1, 2, 3])
@pytest.mark.parametrize("mask", list(MASKS))
def test_plan_indices_and_cu_seqlens(packing, mask):
    sq, skv = (sum(LQ), sum(LKV)) if packing == PACKED else (SQ, SKV)
    p = VarlenPlan(packing, LQ, LKV, sq, skv, mask_args(mask)).to("cpu")
    live = [b for b in range(len(LQ)) if LQ[b] and LKV[b]]
    assert p.live == live == [0, 3, 4]
    assert p.cu_q.dtype == torch.int32 and p.cu_q.tolist() == _cu([LQ[b] for b in live])
    assert p.cu_kv.tolist() == _cu([LKV[b] for b in live])
    assert (p.max_q, p.max_kv) == (6, 7) and p.eff_lse_rows() == 32
    assert not p.in_place
    # Each live sequence's tokens, where they sit in the call's tensors.
    want_q, want_kv = [], []
    for b in live:
        if packing == PACKED:
            want_q += [(None, sum(LQ[:b]) + i) for i in range(LQ[b])]
            want_kv += [(None, sum(LKV[:b]) + j) for j in range(LKV[b])]
        else:
            q0 = 0 if packing == 1 else SQ - LQ[b]
            k0 = 0 if packing == 1 else SKV - LKV[b]
            want_q += [(b, q0 + i) for i in range(LQ[b])]
            want_kv += [(b, k0 + j) for j in range(LKV[b])]
    if packing == PACKED:
        assert p.q_s.tolist() == [s for _, s in want_q] and p.kv_s.tolist() == [s for _, s in want_kv]
    else:
        assert list(zip(p.q_b.tolist(), p.q_s.tolist())) == want_q
        assert list(zip(p.kv_b.tolist(), p.kv_s.tolist())) == want_kv
    assert p.q_seq.tolist() == sum(([n] * LQ[b] for n, b in enumerate(live)), [])
    assert p.q_pos.tolist() == sum((list(range(LQ[b])) for b in live), [])
    # Empty rows and unseen keys, by the brute-force mask.
    empty, unseen = [], []
    cq = ckv = 0
    for b in live:
        ok = allowed(LQ[b], LKV[b], mask_args(mask))
        empty += [cq + i for i in range(LQ[b]) if not ok[i].any()]
        unseen += [ckv + j for j in range(LKV[b]) if not ok[:, j].any()]
        cq, ckv = cq + LQ[b], ckv + LKV[b]
    assert p.empty_q.tolist() == empty and p.unseen_kv.tolist() == unseen
    if mask == "causal bottom-right":
        assert empty == [6, 7]  # the last sequence (6 rows, 4 keys, from row 6): its first two rows
    if mask == "causal top-left":
        assert unseen == [5, 6]  # the first sequence (5 rows, 7 keys): its last two keys


def _padded_tensor(packing, lens, s, h, d, seed):
    """``[b, s, h, d]`` with random tokens and NaN padding."""
    t = rand(len(lens), s, h, d, seed=seed)
    for b, n in enumerate(lens):
        pad = slice(n, None) if packing == 1 else slice(0, s - n)
        t[b, pad] = float("nan")
    return t


@pytest.mark.parametrize("packing", [1, 2, 3])
def test_gather_and_scatter_are_exact_and_zero_the_rest(packing):
    h, d = 3, 4
    p = VarlenPlan(packing, LQ, LKV, sum(LQ) if packing == PACKED else SQ,
                   sum(LKV) if packing == PACKED else SKV, mask_args("none")).to("cpu")
    if packing == PACKED:
        q = rand(sum(LQ), h, d, seed=1)
        got = p.gather(q, "q")
        want = torch.cat([q[sum(LQ[:b]):sum(LQ[:b + 1])] for b in p.live])
    else:
        q = _padded_tensor(packing, LQ, SQ, h, d, seed=1)
        got = p.gather(q, "q")
        want = torch.cat([q[b, :LQ[b]] if packing == 1 else q[b, SQ - LQ[b]:] for b in p.live])
    assert torch.equal(got, want) and not got.isnan().any()
    # Scattered back: the same rows, every other row exactly 0 (a stale buffer of NaN).
    out = torch.full_like(q, float("nan"))
    p.scatter(got, out, "q")
    # The rows of the sequences that run (one with query rows but no key does not: zeros).
    real = torch.zeros_like(q, dtype=torch.bool)
    for b in p.live:
        if packing == PACKED:
            real[sum(LQ[:b]):sum(LQ[:b + 1])] = True
        else:
            real[b, slice(0, LQ[b]) if packing == 1 else slice(SQ - LQ[b], SQ)] = True
    assert torch.equal(out[real], q[real]) and (out[~real] == 0).all()


def test_a_packed_call_whose_every_sequence_runs_is_not_copied():
    lq, lkv = [3, 5], [4, 2]
    p = VarlenPlan(PACKED, lq, lkv, 8, 6, mask_args("causal bottom-right")).to("cpu")
    assert p.in_place and p.live == [0, 1]
    q = rand(8, 2, 4)
    assert p.gather(q, "q") is q
    # A head dim that is not contiguous is made so (the kernels read rows in place).
    qt = rand(8, 4, 2).transpose(1, 2)
    assert p.gather(qt, "q").stride(-1) == 1 and torch.equal(p.gather(qt, "q"), qt)
    lse = rand(2, 8)
    assert torch.equal(p.lse_out(lse, torch.float32), lse.float().unsqueeze(0))


@pytest.mark.parametrize("packing", [1, 2, 3])
def test_lse_relayouts_are_exact(packing):
    h = 3
    sq = sum(LQ) if packing == PACKED else SQ
    p = VarlenPlan(packing, LQ, LKV, sq, sum(LKV) if packing == PACKED else SKV,
                   mask_args("causal bottom-right")).to("cpu")
    lse_hn = rand(h, p.total_q, seed=3).float()
    out = p.lse_out(lse_hn, torch.float32)
    # Direct: each live token's LSE at its row, -inf everywhere else.
    want = torch.full((1, h, sq) if packing == PACKED else (len(LQ), h, SQ), -INF)
    n = 0
    for b in p.live:
        for i in range(LQ[b]):
            if packing == PACKED:
                want[0, :, sum(LQ[:b]) + i] = lse_hn[:, n]
            else:
                want[b, :, i if packing == 1 else SQ - LQ[b] + i] = lse_hn[:, n]
            n += 1
    assert torch.equal(out, want)
    assert torch.equal(p.lse_in(out), lse_hn)
    # The memory-efficient kernel's [live, h, rows]: token n of live sequence s at row pos.
    eff = p.lse_to_eff(lse_hn)
    assert eff.shape == (3, h, 32)
    n = 0
    for s, b in enumerate(p.live):
        assert torch.equal(eff[s, :, :LQ[b]], lse_hn[:, n:n + LQ[b]]) and (eff[s, :, LQ[b]:] == 0).all()
        n += LQ[b]
    eff[:, :, 20:] = 99.0  # rows past every sequence: never read back
    assert torch.equal(p.lse_from_eff(eff), lse_hn)
    # Empty rows: -inf in the call's LSE, +inf for a backward kernel.
    fixed = lse_hn.clone()
    p.fix_rows(None, fixed)
    assert torch.isneginf(fixed[:, p.empty_q]).all() and p.empty_q.numel() == 2
    k = p.kernel_lse(fixed)
    assert torch.isposinf(k[:, p.empty_q]).all()
    keep = torch.ones(p.total_q, dtype=torch.bool)
    keep[p.empty_q] = False
    assert torch.equal(k[:, keep], lse_hn[:, keep])


# ---------------------------------------------------------------------------------------------
# The runners' varlen path, with float64 stand-ins for the kernels.


def _kernel_mask(lq, lkv, runner):
    """The mask a kernel applies to one sequence, as the runner configured it."""
    if isinstance(runner, _kernel_runners._FlashRunner):
        # FlashAttention: bottom-right per sequence; causal, or a window (-1 unbounded).
        return allowed(lq, lkv, (1 if runner.causal else 0, runner.wl, runner.wr, True))
    mt = runner.mask_type
    return allowed(lq, lkv, (1 if mt else 0, -1, -1, mt == 2))


def _seqs(plan):
    cq, ckv = plan.cu_q.tolist(), plan.cu_kv.tolist()
    return [(cq[n], cq[n + 1], ckv[n], ckv[n + 1]) for n in range(len(cq) - 1)]


def _expand(t, hq):
    return t.repeat_interleave(hq // t.shape[1], 1) if t.shape[1] != hq else t


def _fake_forward(runner, plan, qp, kp, vp):
    """O ``[t, h, d_v]`` and LSE ``[h, t]``: junk O and ``+inf`` LSE in rows that see no key
    (computed in float64, returned in the inputs' dtype)."""
    dt = qp.dtype
    qp, kp, vp = (t.double() for t in (qp, kp, vp))
    hq = qp.shape[1]
    kp, vp = _expand(kp, hq), _expand(vp, hq)
    o = torch.full((qp.shape[0], hq, vp.shape[-1]), 7.0, dtype=qp.dtype)
    lse = torch.full((hq, qp.shape[0]), INF, dtype=torch.float32)
    for a, b, c, e in _seqs(plan):
        ok = _kernel_mask(b - a, e - c, runner)
        s = torch.einsum("ihd,jhd->hij", qp[a:b], kp[c:e]) * runner.scale
        s = s.masked_fill(~ok, -INF)
        m = torch.logsumexp(s, -1)
        seq_o = torch.einsum("hij,jhd->ihd", torch.exp(s - m[..., None]), vp[c:e])
        rows = ok.any(-1)
        o[a:b][rows] = seq_o[rows]
        lse[:, a:b][:, rows] = m[:, rows].float()
    return o.to(dt), lse


def _fake_backward(runner, plan, gp, qp, kp, vp, op, lse_hn):
    """dQ, dK, dV from the LSE it is given (``P = exp(S - LSE)``: NaN if an empty row had
    ``-inf``), junk in dK/dV of keys no row sees and dQ of rows that see none."""
    dt = qp.dtype
    gp, qp, kp, vp, op = (t.double() for t in (gp, qp, kp, vp, op))
    hq, hkv = qp.shape[1], kp.shape[1]
    ke, ve = _expand(kp, hq), _expand(vp, hq)
    dq = torch.zeros_like(qp)
    dk = torch.zeros(kp.shape[0], hq, kp.shape[-1], dtype=kp.dtype)
    dv = torch.zeros(vp.shape[0], hq, vp.shape[-1], dtype=vp.dtype)
    for a, b, c, e in _seqs(plan):
        ok = _kernel_mask(b - a, e - c, runner)
        s = torch.einsum("ihd,jhd->hij", qp[a:b], ke[c:e]) * runner.scale
        s = s.masked_fill(~ok, -INF)
        p = torch.exp(s - lse_hn[:, a:b, None].double())
        go, oo = gp[a:b], op[a:b]
        dv[c:e] = torch.einsum("hij,ihd->jhd", p, go)
        dp = torch.einsum("ihd,jhd->hij", go, ve[c:e])
        dd = (go * oo).sum(-1).transpose(0, 1)[..., None]
        ds = p * (dp - dd)
        dq[a:b] = torch.einsum("hij,jhd->ihd", ds, ke[c:e]) * runner.scale
        dk[c:e] = torch.einsum("hij,ihd->jhd", ds, qp[a:b]) * runner.scale
        dq[a:b][~ok.any(-1)] = 5.0
        dk[c:e][~ok.any(0)] = 5.0
        dv[c:e][~ok.any(0)] = 5.0
    g = hq // hkv
    return (dq.to(dt), dk.view(-1, hkv, g, dk.shape[-1]).sum(2).to(dt),
            dv.view(-1, hkv, g, dv.shape[-1]).sum(2).to(dt))


def _fake_eff_forward(runner, plan, qp, kp, vp):
    # The memory-efficient kernel's LSE layout, through the plan's relayout (junk past the rows).
    o, lse_hn = _fake_forward(runner, plan, qp, kp, vp)
    eff = plan.lse_to_eff(lse_hn)
    eff[:, :, plan.max_q:] = 123.0
    return o, plan.lse_from_eff(eff)


def _fake_eff_backward(runner, plan, gp, qp, kp, vp, op, lse_hn):
    eff = plan.lse_to_eff(lse_hn)  # what the kernel would be given
    return _fake_backward(runner, plan, gp, qp, kp, vp, op, plan.lse_from_eff(eff))


class FakeFlash(_kernel_runners._FlashRunner):
    _kernel_forward = _fake_forward
    _kernel_backward = _fake_backward


class FakeEfficient(_kernel_runners._EfficientRunner):
    _kernel_forward = _fake_eff_forward
    _kernel_backward = _fake_eff_backward


_LAYOUT = {"right": "bshd", "left": "bhsd", "packed": "thd"}
# Mixed lengths: full, length 1, a sequence without keys, one without query rows, s_q != s_kv.
_PL_Q, _PL_KV, _PS_Q, _PS_KV = [9, 1, 4, 0, 6], [11, 1, 0, 3, 2], 9, 11
# Every running sequence square (FlashAttention's top-left mask).
_PL_KV_SQUARE = [9, 1, 0, 3, 6]


def _case(packing, hq, hkv, d=8, seed=0):
    layout = _LAYOUT[packing]
    if packing == "packed":
        q = rand(sum(_PL_Q), hq, d, seed=seed)
        k, v = rand(sum(_PL_KV), hkv, d, seed=seed + 1), rand(sum(_PL_KV), hkv, d, seed=seed + 2)
        return layout, (q, k, v)
    shape = {"bshd": lambda h, s: (5, s, h, d), "bhsd": lambda h, s: (5, h, s, d)}[layout]
    return layout, (rand(*shape(hq, _PS_Q), seed=seed), rand(*shape(hkv, _PS_KV), seed=seed + 1),
                    rand(*shape(hkv, _PS_KV), seed=seed + 2))


def _with_nan_padding(t, packing, lens, other):
    """A copy with NaN in every padding row (packed: in the tokens of sequences that do not run:
    ``other``, the lengths of the other side, is 0)."""
    t = t.clone()
    if packing == "packed":
        start = 0
        for n, m in zip(lens, other):
            if not m:
                t[start:start + n] = float("nan")
            start += n
        return t
    bh = _to_bhsd(t, _LAYOUT[packing])  # a view: writes reach t
    s = bh.shape[2]
    for b, n in enumerate(lens):
        if packing == "right":
            bh[b, :, n:] = float("nan")
        else:
            bh[b, :, :s - n] = float("nan")
    return t


@pytest.mark.parametrize("nan_padding", [False, True], ids=["clean", "nan-padding"])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("packing", ["right", "left", "packed"])
@pytest.mark.parametrize("executor", ["torch_flash", "torch_efficient"])
@needs_varlen
def test_varlen_runner_path_matches_the_reference(executor, packing, mask, heads, nan_padding):
    hq, hkv = heads
    causal, diagonal, window = MASKS[mask]
    wl, wr = _window_args(window, causal)
    layout, (q, k, v) = _case(packing, hq, hkv)
    li = _layout_index(layout)
    pk = {"right": 1, "left": 2, "packed": 3}[packing]
    lq, lkv = _PL_Q, _PL_KV
    scale = 1.0 / math.sqrt(q.shape[-1])
    ex = apt._TORCH_EXECUTORS[executor]

    def call_of(lkv, dtype):
        kv = [t.to(dtype) for t in (k, v)]
        if packing == "packed":  # K/V of these lengths
            kv = [rand(sum(lkv), hkv, q.shape[-1], seed=s).to(dtype) for s in (1, 2)]
        br = diagonal == "bottom_right"
        mask_index = (2 if br else 1) if causal else 0
        return apt._Call(q.to(dtype), *kv, li, mask_index, wl, wr, br, scale, 0.0, True, 0.0, 0, pk, lq, lkv)

    # The gates, on the fp16 call the kernels would get.
    why = ex.check(call_of(lkv, torch.float16))
    if executor == "torch_efficient" and (hq != hkv or window is not None):
        assert why is not None  # no GQA (manifest), no window (gate)
        return
    if (executor, mask) in (("torch_flash", "causal top-left"), ("torch_efficient", "causal bottom-right")):
        # FlashAttention's diagonal is bottom-right per sequence, the memory-efficient kernel's
        # bottom-right is not per sequence (measured on a GPU): the other diagonal is refused
        # where a running sequence has s_q != s_kv; run with every running sequence square.
        assert why is not None and "sequence 0: 9 and 11" in why, why
        lkv = _PL_KV_SQUARE
        if packing == "packed":
            k, v = (rand(sum(lkv), hkv, q.shape[-1], seed=s) for s in (1, 2))
        why = ex.check(call_of(lkv, torch.float16))
    assert why is None, why
    # The runner itself on float64 tensors (the stand-ins compute in float64).
    call = call_of(lkv, torch.float64)
    runner = (FakeFlash if executor == "torch_flash" else FakeEfficient)(call)
    ins = [q, k, v]
    if nan_padding:
        ins = [_with_nan_padding(q, packing, lq, lkv), _with_nan_padding(k, packing, lkv, lq),
               _with_nan_padding(v, packing, lkv, lq)]
        assert all(t.isnan().any() for t in ins)
    o, lse = runner.forward(*ins)
    rkw = dict(causal=causal, bottom_right=diagonal == "bottom_right", window=window, scale=scale)
    if packing == "packed":
        rkw.update(cu_q=_cu(lq), cu_kv=_cu(lkv))
    else:
        rkw.update(lens_q=lq, lens_kv=lkv, padding=packing)
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    want, want_lse = reference(*leaves, layout, with_lse=True, **rkw)
    assert o.shape == want.shape and lse.shape == want_lse.shape
    torch.testing.assert_close(o, want, atol=1e-12, rtol=1e-12)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))
    fin = ~torch.isneginf(want_lse)
    torch.testing.assert_close(lse[fin].double(), want_lse[fin], atol=1e-6, rtol=1e-6)
    g = rand(*o.shape, seed=77)
    dq, dk, dv = runner.backward(g, *ins, o, lse)
    wdq, wdk, wdv = torch.autograd.grad(want, leaves, g)
    for name, a, w, t in (("dQ", dq, wdq, q), ("dK", dk, wdk, k), ("dV", dv, wdv, v)):
        assert a.shape == t.shape and a.stride() == t.stride(), name
        assert not a.isnan().any(), name
        # (The LSE goes through fp32, as the kernels keep it: that bounds the agreement.)
        torch.testing.assert_close(a, w, atol=1e-5, rtol=1e-5, msg=name)
    # Exact zeros where the conventions say so, by position: rows that see no key (padding rows
    # among them) O = 0, dQ = 0; keys no row sees (padding keys among them) dK = dV = 0.
    rows, keys = _nothing_flows(packing, lq, lkv, mask_args(mask))
    assert rows and keys
    for b, i in rows:
        assert (_row(o, layout, b, i) == 0).all() and (_row(dq, layout, b, i) == 0).all(), (b, i)
    for b, j in keys:
        assert (_row(dk, layout, b, j) == 0).all() and (_row(dv, layout, b, j) == 0).all(), (b, j)


def _row(t, layout, b, i):
    return t[i] if b is None else _to_bhsd(t, layout)[b, :, i]


def _nothing_flows(packing, lq, lkv, margs):
    """By brute force: the (batch or None, row) of every query row that sees no key and of
    every key no row sees, padding included."""
    rows, keys = [], []
    start_q = start_kv = 0
    for b, (n, m) in enumerate(zip(lq, lkv)):
        ok = allowed(n, m, margs)
        if packing == "packed":
            rows += [(None, start_q + i) for i in range(n) if not ok[i].any()]
            keys += [(None, start_kv + j) for j in range(m) if not ok[:, j].any()]
            start_q, start_kv = start_q + n, start_kv + m
            continue
        q0 = 0 if packing == "right" else _PS_Q - n
        k0 = 0 if packing == "right" else _PS_KV - m
        rows += [(b, i) for i in range(_PS_Q) if not (q0 <= i < q0 + n and ok[i - q0].any())]
        keys += [(b, j) for j in range(_PS_KV) if not (k0 <= j < k0 + m and ok[:, j - k0].any())]
    return rows, keys


def test_no_running_sequence_gives_empty_results_without_a_kernel():
    q, k, v = rand(2, 3, 2, 8), rand(2, 4, 2, 8), rand(2, 4, 2, 8)
    call = apt._Call(q, k, v, 1, 0, -1, -1, False, 0.3, 0.0, True, 0.0, 0, 1, (0, 2), (3, 0))

    class NoKernel(_kernel_runners._FlashRunner):
        def _kernel_forward(self, *a):
            raise AssertionError("no kernel call")

        _kernel_backward = _kernel_forward

    r = NoKernel(call)
    o, lse = r.forward(q, k, v)
    assert (o == 0).all() and torch.isneginf(lse).all() and lse.shape == (2, 2, 3)
    assert all((t == 0).all() for t in r.backward(torch.ones_like(o), q, k, v, o, lse))


# ---------------------------------------------------------------------------------------------
# The gates.


def _call16(packing, lq, lkv, mask=1, br=False, wl=-1, wr=0, hkv=2, softcap=0.0, softmax=0):
    if packing == 3:
        q, k, v = (t.half() for t in (rand(sum(lq), 2, 8), rand(sum(lkv), hkv, 8), rand(sum(lkv), hkv, 8)))
        layout = 3
    else:
        q, k, v = (t.half() for t in (rand(len(lq), 6, 2, 8), rand(len(lq), 6, hkv, 8), rand(len(lq), 6, hkv, 8)))
        layout = 1
    mask = 2 if mask and br else mask  # the op's mask index: causal bottom-right is 2
    return apt._Call(q, k, v, layout, mask, wl, wr, br, 0.3, 0.0, True, softcap, softmax, packing, lq, lkv)


@needs_varlen
def test_gates_admit_lengths_and_refuse_what_the_kernels_do_not_do():
    flash, eff = apt._TORCH_EXECUTORS["torch_flash"], apt._TORCH_EXECUTORS["torch_efficient"]
    for packing in (1, 2, 3):
        # Bottom-right: FlashAttention per sequence; the memory-efficient kernel only where every
        # running sequence is square (its own bottom-right is not per sequence).
        call = _call16(packing, (6, 2, 0), (4, 6, 3), br=True)
        assert flash.check(call) is None and "sequence 0: 6 and 4" in (eff.check(call) or "")
        call = _call16(packing, (6, 2, 0), (6, 2, 3), br=True)
        assert flash.check(call) is None and eff.check(call) is None
        # Top-left where a running sequence has s_q != s_kv: FlashAttention's diagonal differs.
        call = _call16(packing, (6, 2, 0), (6, 5, 3))
        assert "sequence 1: 2 and 5" in (flash.check(call) or "") and eff.check(call) is None
        # ... but not where every running sequence is square (sequence 2 has no query row).
        call = _call16(packing, (6, 2, 0), (6, 2, 3))
        assert flash.check(call) is None
        # A window: FlashAttention only.
        call = _call16(packing, (6, 2, 1), (6, 4, 3), br=True, wl=2)
        assert flash.check(call) is None and "window" in (eff.check(call) or "")
        # GQA: not the memory-efficient kernel (its manifest).
        call = _call16(packing, (6, 2, 1), (6, 4, 3), br=True, hkv=1)
        assert flash.check(call) is None and eff.check(call) is not None
        # Soft-capping and sinks stay refused (the manifests).
        for kw, words in ((dict(softcap=2.0), "soft-capping"), (dict(softmax=1), "sink")):
            call = _call16(packing, (6, 2, 1), (6, 4, 3), br=True, **kw)
            for ex in (flash, eff):
                assert words in (ex.check(call) or ""), (ex.name, kw, ex.check(call))
    # torch_cudnn serves no lengths.
    call = _call16(1, (6, 2), (6, 4), mask=0, wr=-1)
    assert "per-sequence lengths" in (apt._TORCH_EXECUTORS["torch_cudnn"].check(call) or "")
    # The kernels run on CUDA only: never for CPU tensors.
    assert flash.available(torch.device("cpu"))[0] is False and eff.available(torch.device("cpu"))[0] is False


@pytest.mark.skipif(VARLEN_ON, reason="needs ATTN_POLICY_TORCH_VARLEN=0 (bindings/test.sh sets it)")
def test_lengths_are_refused_where_switched_off_naming_the_variable():
    for name in ("torch_flash", "torch_efficient"):
        for packing in (1, 2, 3):
            call = _call16(packing, (6, 2, 1), (6, 4, 3), br=True)
            why = apt._TORCH_EXECUTORS[name].check(call) or ""
            assert "per-sequence lengths" in why and "ATTN_POLICY_TORCH_VARLEN=0" in why, (name, why)
