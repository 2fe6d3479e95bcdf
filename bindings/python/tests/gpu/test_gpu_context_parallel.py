"""Context-parallel attention on one CUDA GPU (skipped without one), head_dim 512, GQA, causal,
bfloat16:

1. the whole algorithm in a world of one (NCCL), every cp_comm_type, forward and backward;
2. the p2p ring of 2, 4 and 8 ranks executed in this process on sharded tensors (no
   communication: ``attn_policy.context_parallel.simulate_ring`` runs every rank's steps with the
   blocks, op calls and log-sum-exp merge of ``cp_attention``).

Each result meets the FlashAttention criterion, err(x, fp64) <= 2 * err(naive bf16, fp64) for O,
dQ, dK and dV, and is compared with the single-GPU executor on the whole sequence (its error is
printed next to ours). The work of every rank (executor calls, skipped chunk pairs, admitted
pairs) is printed, and the causal ring must be balanced and skip exactly the masked chunk pairs.

Run on the GPU machine (one command, after installing the wheel as docs/run-h200.md says):

    python3 -m pytest -q -s bindings/python/tests/gpu/test_gpu_context_parallel.py

``GPU_SUMMARY=path`` also writes the tables to a file."""

import math
import socket

import pytest
from _summary import Rows

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import torch.distributed as dist  # noqa: E402

import attn_policy  # noqa: E402
import attn_policy.context_parallel as cp  # noqa: E402
import attn_policy.torch as apt  # noqa: E402

DEV = torch.device("cuda", 0)
B, HQ, HKV, D, S = 1, 8, 2, 512, 8192
LAYOUT = "bshd"
ROWS = Rows()
note = ROWS.note



def teardown_module(module):
    ROWS.write()
    if dist.is_initialized():
        dist.destroy_process_group()


def to_bhsd(t):
    return t.transpose(1, 2)


def math_attention(q, k, v, window_left, dtype, softmax_dtype):
    """Textbook causal attention on bshd tensors with every stored value in ``dtype`` (softmax
    in ``softmax_dtype``), GQA by repetition; a left window when >= 0."""
    q, k, v = (to_bhsd(t).to(dtype) for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(D))
    i = torch.arange(S, device=q.device).unsqueeze(1)
    j = torch.arange(S, device=q.device).unsqueeze(0)
    allowed = j <= i
    if window_left >= 0:
        allowed &= j >= i - window_left
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s.to(softmax_dtype), -1).to(dtype)
    return (p @ v).transpose(1, 2)


def with_grads(fn, q, k, v, do):
    qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    o = fn(qq, kk, vv)
    o.backward(do.to(o.dtype))
    return {"o": o.detach(), "dq": qq.grad, "dk": kk.grad, "dv": vv.grad}


def references(window_left):
    g = torch.Generator(device=DEV).manual_seed(17 + window_left)
    q = torch.randn(B, S, HQ, D, device=DEV, generator=g).to(torch.bfloat16)
    k = torch.randn(B, S, HKV, D, device=DEV, generator=g).to(torch.bfloat16)
    v = torch.randn(B, S, HKV, D, device=DEV, generator=g).to(torch.bfloat16)
    do = torch.randn(B, S, HQ, D, device=DEV, generator=g).to(torch.bfloat16)
    exact = with_grads(lambda a, b, c: math_attention(a, b, c, window_left, torch.float64, torch.float64),
                       q.double(), k.double(), v.double(), do.double())
    naive = with_grads(lambda a, b, c: math_attention(a, b, c, window_left, torch.bfloat16, torch.float32),
                       q, k, v, do)
    window = (window_left, 0) if window_left >= 0 else None
    single = with_grads(lambda a, b, c: apt.attention(a, b, c, layout=LAYOUT, is_causal=True, window=window),
                        q, k, v, do)
    _, single_decision = apt.attention(q, k, v, layout=LAYOUT, is_causal=True, window=window, return_decision=True)
    return dict(q=q, k=k, v=v, do=do, exact=exact, naive=naive, single=single, window=window,
                single_executor=single_decision.executor)


