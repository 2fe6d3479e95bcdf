"""What the end-to-end scripts (gemma4_train.py, models.py) share: building a transformers
model from a config under a given attention implementation, SDPA backend selection, a
training loop that times steps and measures peak memory, and te pack copies with replaced
executor chains. Imported from the scripts' own folder (Python puts it on sys.path)."""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import time

import torch


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_model(cls, cfg, impl, dtype, device, state=None):
    """``cls`` from ``cfg`` under attention implementation ``impl`` (random weights, or
    ``state``)."""
    # One config object per model: `_from_config` records the attention implementation on it.
    m = cls._from_config(copy.deepcopy(cfg), attn_implementation=impl, torch_dtype=dtype)
    m = m.to(device)
    if state is not None:
        m.load_state_dict(state)
    assert m.config._attn_implementation == impl, m.config._attn_implementation
    return m


def clone_state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


#: SDPA backend sets by name (torch.nn.attention.SDPBackend members, tried in this order).
SDPA_SETS = {
    "efficient": ["EFFICIENT_ATTENTION"], "flash": ["FLASH_ATTENTION"], "math": ["MATH"],
    "efficient+math": ["EFFICIENT_ATTENTION", "MATH"], "flash+math": ["FLASH_ATTENTION", "MATH"],
}


def sdpa_backend(name):
    """A context-manager factory that restricts SDPA to the backend set ``name`` (None: any)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name is None:
        return contextlib.nullcontext
    backends = [getattr(SDPBackend, b) for b in SDPA_SETS[name]]
    return lambda: sdpa_kernel(backends)


def train(model, batches, steps, device, *, lr, clip, warmup, ctx=contextlib.nullcontext,
          on_step=None, name="run"):
    """Trains ``model`` in place on ``batches`` (dicts of forward keyword arguments, ``labels``
    included), cycled, with AdamW (betas 0.9/0.95, linear warm-up, gradient clipping).
    ``on_step(step, phase)`` is called with phase "before" and "after" each step. Returns the
    losses, step times (s) and the peak CUDA memory (bytes; 0 on the CPU)."""
    model.train()
    model.config.use_cache = False
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    # Linear warm-up, then constant (warmup 0: none).
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / warmup) if warmup > 0 else 1.0)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    losses, times = [], []
    for step in range(steps):
        if on_step:
            on_step(step, "before")
        batch = batches[step % len(batches)]
        sync(device)
        t0 = time.perf_counter()
        with ctx():
            out = model(**batch)
        out.loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss = out.loss.item()  # synchronises
        times.append(time.perf_counter() - t0)
        losses.append(loss)
        if on_step:
            on_step(step, "after")
        if not (loss == loss):
            raise RuntimeError(f"{name}: loss is NaN at step {step}")
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    del opt
    return {"losses": losses, "times": times, "peak": peak}


def loss_check(ours, anchor, other, *, window, floor):
    """The shared-weights loss check of models.py and gemma4_train.py: ``ours[i]`` (attn_policy's
    training loss at step i) against ``anchor[i]`` and ``other[i]``, the two references' losses
    of the same weights on the same batch. Step i passes when ``|ours - anchor| <= 1.5 x
    max(G_i, floor x max(1, |anchor|))``, ``G_i`` the largest ``|other - anchor|`` within
    ``window`` steps of i. Returns the per-step ratios (to that bound's 1.0), the worst step, the
    deviations, the references' gaps, the windowed gaps and the floors."""
    n = len(ours)
    floors = [floor * max(1.0, abs(x)) for x in anchor]
    ref_gap = [abs(y - x) for x, y in zip(anchor, other)]
    envelope = [max(ref_gap[max(0, i - window): i + window + 1]) for i in range(n)]
    dev = [abs(o - x) for o, x in zip(ours, anchor)]
    ratio = [d / max(g, f) for d, g, f in zip(dev, envelope, floors)]
    worst = max(range(n), key=lambda i: ratio[i])
    return {"ratio": ratio, "worst": worst, "ok": all(x <= 1.5 for x in ratio), "dev": dev,
            "ref_gap": ref_gap, "envelope": envelope, "floors": floors}


def te_with_chains(changes, script=__file__):
    """A copy of the te pack (rules/te of this checkout) with some backends' chains replaced
    (``changes``: ``Backend=exec1,exec2`` strings); returns the loaded policy and the chains."""
    import shutil
    import tempfile
    from pathlib import Path

    import attn_policy

    roots = [Path(os.environ["ATTN_POLICY_REPO"])] if os.environ.get("ATTN_POLICY_REPO") else []
    roots += [Path.cwd(), Path(script).resolve().parents[3]]
    src = next((r / "rules" / "te" for r in roots if (r / "rules" / "te" / "pack.yaml").exists()), None)
    if src is None:
        raise SystemExit("--chain needs rules/te (run from the repository root or set ATTN_POLICY_REPO)")
    te = attn_policy.Policy.load("te")
    chains = {b: te._p.executor_chain(b) for b in te.backend_names}
    for c in changes:
        backend, _, names = c.partition("=")
        if backend not in chains:
            raise SystemExit(f"--chain {c}: no backend {backend!r} (backends: {', '.join(chains)})")
        chains[backend] = [n.strip() for n in names.split(",") if n.strip()]
    dst = Path(tempfile.mkdtemp()) / "te"
    shutil.copytree(src, dst)
    text = (dst / "pack.yaml").read_text()
    head = text[: text.index("\nexecutors:")]
    body = "".join(f"  - backend: {b}\n    chain: [{', '.join(c)}]\n" for b, c in chains.items() if c)
    (dst / "pack.yaml").write_text(head + "\nexecutors:\n" + body)
    return attn_policy.Policy.load(str(dst)), chains


EAGER_FP32 = "eager_fp32"


def eager_fp32_attention(module, query, key, value, attention_mask, **kwargs):
    """The model's own transformers ``eager_attention_forward`` (soft-capping, sinks and all)
    on float32 copies of its inputs, the output cast back: a second eager reference whose
    scores, softmax and weighted sum are all float32 (for models whose bf16 eager already
    takes the softmax in float32, e.g. Gemma 2, only the matmuls change)."""
    eager = sys.modules[type(module).__module__].eager_attention_forward
    mask = attention_mask
    if mask is not None and mask.is_floating_point():
        mask = mask.float()
    o, _ = eager(module, query.float(), key.float(), value.float(), mask, **kwargs)
    return o.to(query.dtype), None


def register_eager_fp32() -> str:
    """Registers :func:`eager_fp32_attention` (with eager's additive mask) with transformers."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(EAGER_FP32, eager_fp32_attention)
    AttentionMaskInterface.register(EAGER_FP32, eager_mask)
    return EAGER_FP32
