"""Large-head-dim attention, side by side through torch: this project's executors and their peers.

    python adapters/bench/peers.py --json peers.json            # the whole table (GPU)
    python adapters/bench/peers.py --s 4096 --d 512 --impl fused,ffpa_triton
    python adapters/bench/peers.py --decode 1,16,64 --s 16384,65536   # decode shapes, forward only

Every row runs in this one process on the same inputs (b2 hq8 hkv4 causal bf16 by default, the
Gemma 4 global layer's shape), through torch:

- ``fused``, ``chunked``, ``cudnn``: ``attn_policy.torch.attention`` with a copy of the ``te``
  pack whose every executor chain is that one executor, and ``no_substitute=True``: what the
  row names is what ran, or the row says why the executor refused the shape;
- ``te``: ``attn_policy.torch.attention`` with the embedded ``te`` pack as it is (its chain
  chooses; the row's note names the executor that ran): what a te-pack user gets;
- ``ffpa_triton``: FFPA (``ffpa-attn`` 0.2.4 from the registry, pure Python) through its Triton
  path (``forward_backend="triton"``); install its wheel with ``pip install --no-deps``;
- ``ffpa_cutedsl``: FFPA's CuTe-DSL backend (needs ``nvidia-cutlass-dsl``; reported as
  unavailable when that is not installed);
- ``sdpa_efficient``: ``torch.nn.functional.scaled_dot_product_attention`` with the
  memory-efficient backend, K and V expanded to the query heads (SDPA has no GQA for it).

``--decode SQ,...``: decode-shaped calls instead, ``SQ`` new queries against ``s`` cached keys
(causal aligned bottom-right, as a KV cache is), forward only (inference has no backward);
FFPA needs equal query and key lengths, so its rows say so.

Columns: median forward and forward+backward milliseconds over ``--iters`` CUDA-event timed
runs (after two warm-ups), TFLOP/s (causal: only admitted pairs count; backward 2.5x the
forward's FLOPs), the peak memory the call allocates beyond its inputs and dO (torch's
allocator: ``max_memory_allocated`` minus what was allocated before), and max |O - O_fused|
as a sanity check of each peer's output. Writes a Markdown table to stdout and, with
``--json``, every row.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

IMPLS = ("te", "fused", "chunked", "cudnn", "ffpa_triton", "ffpa_cutedsl", "sdpa_efficient")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--s", default="4096,16384,32768", help="sequence lengths, comma separated (default 4k,16k,32k)")
    ap.add_argument("--d", default="384,512", help="head dims, comma separated (default 384,512)")
    ap.add_argument("--impl", default=",".join(IMPLS), help=f"rows to run (default all: {', '.join(IMPLS)})")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=8, help="query heads")
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--no-causal", action="store_true", help="no mask (default: causal)")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--iters", type=int, default=10, help="timed runs per figure (median; default 10)")
    ap.add_argument("--decode", metavar="SQ", default="",
                    help="decode shapes: query lengths, comma separated, against --s keys (forward only)")
    ap.add_argument("--json", metavar="FILE", help="write every row as JSON")
    return ap.parse_args(argv)


def te_pack_running(executor: str) -> Any:
    """A copy of the te pack whose every backend's executor chain is ``[executor]``."""
    import attn_policy

    roots = [Path(os.environ["ATTN_POLICY_REPO"])] if os.environ.get("ATTN_POLICY_REPO") else []
    roots += [Path.cwd(), Path(__file__).resolve().parents[2]]
    src = next((r / "rules" / "te" for r in roots if (r / "rules" / "te" / "pack.yaml").exists()), None)
    if src is None:
        raise SystemExit("peers.py needs rules/te: run it from the repository root or set ATTN_POLICY_REPO")
    dst = Path(tempfile.mkdtemp(prefix="peers-")) / "te"
    shutil.copytree(src, dst)
    text = (dst / "pack.yaml").read_text()
    head = text[: text.index("\nexecutors:")]
    tail = text[text.index("\nexecutors:") + 1:]
    # Keep whatever follows the executors section (definitions shown by name, ...).
    rest = ""
    lines = tail.splitlines(keepends=True)[1:]
    for i, line in enumerate(lines):
        if line.strip() and not line.startswith((" ", "#")):
            rest = "".join(lines[i:])
            break
    te = attn_policy.Policy.load("te")
    body = "".join(f"  - backend: {b}\n    chain: [{executor}]\n" for b in te.backend_names)
    (dst / "pack.yaml").write_text(head + "\nexecutors:\n" + body + "\n" + rest)
    return attn_policy.Policy.load(str(dst))