@pytest.fixture(scope="module")
def causal():
    return references(-1)


@pytest.fixture(scope="module")
def windowed():
    return references(1024)


def criterion(label, got, ref):
    """Asserts the FlashAttention criterion for O and the gradients; prints errors next to the
    single-GPU executor's."""
    worst = 0.0
    for t in ("o", "dq", "dk", "dv"):
        exact = ref["exact"][t]
        err = (got[t].double() - exact).abs().max().item()
        naive = (ref["naive"][t].double() - exact).abs().max().item()
        single = (ref["single"][t].double() - exact).abs().max().item()
        vs_single = (got[t].double() - ref["single"][t].double()).abs().max().item() / ref["single"][t].double().abs().max().item()
        worst = max(worst, err / naive)
        note(f"  {label:<28} {t:<3} err {err:.3e}  naive bf16 {naive:.3e}  single-GPU {single:.3e}  "
             f"ratio {err / naive:.2f}  rel vs single {vs_single:.1e}")
        assert err <= 2 * naive, f"{label} {t}: err {err} > 2 x naive {naive}"
    return worst


def init_world_of_one():
    if dist.is_initialized():
        return
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            device_id=DEV)


def test_world_of_one_every_comm_type(causal):
    init_world_of_one()
    note(f"== context parallel, world of 1 (NCCL), b{B} hq{HQ} hkv{HKV} d{D} s{S} causal bf16 {LAYOUT}; "
         f"single-GPU executor: {causal['single_executor']}")
    for comm in cp.COMM_TYPES:
        group = (dist.group.WORLD, dist.group.WORLD) if comm == "a2a+p2p" else dist.group.WORLD
        kw = dict(cp_group=group, cp_comm_type=comm, layout=LAYOUT, is_causal=True)
        got = with_grads(lambda a, b, c: cp.cp_attention(a, b, c, **kw), causal["q"], causal["k"], causal["v"], causal["do"])
        with torch.no_grad():
            _, d = cp.cp_attention(causal["q"], causal["k"], causal["v"], return_decision=True, **kw)
        note(f"  {comm}: {d.summary()}")
        criterion(f"world 1 {comm}", got, causal)


@pytest.mark.parametrize("pack", ["native", "te"])
def test_the_native_and_te_packs_run_the_fused_kernels_per_step(causal, pack):
    """With the native pack, or the te pack (its UnfusedDotProductAttention chain runs `fused`
    where the kernel admits the step), on an sm90 GPU the pre-flight selects the fused backend
    and every per-step call runs the fused kernels. Inference (torch.no_grad()): O meets the
    FlashAttention criterion in a world of one (p2p and a2a) and p2p rings of 2, 4 and 8
    simulated in this process. Training: O, dQ, dK and dV meet it (world of one, p2p)."""
    if torch.cuda.get_device_capability(DEV) != (9, 0):
        pytest.skip("the fused kernel runs on sm90 only")
    native = attn_policy.Policy.load(pack)
    init_world_of_one()
    exact = causal["exact"]["o"]
    bound = 2 * (causal["naive"]["o"].double() - exact).abs().max().item()
    note(f"== inference (no_grad) through the {pack} pack, d{D} GQA causal bf16 s{S}")
    for comm in ("p2p", "a2a"):
        with torch.no_grad():
            o, d = cp.cp_attention(causal["q"], causal["k"], causal["v"], cp_group=dist.group.WORLD, cp_comm_type=comm,
                                   layout=LAYOUT, is_causal=True, policy=native, return_decision=True)
        err = (o.double() - exact).abs().max().item()
        note(f"  {comm}: {d.summary()}; O err {err:.3e} (2 x naive bf16 {bound:.3e})")
        assert d.preflight is not None and d.preflight.selected == "fused", d.summary()
        assert {s.executor for s in d.steps} == {"fused"}, d.summary()
        assert err <= bound
    for ring in (2, 4, 8):
        with torch.no_grad():
            r = cp.simulate_ring(causal["q"], causal["k"], causal["v"], ring, layout=LAYOUT, is_causal=True,
                                 policy=native)
        err = (r["o"].double() - exact).abs().max().item()
        note(f"  ring of {ring} in one process: executors {r['executors']}; O err {err:.3e} "
             f"(2 x naive bf16 {bound:.3e})")
        assert r["executors"] == ["fused"], r["executors"]
        assert err <= bound
    note(f"== training through the {pack} pack, d{D} GQA causal bf16 s{S}")
    kw = dict(cp_group=dist.group.WORLD, cp_comm_type="p2p", layout=LAYOUT, is_causal=True, policy=native)
    got = with_grads(lambda a, b, c: cp.cp_attention(a, b, c, **kw), causal["q"], causal["k"], causal["v"], causal["do"])
    qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (causal["q"], causal["k"], causal["v"]))
    _, d = cp.cp_attention(qq, kk, vv, return_decision=True, **kw)
    note(f"  p2p: {d.summary()}")
    assert d.preflight is not None and d.preflight.selected == "fused", d.summary()
    assert {s.executor for s in d.steps} == {"fused"}, d.summary()
    criterion(f"{pack} pack, world 1 p2p", got, causal)


