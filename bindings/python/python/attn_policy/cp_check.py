"""Self-check of context-parallel attention on this machine:

    python -m attn_policy.cp_check --world-size 4 --device cpu     # gloo, float64, 4 processes
    python -m attn_policy.cp_check --world-size 2 --device cuda    # NCCL, bfloat16, 2 GPUs

Spawns ``--world-size`` ranks (gloo on CPU, NCCL on GPUs, one GPU per rank), runs every
``cp_comm_type`` (a2a+p2p for every factorisation of the world size) forward and backward on
sharded inputs, compares each rank's shard of O, dQ, dK and dV with the single-process
``attn_policy.torch.attention`` on the whole sequence, checks that mismatched shards are refused
on every rank, prints a table and exits 0 only when every row passes.

Criteria: float64 (CPU default): max |cp - single| <= 1e-10 * max |single| per tensor. 16-bit
(GPU default bfloat16): the FlashAttention criterion, err(cp, fp64) <= 2 * err(naive same-dtype,
fp64), per tensor, the float64 oracle being textbook attention written here.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import socket
import sys
import tempfile
import time
import traceback
from typing import Any, Dict, List, Optional, Sequence, Tuple

REL_TOL_F64 = 1e-10


# ---------------------------------------------------------------------------------------------
# Cases.


def factorizations(n: int) -> List[Tuple[int, int]]:
    """(a2a size, p2p size) pairs with a2a * p2p == n."""
    return [(a, n // a) for a in range(1, n + 1) if n % a == 0]


def default_cases(world_size: int, device: str) -> List[Dict[str, Any]]:
    """Every comm type on causal GQA, rectangular no-mask, bottom-right rectangular and
    sliding-window inputs (heads divisible by the world size, so a2a runs too)."""
    n = world_size
    d = 64 if device == "cuda" else 8
    c = 16 if device == "cuda" else 3  # tokens per chunk
    base = dict(b=2, hq=2 * n, hkv=n, d=d, dv=d)
    shapes = [
        ("causal, GQA", dict(sq=2 * n * c, skv=2 * n * c, causal=True, layout="bshd")),
        ("no mask, GQA, s_kv = 2 s_q", dict(sq=2 * n * c, skv=4 * n * c, causal=False, layout="sbhd")),
        ("causal bottom-right, s_kv = 2 s_q", dict(sq=2 * n * c, skv=4 * n * c, causal=True,
                                                   diagonal="bottom_right", layout="bhsd")),
        ("sliding window (5, 0), causal", dict(sq=2 * n * c, skv=2 * n * c, causal=True, window=(5, 0), layout="bshd")),
    ]
    groups: List[Tuple[str, Any]] = [("p2p", ["world"]), ("all_gather", ["world"]), ("a2a", ["world"])]
    groups += [("a2a+p2p", ["grid", a, p]) for a, p in factorizations(n)]
    cases = []
    for comm, grp in groups:
        for name, shp in shapes:
            cases.append(dict(base, **shp, comm=comm, group=grp, name=name, expect="pass"))
    if n >= 2:  # a world of one has no other shard to differ from
        cases.append(dict(base, sq=2 * n * c, skv=2 * n * c, causal=True, layout="bshd", comm="p2p", group=["world"],
                          name="rank 0's shard is longer", expect="mismatch", rank0_extra_tokens=2))
    # A rank whose own K and V disagree with its Q (batch 1 against 2): refused on every rank
    # as InvalidInput, before any K/V moves (a one-rank world too).
    cases.append(dict(base, sq=2 * n * c, skv=2 * n * c, causal=True, layout="bshd", comm="p2p", group=["world"],
                      name="rank 0's K, V of batch 1", expect="invalid", rank0_kv_batch=1))
    return cases


# ---------------------------------------------------------------------------------------------
# The float64 oracle and the naive same-dtype attention (written here, independent of the
# package) for the 16-bit criterion.


def _allowed(torch, sq, skv, causal, bottom_right, window, device):
    off = skv - sq if bottom_right else 0
    left, right = (-1, -1) if window is None else (window if isinstance(window, tuple) else (window, -1))
    left = -1 if left is None else left
    right = -1 if right is None else right
    if causal:
        right = 0 if right < 0 else min(right, 0)
    i = torch.arange(sq, device=device).unsqueeze(1) + off
    j = torch.arange(skv, device=device).unsqueeze(0)
    ok = torch.ones(sq, skv, dtype=torch.bool, device=device)
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    return ok


def _math(torch, q, k, v, allowed, scale, dtype, softmax_dtype):
    """bhsd attention with every stored value in ``dtype`` (softmax in ``softmax_dtype``); rows
    without keys give 0."""
    q, k, v = (t.to(dtype) for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, 1)
    v = v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s.to(softmax_dtype), -1)
    p = torch.nan_to_num(p, nan=0.0).to(dtype)
    return p @ v


# ---------------------------------------------------------------------------------------------
# One rank.


def _to_bhsd(t, layout):
    return t if layout == "bhsd" else (t.transpose(1, 2) if layout == "bshd" else t.permute(1, 2, 0, 3))


def _from_bhsd(t, layout):
    return t if layout == "bhsd" else (t.transpose(1, 2) if layout == "bshd" else t.permute(2, 0, 1, 3))


def _make_groups(dist, world: int, cases: Sequence[Dict[str, Any]]):
    """Every process group the cases name, created in the same order on every rank."""
    rank = dist.get_rank()
    made: Dict[str, Any] = {}
    for case in cases:
        grp = case["group"]
        key = json.dumps(grp)
        if key in made:
            continue
        if grp[0] == "world":
            made[key] = (dist.group.WORLD, True)
        elif grp[0] == "sub":
            members = list(range(grp[1]))
            g = dist.new_group(members)
            made[key] = (g, rank in members)
        else:  # ["grid", a2a, p2p] over ranks 0 .. a2a*p2p-1, cp rank = p * a2a + a
            a2a, p2p = grp[1], grp[2]
            mine_a = mine_p = None
            for p in range(p2p):
                members = [p * a2a + a for a in range(a2a)]
                g = dist.new_group(members)
                if rank in members:
                    mine_a = g
            for a in range(a2a):
                members = [p * a2a + a for p in range(p2p)]
                g = dist.new_group(members)
                if rank in members:
                    mine_p = g
            made[key] = ((mine_a, mine_p), rank < a2a * p2p)
    return made


def _run_case(torch, apt, cp, case: Dict[str, Any], group, device, dtype) -> Dict[str, Any]:
    """Runs one case on this rank; returns its errors (or what it raised)."""
    layout = case.get("layout", "bshd")
    comm = case["comm"]
    n = cp.cp_size(group, comm)
    r = cp.cp_rank(group, comm)
    b, hq, hkv, sq, skv, d, dv = (case[x] for x in ("b", "hq", "hkv", "sq", "skv", "d", "dv"))
    causal = case.get("causal", False)
    diagonal = case.get("diagonal", "top_left")
    window = case.get("window")
    if isinstance(window, list):
        window = tuple(window)
    g = torch.Generator().manual_seed(case.get("seed", 1234))
    full = {
        "q": torch.randn(b, hq, sq, d, generator=g, dtype=torch.float64),
        "k": torch.randn(b, hkv, skv, d, generator=g, dtype=torch.float64),
        "v": torch.randn(b, hkv, skv, dv, generator=g, dtype=torch.float64),
        "do": torch.randn(b, hq, sq, dv, generator=g, dtype=torch.float64),
    }
    full = {k: _from_bhsd(t, layout).to(dtype).contiguous().to(device) for k, t in full.items()}
    kw = dict(layout=layout, is_causal=causal, diagonal=diagonal, window=window)
    sd = {"bhsd": 2, "bshd": 1, "sbhd": 0}[layout]
    if sq % (2 * n) == 0 and skv % (2 * n) == 0:
        shard = {k: cp.shard_sequence(t, n, r, layout) for k, t in full.items()}
    else:
        # Lengths the sharding cannot split (a case expected to be declined): each rank passes
        # its 1/n of the sequence as it is.
        shard = {k: t.narrow(sd, r * (t.shape[sd] // n), t.shape[sd] // n) for k, t in full.items()}
    if r == 0:
        # Mismatched shards on purpose (cases expected to be refused on every rank).
        if case.get("rank0_extra_tokens"):
            e = case["rank0_extra_tokens"]
            shard = {k: torch.cat([t, t.narrow(sd, 0, e)], dim=sd) for k, t in shard.items()}
        if case.get("rank0_dtype"):
            shard = {k: t.to(getattr(torch, case["rank0_dtype"])) for k, t in shard.items()}
        if case.get("rank0_drop_heads"):
            hd = 1 if layout == "bhsd" else 2
            shard["q"] = shard["q"].narrow(hd, 0, shard["q"].shape[hd] - case["rank0_drop_heads"]).contiguous()
            shard["do"] = shard["do"].narrow(hd, 0, shard["do"].shape[hd] - case["rank0_drop_heads"]).contiguous()
        if case.get("rank0_comm"):
            comm = case["rank0_comm"]
        if case.get("rank0_kv_batch"):
            bd = 1 if layout == "sbhd" else 0
            for x in ("k", "v"):
                shard[x] = shard[x].narrow(bd, 0, case["rank0_kv_batch"]).contiguous()
    q, k, v = (shard[x].clone().requires_grad_(True) for x in ("q", "k", "v"))
    kw["dropout_p"] = case.get("dropout_p", 0.0)
    t0 = time.perf_counter()
    try:
        o = cp.cp_attention(q, k, v, cp_group=group, cp_comm_type=comm, **kw)
        o.backward(shard["do"])
    except cp.ShardMismatch as e:
        return {"raised": "ShardMismatch", "message": str(e)[:300]}
    except cp.ContextParallelDeclined as e:
        return {"raised": "ContextParallelDeclined", "message": str(e)[:300]}
    except apt.InvalidInput as e:
        return {"raised": "InvalidInput", "message": str(e)[:300]}
    secs = time.perf_counter() - t0
    # The single-process result on the whole sequence, sharded like ours.
    fq, fk, fv = (full[x].clone().requires_grad_(True) for x in ("q", "k", "v"))
    kw.pop("dropout_p")
    ref = apt.attention(fq, fk, fv, **kw)
    ref.backward(full["do"])
    want = {"o": ref.detach(), "dq": fq.grad, "dk": fk.grad, "dv": fv.grad}
    got = {"o": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    out: Dict[str, Any] = {"secs": secs}
    for name in want:
        w = cp.shard_sequence(want[name], n, r, layout).double()
        diff = (got[name].double() - w).abs().max().item()
        out[f"rel_{name}"] = diff / max(w.abs().max().item(), 1e-300)
    if dtype != torch.float64:
        # FlashAttention criterion on this shard: err(cp, fp64) <= 2 err(naive same-dtype, fp64).
        allowed = _allowed(torch, sq, skv, causal, diagonal == "bottom_right", window, device)
        scale = 1.0 / math.sqrt(d)
        errs = {}
        for kind, dt, sdt in (("exact", torch.float64, torch.float64), ("naive", dtype, torch.float32)):
            xs = [_to_bhsd(full[x], layout).detach().to(dt).requires_grad_(True) for x in ("q", "k", "v")]
            y = _math(torch, *xs, allowed, scale, dt, sdt)
            y.backward(_to_bhsd(full["do"], layout).to(dt))
            errs[kind] = {"o": _from_bhsd(y.detach(), layout), "dq": _from_bhsd(xs[0].grad, layout),
                          "dk": _from_bhsd(xs[1].grad, layout), "dv": _from_bhsd(xs[2].grad, layout)}
        for name in want:
            exact = cp.shard_sequence(errs["exact"][name], n, r, layout).double()
            naive = cp.shard_sequence(errs["naive"][name], n, r, layout).double()
            out[f"err_{name}"] = (got[name].double() - exact).abs().max().item()
            out[f"naive_{name}"] = (naive - exact).abs().max().item()
    return out


def _worker(rank: int, world: int, device: str, dtype_name: str, port: int, outdir: str,
            cases: List[Dict[str, Any]], timeout_s: int) -> None:
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import attn_policy.context_parallel as cp
    import attn_policy.torch as apt

    dtype = getattr(torch, dtype_name)
    if device == "cuda":
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        backend = "nccl"
    else:
        dev = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    results: List[Dict[str, Any]] = []
    try:
        groups = _make_groups(dist, world, cases)
        for case in cases:
            group, member = groups[json.dumps(case["group"])]
            res: Dict[str, Any] = {}
            if member:
                try:
                    res = _run_case(torch, apt, cp, case, group, dev, dtype)
                except Exception as e:  # noqa: BLE001 - reported in the table
                    res = {"raised": type(e).__name__, "message": f"{e}"[:300], "trace": traceback.format_exc()[-1500:]}
            res["member"] = member
            results.append(res)
            # Keep the ranks in step between cases (a rank stuck in a collective times out).
            dist.barrier()
    finally:
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# Spawning and judging.


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def spawn(world_size: int, device: str, cases: List[Dict[str, Any]], dtype: Optional[str] = None,
          timeout_s: int = 600) -> List[List[Dict[str, Any]]]:
    """Runs ``cases`` on ``world_size`` spawned ranks; returns each rank's results (a list per
    rank, one entry per case). Raises RuntimeError when a rank fails or the run exceeds
    ``timeout_s`` (a hang): the ranks are killed then."""
    import torch.multiprocessing as mp

    dtype = dtype or ("float64" if device == "cpu" else "bfloat16")
    with tempfile.TemporaryDirectory() as outdir:
        ctx = mp.start_processes(_worker, args=(world_size, device, dtype, _free_port(), outdir, cases,
                                                max(30, timeout_s // 2)),
                                 nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"context-parallel check timed out after {timeout_s} s (a hang?)")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        out = []
        for r in range(world_size):
            with open(os.path.join(outdir, f"rank{r}.json")) as f:
                out.append(json.load(f))
        return out


def judge(case: Dict[str, Any], per_rank: Sequence[Dict[str, Any]], dtype: str) -> Tuple[bool, str]:
    """Whether a case passed on every member rank, and a short note."""
    members = [r for r in per_rank if r.get("member")]
    if not members:
        return False, "no rank ran it"
    expect = case.get("expect", "pass")
    raised = {r.get("raised") for r in members}
    if expect in ("mismatch", "declined", "invalid"):
        want = {"mismatch": "ShardMismatch", "declined": "ContextParallelDeclined", "invalid": "InvalidInput"}[expect]
        ok = raised == {want}
        return ok, f"{want} on every rank" if ok else f"expected {want} on every rank, got {sorted(map(str, raised))}"
    if raised != {None}:
        r = next(r for r in members if r.get("raised"))
        return False, f"{r['raised']}: {r.get('message', '')}"
    if dtype == "float64":
        worst = max(r[f"rel_{t}"] for r in members for t in ("o", "dq", "dk", "dv"))
        return worst <= REL_TOL_F64, f"max rel {worst:.1e} (<= {REL_TOL_F64:.0e})"
    ratios = []
    for t in ("o", "dq", "dk", "dv"):
        err = max(r[f"err_{t}"] for r in members)
        naive = max(r[f"naive_{t}"] for r in members)
        ratios.append(err / max(naive, 1e-30))
    worst = max(ratios)
    return worst <= 2.0, f"err/naive max {worst:.2f} (<= 2)"


def table(cases, results, dtype: str) -> Tuple[bool, List[str]]:
    lines = [f"{'comm':<10} {'group':<9} {'case':<36} {'rel o':>8} {'rel dq':>8} {'rel dk':>8} {'rel dv':>8}  result"]
    all_ok = True
    for i, case in enumerate(cases):
        per_rank = [results[r][i] for r in range(len(results))]
        ok, note = judge(case, per_rank, dtype)
        all_ok &= ok
        members = [r for r in per_rank if r.get("member") and "rel_o" in r]
        rel = [max(r[f"rel_{t}"] for r in members) if members else float("nan") for t in ("o", "dq", "dk", "dv")]
        grp = case["group"]
        gname = "world" if grp[0] == "world" else (f"{grp[1]} ranks" if grp[0] == "sub" else f"{grp[1]}x{grp[2]}")
        lines.append(f"{case['comm']:<10} {gname:<9} {case['name'][:36]:<36} "
                     + " ".join(f"{x:>8.1e}" for x in rel) + f"  {'PASS' if ok else 'FAIL'} {note}")
    return all_ok, lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attn_policy.cp_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["float64", "float32", "bfloat16", "float16"], default=None,
                    help="default: float64 on CPU, bfloat16 on CUDA")
    ap.add_argument("--timeout", type=int, default=900, help="seconds before the run counts as a hang")
    ap.add_argument("--json", default=None, help="also write the per-rank results here")
    a = ap.parse_args(argv)
    if a.world_size < 1:
        ap.error("--world-size must be at least 1")
    if a.device == "cuda":
        import torch

        if torch.cuda.device_count() < a.world_size:
            print(f"cp_check: {a.world_size} ranks need {a.world_size} GPUs; {torch.cuda.device_count()} visible",
                  file=sys.stderr)
            return 2
    dtype = a.dtype or ("float64" if a.device == "cpu" else "bfloat16")
    cases = default_cases(a.world_size, a.device)
    t0 = time.perf_counter()
    try:
        results = spawn(a.world_size, a.device, cases, dtype, a.timeout)
    except Exception as e:  # noqa: BLE001 - a failed or hung rank is a failed check
        print(f"cp_check: FAILED: {e}", file=sys.stderr)
        return 1
    ok, lines = table(cases, results, dtype)
    print(f"context-parallel self-check: world size {a.world_size}, {a.device}, {dtype}, "
          f"{'gloo' if a.device == 'cpu' else 'nccl'} ({time.perf_counter() - t0:.1f} s)")
    print("\n".join(lines))
    print("all passed" if ok else "FAILED")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cases": cases, "results": results}, f)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