def flops(b: int, hq: int, sq: int, skv: int, d: int, causal: bool) -> float:
    """Forward FLOPs; causal (bottom-right) counts only the admitted (query, key) pairs."""
    if causal:
        pairs = sum(max(0, min(skv, skv - sq + i + 1)) for i in range(sq)) if sq != skv else skv * (skv + 1) / 2
    else:
        pairs = sq * skv
    return 2.0 * b * hq * pairs * (d + d)


def median_ms(fn: Callable[[], Any], iters: int) -> float:
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def peak_extra_mib(fn: Callable[[], Any]) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


class Row:
    """One implementation's forward and backward callables on the shared inputs."""

    def __init__(self, name: str, fwd: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]):
        self.name, self.fwd = name, fwd


# (s_q, s_kv, d) -> the executor the te pack's chain ran (the ``te`` row's note).
RAN: Dict[Any, str] = {}


def make_rows(names: List[str], a: argparse.Namespace) -> Dict[str, Any]:
    """Implementation name -> forward callable ``(q, k, v) -> O`` (bhsd), or the reason it is
    unavailable (a string)."""
    causal = not a.no_causal
    rows: Dict[str, Any] = {}
    for name in names:
        if name in ("fused", "chunked", "cudnn"):
            try:
                import attn_policy.torch as apt

                pol = te_pack_running(name)
            except Exception as e:  # noqa: BLE001 - reported in the row
                rows[name] = f"unavailable: {type(e).__name__}: {e}"
                continue
            rows[name] = (lambda pol: lambda q, k, v: apt.attention(
                q, k, v, layout="bhsd", is_causal=causal, policy=pol,
                diagonal="bottom_right" if q.shape[2] != k.shape[2] else "top_left",
                no_substitute=True))(pol)
        elif name == "te":
            import attn_policy.torch as apt

            def te(q, k, v):
                o, d = apt.attention(q, k, v, layout="bhsd", is_causal=causal, return_decision=True,
                                     diagonal="bottom_right" if q.shape[2] != k.shape[2] else "top_left")
                RAN[(q.shape[2], k.shape[2], q.shape[3])] = str(d.executor)
                return o

            rows[name] = te
        elif name.startswith("ffpa_"):
            try:
                from ffpa_attn import ffpa_attn_func
            except ImportError as e:
                rows[name] = f"unavailable: ffpa-attn is not installed ({e}); pip install --no-deps ffpa_attn-0.2.4-py3-none-any.whl"
                continue
            backend = name.split("_", 1)[1]
            if backend == "cutedsl":
                try:
                    import cutlass  # noqa: F401  (nvidia-cutlass-dsl)
                except ImportError:
                    rows[name] = "unavailable: nvidia-cutlass-dsl is not installed (FFPA's CuTe-DSL backend needs it)"
                    continue
            rows[name] = (lambda be: lambda q, k, v: "FFPA: needs equal query and key lengths" if q.shape[2] != k.shape[2]
                          else ffpa_attn_func(
                q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1], forward_backend=be,
                backward_backend=be))(backend)
        elif name == "sdpa_efficient":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            def sdpa(q, k, v):
                rep = q.shape[1] // k.shape[1]
                ke, ve = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
                sq, skv = q.shape[2], k.shape[2]
                mask = None
                if causal and sq != skv:
                    # SDPA's is_causal is top-left: bottom-right (a KV cache) as an explicit mask.
                    i = torch.arange(sq, device=q.device)[:, None]
                    mask = torch.arange(skv, device=q.device)[None, :] <= i + (skv - sq)
                with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                    return F.scaled_dot_product_attention(q, ke, ve, attn_mask=mask, is_causal=causal and mask is None)

            rows[name] = sdpa
        else:
            raise SystemExit(f"--impl {name}: unknown (known: {', '.join(IMPLS)})")
    return rows


