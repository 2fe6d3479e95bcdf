"""PyTorch's cuDNN SDPA backend on the same shapes as bench_cudnn (b2 hq8 hkv4 causal bf16, bhsd),
timed the same way (CUDA events around back-to-back calls, median of 5 repeats).
Usage: python3 torch_sdpa_cudnn.py [--iters N] [--json PATH]"""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

iters = int(sys.argv[sys.argv.index("--iters") + 1]) if "--iters" in sys.argv else 20
out = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
print(f"torch {torch.__version__}, cudnn {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}", flush=True)


def time_ms(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        per.append(a.elapsed_time(b) / iters)
    return sorted(per)[2]


rows = []
B, HQ, HKV = 2, 8, 4
print(f"{'d':>4} {'s':>6} | {'fwd ms':>9} {'TFLOP/s':>8} | {'bwd ms':>9} | {'fwd+bwd ms':>10}")
for d in (128, 256):
    for s in (4096, 16384):
        q = torch.randn(B, HQ, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(B, HKV, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(B, HKV, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        g = torch.randn(B, HQ, s, d, device="cuda", dtype=torch.bfloat16)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
            fwd = time_ms(f)  # with autograd on, as training runs it (LSE computed)
            o = f()
            bwd = time_ms(lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True))
        flops = 4 * B * HQ * s * (s + 1) / 2 * d
        print(f"{d:>4} {s:>6} | {fwd:>9.3f} {flops / fwd / 1e9:>8.0f} | {bwd:>9.3f} | {fwd + bwd:>10.3f}", flush=True)
        rows.append(dict(d=d, s=s, fwd_ms=fwd, bwd_ms=bwd))
        del q, k, v, g, o
        torch.cuda.empty_cache()
if out:
    json.dump(rows, open(out, "w"), indent=1)
