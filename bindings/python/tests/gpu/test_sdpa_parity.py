"""H200 parity: PyTorch's own SDPA backend choice vs the ``torch`` pack, on configurations
drawn at random when the test runs (not the corpus). Skipped without CUDA.

For each configuration, real CUDA tensors are allocated (``torch.empty``: no kernel runs) and
1. ``torch._fused_sdp_choice`` with every backend enabled is compared with
   ``attn_policy.sdpa.explain_sdpa(...).selected``;
2. for each backend B, the same call inside ``sdpa_kernel([B])`` (PyTorch: B or it raises "No
   available kernel") is compared with the pack's decision under the same flags, which
   ``explain_sdpa`` reads from the process.
Both must agree on every configuration. Environment: SDPA_PARITY_N (configurations, default
2000), SDPA_PARITY_SEED (default: time-based, printed), SDPA_PARITY_OUT (a JSON report file).

Run on the GPU machine (see docs/packs/torch.md, "H200 parity test"):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site wheels/*.whl
    PYTHONPATH=/tmp/site SDPA_PARITY_OUT=$OUT/sdpa_parity.json \\
        python3 -m pytest -q -s bindings/python/tests/gpu/test_sdpa_parity.py
"""

import json
import os
import random
import time
import warnings
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from attn_policy.sdpa import explain_sdpa  # noqa: E402

CHOICE = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn"}
SDP = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
HEAD_DIMS = [1, 8, 16, 20, 24, 32, 40, 48, 64, 72, 80, 96, 100, 112, 128, 136, 160, 192, 200, 224, 232, 256, 264, 288, 320, 512]
SEQLENS = [1, 2, 7, 63, 64, 100, 127, 128, 129, 255, 500, 1024, 2048]
HEADS = [1, 2, 3, 4, 6, 8, 12, 16, 32]
DROPOUT = [0.0, 0.0, 0.0, 0.1, 0.0625, 0.25, 0.5]
# Keep one tensor under ~256 MiB so a run stays quick.
MAX_ELEMENTS = 64 * 1024 * 1024


def draw(rng):
    """One random configuration (documented shapes of the corpus plus edges the corpus lacks:
    head_dim 1 and non-multiples of 8, GQA with non-dividing heads, 2-d masks, masks with a
    broadcast length, strided masks, grad mode off, deterministic without warn_only)."""
    while True:
        hq = rng.choice(HEADS)
        mode = rng.random()
        if mode < 0.5:
            hkv = hq
        elif mode < 0.85:
            hkv = rng.choice([d for d in range(1, hq + 1) if hq % d == 0])
        else:
            hkv = rng.choice(HEADS)
        dqk = rng.choice(HEAD_DIMS)
        dv = dqk if rng.random() < 0.8 else rng.choice(HEAD_DIMS)
        c = {
            "dtype": rng.choice(list(DTYPES)),
            "batch": rng.choice([1, 1, 2, 3]),
            "heads_q": hq,
            "heads_kv": hkv,
            "seqlen_q": rng.choice(SEQLENS),
            "seqlen_kv": rng.choice(SEQLENS),
            "head_dim_qk": dqk,
            "head_dim_v": dv,
            "is_causal": rng.random() < 0.35,
            "attn_mask": rng.choice([None, None, None, "bool", "bool_bcast", "float", "bool_2d", "float_q1", "bool_strided"]),
            "dropout_p": rng.choice(DROPOUT),
            "enable_gqa": rng.random() < 0.35,
            "scale": rng.choice([None, 0.125]),
            "requires_grad": rng.random() < 0.5,
            "grad_enabled": rng.random() < 0.8,
            "layout": rng.choice(["bhsd", "bhsd", "bshd_view", "noncontig_lastdim"]),
            "deterministic": rng.choice([None, None, "warn_only", "strict"]),
        }
        if c["is_causal"] and c["attn_mask"] is not None:
            c["attn_mask"] = None  # SDPA refuses both; keep the configuration valid
        big = max(c["batch"] * hq * c["seqlen_q"] * max(dqk, dv), c["batch"] * hkv * c["seqlen_kv"] * max(dqk, dv))
        if big * 2 <= MAX_ELEMENTS:
            return c


