"""PyTorch SDPA on the inputs attn-bench wrote (raw 16-bit bshd files), for the comparison table.

Prints one JSON object per line (backend, timings, peak memory, max |diff| against the chunked
executor's O / dQ / dK / dV when their files exist). Run by attn-bench; see docs/executors.md.
"""
import argparse, json, os
import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend

ap = argparse.ArgumentParser()
ap.add_argument("--dir", required=True)
ap.add_argument("--b", type=int, required=True)
ap.add_argument("--hq", type=int, required=True)
ap.add_argument("--hkv", type=int, required=True)
ap.add_argument("--s", type=int, required=True)
ap.add_argument("--d", type=int, required=True)
ap.add_argument("--dtype", default="bf16")
ap.add_argument("--backends", default="efficient_expanded,math")
ap.add_argument("--iters", type=int, default=5)
a = ap.parse_args()
dt = torch.bfloat16 if a.dtype == "bf16" else torch.float16


def load(name, h):
    raw = np.fromfile(os.path.join(a.dir, name), dtype=np.uint16)
    t = torch.from_numpy(raw.view(np.int16)).view(dt).reshape(a.b, a.s, h, a.d)
    return t.cuda().transpose(1, 2).contiguous()  # [b, h, s, d] like the anchor probe


q, k, v, g = load("q.bin", a.hq), load("k.bin", a.hkv), load("v.bin", a.hkv), load("do.bin", a.hq)
ours = {n: load(n + ".bin", a.hkv if n in ("dk", "dv") else a.hq)
        for n in ("o", "dq", "dk", "dv") if os.path.exists(os.path.join(a.dir, n + ".bin"))}


def bench(fn, iters):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


def maxdiff(x, y):
    return (x.float() - y.float()).abs().max().item()


rep = a.hq // a.hkv
for name in a.backends.split(","):
    row = {"backend": name}
    try:
        if name == "math" and a.s > 16384:
            raise RuntimeError("skipped: O(s^2) memory")
        be = {"math": SDPBackend.MATH, "efficient_expanded": SDPBackend.EFFICIENT_ATTENTION,
              "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[name]
        if name == "efficient_expanded":
            kk = k.repeat_interleave(rep, dim=1).detach().requires_grad_(True)
            vv = v.repeat_interleave(rep, dim=1).detach().requires_grad_(True)
            gqa = False
        else:
            kk, vv, gqa = k.detach().requires_grad_(True), v.detach().requires_grad_(True), True
        qq = q.detach().requires_grad_(True)
        torch.cuda.empty_cache()
        with sdpa_kernel([be]):
            f = lambda: F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, enable_gqa=gqa)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
            row["fwd_ms"] = bench(f, a.iters * 2)
            row["fwd_peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20

            def fb():
                o = f(); o.backward(g); qq.grad = kk.grad = vv.grad = None

            torch.cuda.reset_peak_memory_stats()
            row["fwdbwd_ms"] = bench(fb, a.iters)
            row["fwdbwd_peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
            o = f()
            if "o" in ours:
                row["max_diff_o_vs_chunked"] = maxdiff(o, ours["o"])
            if "dq" in ours:
                o.backward(g)
                dk, dv = kk.grad, vv.grad
                if name == "efficient_expanded":  # sum the expanded heads back onto KV heads
                    dk = dk.float().view(a.b, a.hkv, rep, a.s, a.d).sum(2)
                    dv = dv.float().view(a.b, a.hkv, rep, a.s, a.d).sum(2)
                row["max_diff_dq_vs_chunked"] = maxdiff(qq.grad, ours["dq"])
                row["max_diff_dk_vs_chunked"] = maxdiff(dk, ours["dk"])
                row["max_diff_dv_vs_chunked"] = maxdiff(dv, ours["dv"])
                row["max_abs_dq"] = qq.grad.float().abs().max().item()
            del o
    except Exception as ex:  # report, keep going
        row["err"] = (type(ex).__name__ + ": " + str(ex).splitlines()[0])[:200]
    print(json.dumps(row), flush=True)
