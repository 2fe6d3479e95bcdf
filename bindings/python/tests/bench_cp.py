"""Context-parallel attention timing, one process per GPU, world size from torchrun:

    torchrun --nproc-per-node 2 bindings/python/tests/bench_cp.py --seqlen 65536 --head-dim 512 \\
        --heads 8 --kv-heads 2 --causal                         # 2 GPUs, NCCL, bf16
    torchrun --nproc-per-node 1 bindings/python/tests/bench_cp.py --device cpu --dtype float32 \\
        --seqlen 256 --head-dim 32 --iters 2 --warmup 1        # dry run: 1 rank, gloo, CPU

For each ``cp_comm_type`` (a2a+p2p for every factorisation of the world size; a2a where the
head counts divide) rank 0 prints the forward and forward+backward time per step (the slowest
rank's median over ``--iters``) and the achieved TFLOP/s per GPU: the FLOPs of the admitted
(query, key) pairs of the whole call (forward 2 GEMMs, backward 5, as ``adapters/src/problem.rs``
counts them) divided by the world size and by that time. Without torchrun it runs as a world of
one. The numbers are measurements of this run only; nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import attn_policy.context_parallel as cp


def admitted_pairs(sq: int, skv: int, causal: bool, bottom_right: bool, window) -> int:
    """Admitted (query, key) pairs of the whole call, per head (closed form per row)."""
    off = skv - sq if bottom_right else 0
    left = -1 if window is None else window[0]
    right = 0 if causal else (-1 if window is None else window[1])
    total = 0
    for i in range(sq):
        lo = 0 if left < 0 else max(0, i + off - left)
        hi = skv - 1 if right < 0 else min(skv - 1, i + off + right)
        total += max(0, hi - lo + 1)
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32", "float64"], default="bfloat16")
    ap.add_argument("--seqlen", type=int, default=32768, help="global sequence length (q and kv)")
    ap.add_argument("--seqlen-kv", type=int, default=None)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=512)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--window", type=int, nargs=2, default=None, metavar=("LEFT", "RIGHT"))
    ap.add_argument("--layout", choices=["bshd", "sbhd", "bhsd"], default="bshd")
    ap.add_argument("--comm", nargs="*", default=None, help="comm types (default: all that apply)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    if a.device == "cuda":
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        backend = "nccl"
    else:
        dev = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600))
    dtype = getattr(torch, a.dtype)
    sq, skv = a.seqlen, a.seqlen_kv or a.seqlen
    sd = {"bhsd": 2, "bshd": 1, "sbhd": 0}[a.layout]

    def local_tensor(heads: int, s: int) -> torch.Tensor:
        shape = {"bhsd": (a.batch, heads, s // world, a.head_dim), "bshd": (a.batch, s // world, heads, a.head_dim),
                 "sbhd": (s // world, a.batch, heads, a.head_dim)}[a.layout]
        return torch.randn(shape, dtype=dtype, device=dev)

    comms = a.comm or ["p2p", "all_gather", "a2a", "a2a+p2p"]
    runs = []
    for comm in comms:
        if comm == "a2a+p2p":
            runs += [(comm, (x, world // x)) for x in range(1, world + 1) if world % x == 0]
        else:
            runs.append((comm, None))
    pairs = admitted_pairs(sq, skv, a.causal, False, tuple(a.window) if a.window else None)
    fwd_flops = 2.0 * a.batch * a.heads * pairs * (2 * a.head_dim)
    bwd_flops = 2.0 * a.batch * a.heads * pairs * (5 * a.head_dim)
    rows = []
    for comm, grid in runs:
        if grid is not None:
            A, P = grid
            ga = gp = None
            for p in range(P):
                g = dist.new_group([p * A + x for x in range(A)])
                if rank // A == p:
                    ga = g
            for x in range(A):
                g = dist.new_group([p * A + x for p in range(P)])
                if rank % A == x:
                    gp = g
            group = (ga, gp)
            name = f"a2a+p2p {A}x{P}"
        else:
            group = dist.group.WORLD
            name = comm
        q = local_tensor(a.heads, sq).requires_grad_(True)
        k = local_tensor(a.kv_heads, skv).requires_grad_(True)
        v = local_tensor(a.kv_heads, skv).requires_grad_(True)
        do = torch.randn(q.shape, dtype=dtype, device=dev)
        kw = dict(cp_group=group, cp_comm_type=comm, layout=a.layout, is_causal=a.causal,
                  window=tuple(a.window) if a.window else None)

        def sync():
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)

        def fwd():
            with torch.no_grad():
                return cp.cp_attention(q, k, v, **kw)

        def fwd_bwd():
            o = cp.cp_attention(q, k, v, **kw)
            o.backward(do)

        try:
            with torch.no_grad():
                _, decision = cp.cp_attention(q, k, v, return_decision=True, **kw)
        except (cp.ContextParallelDeclined, cp.ShardMismatch) as e:
            rows.append((name, None, None, str(e).split(": ", 1)[-1][:90], ""))
            continue
        times = {}
        for label, fn in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
            samples = []
            for i in range(a.warmup + a.iters):
                sync()
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                sync()
                dt = time.perf_counter() - t0
                if i >= a.warmup:
                    samples.append(dt)
            med = torch.tensor([statistics.median(samples)], dtype=torch.float64,
                               device=dev if backend == "nccl" else "cpu")
            dist.all_reduce(med, op=dist.ReduceOp.MAX)  # the slowest rank sets the step time
            times[label] = med.item()
        calls = sum(len(s.blocks) for s in decision.work)
        executors = ",".join(sorted({d.executor or "-" for d in decision.steps}))
        rows.append((name, times["fwd"], times["fwd+bwd"], f"{calls} calls/rank", executors))

    if rank == 0:
        print(f"context-parallel bench: world {world} ({backend}, {a.device}), {a.dtype}, {a.layout}, b{a.batch} "
              f"hq{a.heads} hkv{a.kv_heads} d{a.head_dim}, seqlen {sq}/{skv} global, "
              f"{'causal' if a.causal else 'no mask'}{', window ' + str(tuple(a.window)) if a.window else ''}; "
              f"median of {a.iters} after {a.warmup} warm-up")
        print(f"{'comm':<16} {'fwd ms':>10} {'fwd+bwd ms':>11} {'fwd TF/s/GPU':>13} {'f+b TF/s/GPU':>13}  work, executors")
        for name, tf, tfb, note, ex in rows:
            if tf is None:
                print(f"{name:<16} {'-':>10} {'-':>11} {'-':>13} {'-':>13}  declined: {note}")
                continue
            print(f"{name:<16} {tf * 1e3:>10.2f} {tfb * 1e3:>11.2f} {fwd_flops / world / tf / 1e12:>13.2f} "
                  f"{(fwd_flops + bwd_flops) / world / tfb / 1e12:>13.2f}  {note}, {ex}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
