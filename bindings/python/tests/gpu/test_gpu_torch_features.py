"""attn_policy.torch.attention's features on a CUDA GPU (skipped without one): soft-capping, both
sinks, padded batches (either side, KV-cache decoding) and packed THD in bf16 and fp16, O and
every gradient (the learnable sink's included) by the FlashAttention criterion against the
float64 reference of ``tests/test_torch_features.py``. Whichever executor runs (a GPU executor
whose manifest lists the feature, or the CPU reference as a reported substitute), the decision
says which; none runs a call without its feature.

Run with ``-s`` to see the table; ``GPU_SUMMARY=path`` appends it to a file."""

import sys
from pathlib import Path

import pytest
from _summary import Rows

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_torch_features import pack_with_chains, rand, reference  # noqa: E402

import attn_policy.torch as apt  # noqa: E402

DEV = torch.device("cuda", 0)
ROWS = Rows()
note = ROWS.note



def teardown_module(module):
    ROWS.write()


# (name, layout, b, hq, hkv, sq, skv, attention() keywords, reference keywords)
CASES = [
    ("softcap causal", "bshd", 2, 8, 2, 128, 128, dict(is_causal=True, softcap=20.0),
     dict(causal=True, softcap=20.0)),
    ("off-by-one sink", "bhsd", 2, 8, 8, 96, 160, dict(is_causal=True, diagonal="bottom_right", sink="off_by_one"),
     dict(causal=True, bottom_right=True, sink="off_by_one")),
    ("learnable sink window", "bshd", 2, 8, 4, 128, 128, dict(is_causal=True, window=(31, 0), sink="learnable"),
     dict(causal=True, window=(31, 0), sink="learnable")),
    ("padded right", "bshd", 3, 8, 2, 128, 128, dict(is_causal=True, seqlens_q=[128, 7, 64]),
     dict(causal=True, lens_q=[128, 7, 64], lens_kv=[128, 7, 64])),
    ("padded left decode", "bshd", 3, 8, 2, 1, 200,
     dict(is_causal=True, diagonal="bottom_right", seqlens_q=[1, 1, 1], seqlens_kv=[200, 17, 90], padding="left"),
     dict(causal=True, bottom_right=True, lens_q=[1, 1, 1], lens_kv=[200, 17, 90], padding="left")),
    ("packed thd softcap", "thd", 3, 8, 2, None, None,
     dict(is_causal=True, softcap=30.0, cu_seqlens_q=[0, 50, 51, 180]),
     dict(causal=True, softcap=30.0, cu_q=[0, 50, 51, 180], cu_kv=[0, 50, 51, 180])),
]


def _inputs(layout, b, hq, hkv, sq, skv, d, seed):
    if layout == "thd":
        t = 180
        shapes = [(t, hq, d), (t, hkv, d), (t, hkv, d)]
    else:
        of = {"bhsd": lambda h, s: (b, h, s, d), "bshd": lambda h, s: (b, s, h, d)}[layout]
        shapes = [of(hq, sq), of(hkv, skv), of(hkv, skv)]
    return [rand(*s, seed=seed + i) for i, s in enumerate(shapes)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_features_on_cuda_meet_the_criterion(case, dtype):
    _check_case(case, dtype)


@pytest.fixture(scope="module")
def math_only(tmp_path_factory):
    """A te pack copy whose every chain is ``[torch_math]``."""
    import attn_policy
    backends = attn_policy.Policy.load("te").backend_names
    return pack_with_chains(tmp_path_factory.mktemp("math"), {b: ["torch_math"] for b in backends})


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_torch_math_serves_the_features_on_cuda(case, dtype, math_only):
    # torch_math's manifest lists every feature: with a chain of it alone it runs every case on
    # the GPU (its own executor, no substitute), by the same criterion.
    d = _check_case(case, dtype, math_only)
    assert d.executor == "torch_math" and not d.substitute, d.summary()


def _check_case(case, dtype, policy=None):
    name, layout, b, hq, hkv, sq, skv, kw, rkw = case
    kw, rkw = dict(kw), dict(rkw)
    x64 = _inputs(layout, b, hq, hkv, sq, skv, 64, seed=21)
    sink64 = None
    if kw.get("sink") == "learnable":
        sink64 = torch.linspace(-2.0, 2.0, hq, dtype=torch.float64)
    ours = [t.to(dtype).to(DEV).requires_grad_(True) for t in x64]
    extra = []
    if sink64 is not None:
        extra = [sink64.float().to(DEV).requires_grad_(True)]
        kw["sink"] = extra[0]
    apt.clear_cache()
    o, d = apt.attention(*ours, layout=layout, return_decision=True, policy=policy, **kw)
    assert d.executor is not None
    if d.executor == "reference":
        assert d.substitute  # the CPU reference on a GPU call is always reported
    exact_in = [t.detach().double().cpu().requires_grad_(True) for t in ours + extra]
    naive_in = [t.detach().clone().requires_grad_(True) for t in ours]
    if sink64 is not None:
        rkw["sink"] = exact_in[3]
    exact = reference(*exact_in[:3], layout, **rkw)
    if sink64 is not None:
        naive_in.append(extra[0].detach().to(dtype).requires_grad_(True))
        rkw["sink"] = naive_in[3]
    if isinstance(rkw.get("sink"), str):
        rkw["sink"] = "off_by_one"
    naive = reference(*naive_in[:3], layout, **rkw)
    g = rand(*o.shape, seed=22).to(dtype).to(DEV)
    got = (o, *torch.autograd.grad(o, ours + extra, g))
    want = (exact, *torch.autograd.grad(exact, exact_in, g.double().cpu()))
    base = (naive, *torch.autograd.grad(naive, naive_in, g))
    worst = []
    for what, a, w, n in zip(("O", "dQ", "dK", "dV", "d_sink"), got, want, base):
        err = (a.double().cpu() - w).abs().max().item()
        naive_err = (n.double().cpu() - w).abs().max().item()
        worst.append(f"{what} {err:.2e}/{naive_err:.2e}")
        assert err <= 2 * naive_err + 1e-6, (name, what, err, naive_err)
    note(f"| {name} | {str(dtype)[6:]} | {d.executor}{' (substitute)' if d.substitute else ''} | {'; '.join(worst)} |")
    return d