def measure(name: str, fwd: Any, s: int, d: int, a: argparse.Namespace, ref_o: Optional[torch.Tensor],
            sq: Optional[int] = None) -> Dict[str, Any]:
    """One row; ``sq``: a decode shape (that many queries against ``s`` keys, forward only)."""
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    causal = not a.no_causal
    decode = sq is not None
    sq = s if sq is None else sq
    row: Dict[str, Any] = {"impl": name, "s": s, "sq": sq, "d": d, "batch": a.batch, "heads": a.heads,
                           "kv_heads": a.kv_heads, "causal": causal, "dtype": a.dtype}
    if isinstance(fwd, str):
        row["note"] = fwd
        return row
    gen = torch.Generator(device="cuda").manual_seed(1234 + s + d)
    q = torch.randn(a.batch, a.heads, sq, d, device="cuda", dtype=dt, generator=gen)
    k = torch.randn(a.batch, a.kv_heads, s, d, device="cuda", dtype=dt, generator=gen)
    v = torch.randn(a.batch, a.kv_heads, s, d, device="cuda", dtype=dt, generator=gen)
    g = torch.randn(a.batch, a.heads, sq, d, device="cuda", dtype=dt, generator=gen)
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))

    def forward():
        with torch.no_grad():
            return fwd(q, k, v)

    def forward_backward():
        o = fwd(qg, kg, vg)
        torch.autograd.backward(o, g)
        qg.grad = kg.grad = vg.grad = None

    try:
        o = forward()
        if isinstance(o, str):
            raise RuntimeError(o)
        if ref_o is not None:
            row["max_abs_diff_vs_fused"] = (o.float() - ref_o.float()).abs().max().item()
        row["out"] = o
        if name == "te":
            row["note"] = f"ran {RAN.get((sq, s, d), '?')}"
        row["fwd_ms"] = median_ms(forward, a.iters)
        row["peak_extra_mib_fwd"] = peak_extra_mib(forward)
        f = flops(a.batch, a.heads, sq, s, d, causal)
        row["fwd_tflops"] = f / (row["fwd_ms"] * 1e-3) / 1e12
        if not decode:
            row["fwd_bwd_ms"] = median_ms(forward_backward, a.iters)
            row["peak_extra_mib_fwd_bwd"] = peak_extra_mib(forward_backward)
            row["fwd_bwd_tflops"] = 3.5 * f / (row["fwd_bwd_ms"] * 1e-3) / 1e12
    except torch.cuda.OutOfMemoryError as e:
        row["note"] = f"out of memory: {str(e).splitlines()[0]}"
    except Exception as e:  # noqa: BLE001 - a refusal or failure is the row's result
        row["note"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        # A refused executor: its own reason (the chain walk's), not only the walk's summary.
        chain = getattr(getattr(e, "decision", None), "chain", None) or []
        why = "; ".join(f"{x.executor} {x.outcome}: {x.reason}" for x in chain if x.reason)
        if why:
            row["note"] = f"{type(e).__name__}: {why}"
    finally:
        del q, k, v, g, qg, kg, vg
        torch.cuda.empty_cache()
    return row


def table(rows: List[Dict[str, Any]]) -> str:
    out = ["| impl | s_q x s_kv | d | fwd ms | fwd+bwd ms | TFLOP/s fwd / fwd+bwd | peak extra MiB fwd / fwd+bwd | max abs O diff vs fused | note |",
           "|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda x, p=2: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
    for r in rows:
        out.append(
            f"| {r['impl']} | {r.get('sq', r['s'])} x {r['s']} | {r['d']} | {fmt(r.get('fwd_ms'))} | {fmt(r.get('fwd_bwd_ms'))} | "
            f"{fmt(r.get('fwd_tflops'), 0)} / {fmt(r.get('fwd_bwd_tflops'), 0)} | "
            f"{fmt(r.get('peak_extra_mib_fwd'), 0)} / {fmt(r.get('peak_extra_mib_fwd_bwd'), 0)} | "
            f"{fmt(r.get('max_abs_diff_vs_fused'), 4)} | {r.get('note', '')} |")
    return "\n".join(out)


def main(argv: Optional[List[str]] = None) -> int:
    a = parse_args(argv)
    if not torch.cuda.is_available():
        print("peers.py: no CUDA device (every row runs on the GPU)", file=sys.stderr)
        return 2
    names = [n.strip() for n in a.impl.split(",") if n.strip()]
    impls = make_rows(names, a)
    dev = torch.cuda.get_device_properties(0)
    print(f"device: {dev.name}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}", flush=True)
    rows: List[Dict[str, Any]] = []
    sqs = [int(x) for x in a.decode.split(",") if x.strip()] or [None]
    for d in (int(x) for x in a.d.split(",")):
        for s, sq in ((int(x), sq) for x in a.s.split(",") for sq in sqs):
            ref_o = None
            # fused first: its output is every other row's sanity reference.
            for name in sorted(names, key=lambda n: n != "fused"):
                r = measure(name, impls[name], s, d, a, ref_o, sq)
                o = r.pop("out", None)
                if name == "fused" and o is not None:
                    ref_o = o
                rows.append(r)
                print(json.dumps(r), flush=True)
            del ref_o
            torch.cuda.empty_cache()
    print(table(rows))
    if a.json:
        Path(a.json).write_text(json.dumps({"device": dev.name, "torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
