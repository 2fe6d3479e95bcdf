"""``torch_flash`` and ``torch_efficient`` on padded (right, left) and packed (THD) batches, on a
CUDA GPU (skipped without one): each through a pack whose every chain is ``[that executor]``,
over packing x mask (none, causal top-left, causal bottom-right, window) x MHA/GQA x bf16/fp16 x
head dim 64/128, with mixed lengths (a full-length sequence, a length-1 one, s_q != s_kv both
ways, one without keys), clean and with NaN in the inputs' padding rows (and a NaN-filled
allocator cache, so a stale output buffer would show). O, LSE, dQ, dK, dV by the FlashAttention
criterion against float64 (tests/test_torch_features.py's reference), the padding conventions
exactly. What an executor cannot do is declined, with its reason (a top-left mask on
FlashAttention and a bottom-right one on the memory-efficient kernel where a sequence has
s_q != s_kv, windows and GQA on the memory-efficient kernel).

Skipped where ``ATTN_POLICY_TORCH_VARLEN=0`` switches the path off. Run with ``-s`` to see the table (one line per case: executor, case, err/naive-err of each
output); ``GPU_SUMMARY=path`` appends it to a file."""

import os
import sys
from pathlib import Path

import pytest
from _summary import Rows

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
# The executors serve lengths unless switched off (read once per process by the manifests);
# tests/test_torch_varlen.py checks the refusal where switched off.
if os.environ.get("ATTN_POLICY_TORCH_VARLEN") == "0":
    pytest.skip("ATTN_POLICY_TORCH_VARLEN=0 switches the path off", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_torch_features import _cu, _to_bhsd, rand, reference  # noqa: E402
from test_torch import pack_with_chains  # noqa: E402

import attn_policy  # noqa: E402
import attn_policy.torch as apt  # noqa: E402

DEV = torch.device("cuda", 0)
ROWS = Rows()
note = ROWS.note
EXECUTORS = ("torch_flash", "torch_efficient")



def teardown_module(module):
    ROWS.write()


@pytest.fixture(scope="module")
def only(tmp_path_factory):
    """executor -> a te pack copy whose every chain is ``[executor]``."""
    backends = attn_policy.Policy.load("te").backend_names
    return {e: pack_with_chains(tmp_path_factory.mktemp(e), {b: [e] for b in backends}) for e in EXECUTORS}


# (is_causal, diagonal, window)
MASKS = {
    "none": (False, "top_left", None),
    "causal-tl": (True, "top_left", None),
    "causal-br": (True, "bottom_right", None),
    "window": (True, "bottom_right", (16, 0)),
}
LAYOUT = {"right": "bshd", "left": "sbhd", "packed": "thd"}
S = 128  # the padded tensors' extent
# A full-length sequence, a length-1 one, s_kv > s_q, s_q > s_kv (its first rows see no key with a
# bottom-right diagonal), one without keys (every row empty), one without query rows.
LQ, LKV = [128, 1, 77, 40, 9, 0], [128, 1, 90, 33, 0, 50]
# FlashAttention's top-left mask: every running sequence square (the last two do not run).
LKV_SQUARE = [128, 1, 77, 40, 0, 50]


def _lengths(executor, mask):
    # The diagonal an executor does not apply per sequence runs on square sequences only.
    other = (executor, mask) in (("torch_flash", "causal-tl"), ("torch_efficient", "causal-br"))
    return LQ, (LKV_SQUARE if other else LKV)


def _tensors(packing, hq, hkv, d, lq, lkv, seed):
    """Q, K, V (float64, CPU) of the case, random everywhere (padding rows included)."""
    if packing == "packed":
        return [rand(sum(lq), hq, d, seed=seed), rand(sum(lkv), hkv, d, seed=seed + 1),
                rand(sum(lkv), hkv, d, seed=seed + 2)]
    shape = {"bshd": lambda h: (len(lq), S, h, d), "sbhd": lambda h: (S, len(lq), h, d)}[LAYOUT[packing]]
    return [rand(*shape(hq), seed=seed), rand(*shape(hkv), seed=seed + 1), rand(*shape(hkv), seed=seed + 2)]


def _padding_rows(packing, lens, other, n_rows):
    """Per sequence, the rows of a Q (or K/V) tensor that are padding: padded, ``(b, slice)``
    in ``[b, h, s, d]`` coordinates; packed, the tokens of sequences that do not run (no key
    for Q, no query for K/V) as ``(None, slice)``."""
    out = []
    if packing == "packed":
        start = 0
        for n, m in zip(lens, other):
            if not m and n:
                out.append((None, slice(start, start + n)))
            start += n
        return out
    for b, n in enumerate(lens):
        pad = slice(n, n_rows) if packing == "right" else slice(0, n_rows - n)
        if pad.stop > pad.start:
            out.append((b, pad))
    return out


def _set_rows(t, layout, rows, value):
    for b, sl in rows:
        if b is None:
            t[sl] = value
        else:
            _to_bhsd(t, layout)[b, :, sl] = value


def _rows_of(t, layout, b, sl):
    return t[sl] if b is None else _to_bhsd(t, layout)[b, :, sl]


def _stale_allocator():
    # Fill the caching allocator's free blocks with NaN: an output not fully written would show.
    junk = torch.full((64 << 20,), float("nan"), dtype=torch.float32, device=DEV)
    del junk


GRID = [(e, p, m, h, dt, d, nan) for e in EXECUTORS for p in ("right", "left", "packed") for m in MASKS
        for h in ("mha", "gqa") for dt in ("bf16", "fp16") for d in (64, 128) for nan in (False, True)
        if not (nan and d == 128)]


@pytest.mark.parametrize("executor,packing,mask,heads,dtype,d,nan", GRID,
                         ids=["-".join(str(x) for x in c[:-1]) + ("-nanpad" if c[-1] else "") for c in GRID])
def test_varlen_on_cuda(only, executor, packing, mask, heads, dtype, d, nan):
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    hq, hkv = (8, 8) if heads == "mha" else (8, 2)
    causal, diagonal, window = MASKS[mask]
    layout = LAYOUT[packing]
    lq, lkv = _lengths(executor, mask)
    seed = 100 + GRID.index((executor, packing, mask, heads, dtype, d, nan))
    x64 = _tensors(packing, hq, hkv, d, lq, lkv, seed)
    kw = dict(layout=layout, is_causal=causal, diagonal=diagonal, window=window)
    rkw = dict(causal=causal, bottom_right=diagonal == "bottom_right", window=window)
    if packing == "packed":
        kw.update(cu_seqlens_q=torch.tensor(_cu(lq), dtype=torch.int32, device=DEV),
                  cu_seqlens_kv=torch.tensor(_cu(lkv), dtype=torch.int32, device=DEV))
        rkw.update(cu_q=_cu(lq), cu_kv=_cu(lkv))
        pk = 3
    else:
        kw.update(seqlens_q=lq, seqlens_kv=lkv, padding=packing)
        rkw.update(lens_q=lq, lens_kv=lkv, padding=packing)
        pk = 1 if packing == "right" else 2
    qpad = _padding_rows(packing, lq, lkv, S)
    kpad = _padding_rows(packing, lkv, lq, S)
    ours = [t.to(dt).to(DEV) for t in x64]
    if nan:
        # The inputs' padding rows: real code must not read them.
        _set_rows(ours[0], layout, qpad, float("nan"))
        for t in ours[1:]:
            _set_rows(t, layout, kpad, float("nan"))
        assert all(t.isnan().any() for t in ours)
        _stale_allocator()
    ours = [t.requires_grad_(True) for t in ours]
    policy = only[executor]
    apt.clear_cache()

    refused = None
    if executor == "torch_efficient" and (hq != hkv or window is not None):
        refused = "window" if window is not None else "GQA"
    if refused:
        with pytest.raises(attn_policy.PolicyError) as e:
            apt.attention(*ours, policy=policy, **kw)
        note(f"| {executor} | {packing} {mask} {heads} {dtype} d{d}{' nanpad' if nan else ''} | declined: "
             f"{str(e.value)[:80]} |")
        return
    o, dec = apt.attention(*ours, policy=policy, return_decision=True, **kw)
    assert dec.executor == executor and not dec.substitute, dec.summary()
    g = rand(*o.shape, seed=seed + 7).to(dt).to(DEV)
    got = [o, *torch.autograd.grad(o, ours, g)]
    # The LSE: through the op, as the CPU tests read it (the same runner, the same O).
    args = apt._op_args(ours[0], layout, causal, diagonal, window, None, 0.0, policy, "raise", False, True)
    o_op, lse = torch.ops.attn_policy.attention(*[t.detach() for t in ours], *args, 0.0, 0, None, pk, list(lq),
                                                list(lkv))
    assert torch.equal(o_op, o.detach())

    clean = [t.to(dt) for t in x64]  # the inputs as the GPU got them, padding not NaN
    ex_in = [t.double().requires_grad_(True) for t in clean]
    exact, exact_lse = reference(*ex_in, layout, with_lse=True, **rkw)
    nv_in = [t.to(DEV).requires_grad_(True) for t in clean]
    naive, naive_lse = reference(*nv_in, layout, with_lse=True, **rkw)
    want = [exact, *torch.autograd.grad(exact, ex_in, g.double().cpu())]
    base = [naive, *torch.autograd.grad(naive, nv_in, g)]
    cells, failures = [], []
    for name, a, w, n in zip(("O", "dQ", "dK", "dV"), got, want, base):
        a64 = a.detach().double().cpu()
        err = (a64 - w).abs().max().item() if not a64.isnan().any() else float("nan")
        naive_err = (n.detach().double().cpu() - w).abs().max().item()
        cells.append(f"{name} {err:.2e}/{naive_err:.2e}")
        if not err <= 2 * naive_err + 1e-6:
            failures.append((name, err, naive_err))
    lse = lse.double().cpu()
    empty = torch.isneginf(exact_lse)
    lse_empty_ok = torch.equal(torch.isneginf(lse), empty)
    fin = ~empty
    err = (lse[fin] - exact_lse[fin]).abs().max().item()
    naive_err = (naive_lse.double().cpu()[fin] - exact_lse[fin]).abs().max().item()
    cells.append(f"LSE {err:.2e}/{naive_err:.2e}{'' if lse_empty_ok else ' (-inf rows differ)'}")
    if not err <= 2 * naive_err + 1e-6:
        failures.append(("LSE", err, naive_err))
    note(f"| {executor} | {packing} {mask} {heads} {dtype} d{d}{' nanpad' if nan else ''} | {'; '.join(cells)} |"
         f"{' FAIL' if failures or not lse_empty_ok else ''}")
    assert not failures, failures
    assert lse_empty_ok, "LSE = -inf exactly in padding rows and rows that see no key"

    # The conventions, exactly: rows that see no key (padding rows among them): O = 0, dQ = 0;
    # padding keys: dK = dV = 0.
    o_c, dq_c, dk_c, dv_c = (t.detach().cpu() for t in got)
    if layout == "thd":
        o_rows, dq_rows = o_c.transpose(0, 1).unsqueeze(0), dq_c.transpose(0, 1).unsqueeze(0)
    else:
        o_rows, dq_rows = _to_bhsd(o_c, layout), _to_bhsd(dq_c, layout)
    assert bool(empty.any())
    assert (o_rows[empty] == 0).all() and (dq_rows[empty] == 0).all()
    for b, sl in kpad:
        assert (_rows_of(dk_c, layout, b, sl) == 0).all() and (_rows_of(dv_c, layout, b, sl) == 0).all()
    for t in (o_c, dq_c, dk_c, dv_c):
        assert not t.isnan().any()


@pytest.mark.parametrize("packing", ["right", "packed"])
@pytest.mark.parametrize("executor,diagonal,words", [
    ("torch_flash", "top_left", "bottom-right in each sequence"),
    ("torch_efficient", "bottom_right", "not per sequence"),
])
def test_a_diagonal_not_applied_per_sequence_is_declined_where_a_sequence_is_not_square(
        only, packing, executor, diagonal, words):
    q, k, v = (t.to(torch.float16).to(DEV) for t in _tensors(packing, 8, 8, 64, LQ, LKV, 5))
    kw = dict(layout=LAYOUT[packing], is_causal=True, diagonal=diagonal)
    if packing == "packed":
        kw.update(cu_seqlens_q=_cu(LQ), cu_seqlens_kv=_cu(LKV))
    else:
        kw.update(seqlens_q=LQ, seqlens_kv=LKV)
    apt.clear_cache()
    with pytest.raises(attn_policy.PolicyError, match=words):
        apt.attention(q, k, v, policy=only[executor], **kw)