def report_work(label, work, heads):
    """Prints every rank's steps and returns (calls, skipped pairs, admitted pairs) per rank."""
    note(f"  work per rank ({label}): rank: calls per step | chunk pairs skipped | admitted pairs x b x hq")
    out = []
    for r, steps in enumerate(work):
        calls = [len(s.blocks) for s in steps]
        skipped = sum(s.pairs_skipped for s in steps)
        pairs = sum(s.pairs() for s in steps) * B * heads
        kinds = " ".join("+".join(b.kind for b in s.blocks) or "-" for s in steps)
        note(f"    rank {r}: {calls} | {skipped} | {pairs:,}   ({kinds})")
        out.append((sum(calls), skipped, pairs))
    return out


@pytest.mark.parametrize("cp_size", [2, 4, 8])
def test_ring_steps_in_one_process(causal, cp_size):
    # The te pack (issue 34): its UnfusedDotProductAttention chain runs `fused` per step, forward
    # and backward (the backward steps run the forward steps' decisions).
    r = cp.simulate_ring(causal["q"], causal["k"], causal["v"], cp_size, layout=LAYOUT, is_causal=True,
                         grad_out=causal["do"], policy=attn_policy.Policy.load("te"))
    note(f"== p2p ring of {cp_size} in one process (sharded tensors, no communication), d{D} GQA causal bf16, "
         f"te pack: executors {r['executors']}")
    criterion(f"ring {cp_size}", r, causal)
    if torch.cuda.get_device_capability() == (9, 0):
        assert r["executors"] == ["fused"], r["executors"]
    per_rank = report_work(f"ring {cp_size}", r["work"], HQ)
    # Balanced: every rank computes the same number of admitted pairs; step 0 is one causal
    # call (the upper chunk pair skipped), every other step one full call over two of its four
    # chunk pairs (the two masked ones skipped).
    assert len({p for _, _, p in per_rank}) == 1, per_rank
    assert all(c == cp_size and s == 1 + 2 * (cp_size - 1) for c, s, _ in per_rank), per_rank
    assert sum(p for _, _, p in per_rank) == B * HQ * S * (S + 1) // 2


def test_ring_with_a_sliding_window_skips_whole_steps(windowed):
    cp_size = 8
    r = cp.simulate_ring(windowed["q"], windowed["k"], windowed["v"], cp_size, layout=LAYOUT, is_causal=True,
                         window=windowed["window"], grad_out=windowed["do"])
    note(f"== p2p ring of {cp_size} in one process, sliding window {windowed['window']} causal")
    criterion(f"ring {cp_size} window", r, windowed)
    report_work(f"ring {cp_size} window", r["work"], HQ)
    empty = sum(1 for steps in r["work"] for s in steps if not s.blocks)
    note(f"  steps without any call (every chunk pair outside the window): {empty} of {cp_size * cp_size}")
    assert empty > 0