def make(c, dev="cuda"):
    dt = DTYPES[c["dtype"]]
    b, hq, hkv, sq, skv = c["batch"], c["heads_q"], c["heads_kv"], c["seqlen_q"], c["seqlen_kv"]

    def t(h, s, d):
        if c["layout"] == "bshd_view":
            x = torch.empty(b, s, h, d, dtype=dt, device=dev).transpose(1, 2)
        elif c["layout"] == "noncontig_lastdim":
            x = torch.empty(b, h, s, 2 * d, dtype=dt, device=dev)[..., ::2]
        else:
            x = torch.empty(b, h, s, d, dtype=dt, device=dev)
        return x.requires_grad_(c["requires_grad"])

    q, k, v = t(hq, sq, c["head_dim_qk"]), t(hkv, skv, c["head_dim_qk"]), t(hkv, skv, c["head_dim_v"])
    kind = c["attn_mask"]
    mask = None
    if kind == "bool":
        mask = torch.ones(b, hq, sq, skv, dtype=torch.bool, device=dev)
    elif kind == "bool_bcast":
        mask = torch.ones(1, 1, sq, skv, dtype=torch.bool, device=dev)
    elif kind == "float":
        mask = torch.zeros(b, 1, sq, skv, dtype=dt, device=dev)
    elif kind == "bool_2d":
        mask = torch.ones(sq, skv, dtype=torch.bool, device=dev)
    elif kind == "float_q1":
        mask = torch.zeros(b, hq, 1, skv, dtype=dt, device=dev)
    elif kind == "bool_strided":
        mask = torch.ones(1, 1, sq, 2 * skv, dtype=torch.bool, device=dev)[..., ::2]
    return q, k, v, mask


def pytorch_choice(c, q, k, v, mask):
    try:
        return CHOICE[int(torch._fused_sdp_choice(
            q, k, v, mask, c["dropout_p"], c["is_causal"], scale=c["scale"], enable_gqa=c["enable_gqa"]
        ))]
    except RuntimeError:
        return None  # no backend: PyTorch raises


def set_process_state(c):
    det = c["deterministic"]
    torch.use_deterministic_algorithms(det is not None, warn_only=det == "warn_only")
    torch.set_grad_enabled(c["grad_enabled"])


def test_random_configurations_agree():
    n = int(os.environ.get("SDPA_PARITY_N", "2000"))
    seed = int(os.environ.get("SDPA_PARITY_SEED", str(int(time.time()))))
    rng = random.Random(seed)
    cap = torch.cuda.get_device_capability()
    print(f"\nseed {seed}; torch {torch.__version__}; cuDNN {torch.backends.cudnn.version()}; "
          f"sm {cap[0]}{cap[1]}; {torch.cuda.get_device_name()}")
    stats = Counter()
    mismatches = []
    # PyTorch warns once per forced backend that cannot run; the comparison needs none of it.
    quiet = warnings.catch_warnings()
    quiet.__enter__()
    warnings.simplefilter("ignore")
    try:
        for i in range(n):
            c = draw(rng)
            set_process_state(c)
            q, k, v, mask = make(c)
            args = (q, k, v, mask, c["dropout_p"], c["is_causal"], c["scale"], c["enable_gqa"])
            theirs = pytorch_choice(c, q, k, v, mask)
            ours = explain_sdpa(*args)
            stats["configs"] += 1
            stats[f"choice {theirs}"] += 1
            if ours.selected == theirs:
                stats["choice agree"] += 1
            else:
                mismatches.append({"i": i, "config": c, "what": "choice", "pytorch": theirs,
                                   "pack": ours.selected, "explain": ours.explain()})
            for b, backend in SDP.items():
                with sdpa_kernel([backend]):
                    theirs_b = pytorch_choice(c, q, k, v, mask)
                    ours_b = explain_sdpa(*args)
                stats["eligibility checks"] += 1
                eligible = theirs_b == b
                if theirs_b not in (b, None):
                    mismatches.append({"i": i, "config": c, "what": f"only {b} enabled, PyTorch chose {theirs_b}"})
                if ours_b.selected == theirs_b and ours.eligible(b) == eligible:
                    stats["eligibility agree"] += 1
                    stats[f"{b} eligible {eligible}"] += 1
                else:
                    mismatches.append({"i": i, "config": c, "what": f"eligible {b}", "pytorch": eligible,
                                       "pack": [ours_b.selected, ours.eligible(b)],
                                       "explain": ours_b.explain()})
            del q, k, v, mask
    finally:
        quiet.__exit__(None, None, None)
        torch.use_deterministic_algorithms(False)
        torch.set_grad_enabled(True)
    width = max(len(k) for k in stats)
    print("\n".join(f"  {k:<{width}}  {stats[k]}" for k in sorted(stats)))
    print(f"choice: {stats['choice agree']}/{stats['configs']}; "
          f"eligibility: {stats['eligibility agree']}/{stats['eligibility checks']}; "
          f"mismatches: {len(mismatches)}")
    out = os.environ.get("SDPA_PARITY_OUT")
    if out:
        with open(out, "w") as f:
            json.dump({"seed": seed, "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                       "sm": f"{cap[0]}{cap[1]}", "stats": dict(stats), "mismatches": mismatches[:200]}, f, indent=1)
    assert not mismatches, json.dumps(mismatches[:5], indent=1, default=str)
    assert stats["choice agree"] == n and stats["eligibility agree"] == 4 * n
