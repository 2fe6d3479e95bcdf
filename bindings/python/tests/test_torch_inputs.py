"""Bad tensors are refused before any kernel reads them (issue 30, part 6).

Targeted cases first (each refusal's type and message, on every entry path: the eager call, its
cached fast path, the op ``torch.ops.attn_policy.attention`` and its backward, ``torch.compile``,
the native plans themselves), then a seeded property test over random shapes, strides, dtypes,
devices, masks and entry paths, valid and invalid: each call either meets the FlashAttention
criterion against a float64 reference or raises a typed refusal (``InvalidInput`` /
``ShapeMismatch`` for invalid tensors; ``AttentionDeclined`` for a valid call only where every
executor of its chain is unavailable here or refused by its manifest, as read from
``apt.executors()``). Never another exception, never a different answer.

    ATTN_POLICY_PROPERTY_SEED=7 ATTN_POLICY_PROPERTY_CASES=2000 pytest test_torch_inputs.py -k property
"""

import math
import os
import random
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import attn_policy  # noqa: E402
import attn_policy.torch as apt  # noqa: E402
from attn_policy import _native, eager_node  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
R = torch.randn


def test_the_error_classes_are_typed_and_exported():
    assert issubclass(apt.ShapeMismatch, apt.InvalidInput)
    assert issubclass(apt.InvalidInput, attn_policy.PolicyError) and issubclass(apt.InvalidInput, ValueError)
    assert apt.InvalidInput is _native.InvalidInput
    assert {"InvalidInput", "ShapeMismatch"} <= set(apt.__all__)


def _arg(name, shape, dtype="torch.float32", device="cpu", strides=None, offset=0, nbytes=None):
    strides = strides if strides is not None else tuple(torch.empty(shape).stride())
    return (name, "torch.strided", device, dtype, tuple(shape), tuple(strides), offset, nbytes, 4)


def test_the_one_check_is_native_and_reads_only_what_it_is_given():
    """``_native.check_tensors`` (bindings/python/src/inputs.rs) holds the rules; Python only
    reads each tensor's layout, device, dtype, shape, strides, offset and storage size."""
    check = _native.check_tensors
    qkv = [_arg(n, (1, 2, 4, 8)) for n in "qkv"]
    check(0, qkv)  # valid: returns None
    # A device of another machine is judged by its kind alone (nothing here reads its memory).
    check(1, [_arg(n, (1, 4, 2, 8), device="cuda:3") for n in "qkv"])
    with pytest.raises(apt.ShapeMismatch, match=r"k and v differ in sequence length \(4 vs 5\)"):
        check(0, [qkv[0], qkv[1], _arg("v", (1, 2, 5, 8))])
    # The same shapes in sbhd: dim 0 is the sequence.
    with pytest.raises(apt.ShapeMismatch, match=r"q and k differ in batch \(2 vs 4\).*layout sbhd"):
        check(2, qkv[:1] + [_arg(n, (1, 4, 2, 8)) for n in "kv"])
    # Storage: 64 elements of 4 bytes, one byte short; an offset past the end.
    short = _arg("k", (1, 2, 4, 8), nbytes=255)
    with pytest.raises(apt.InvalidInput, match=r"k \(shape \(1, 2, 4, 8\), strides \(64, 32, 8, 1\), offset 0\) "
                                              r"reaches elements 0..63 of a storage of 255 bytes"):
        check(0, [qkv[0], short, qkv[2]])
    with pytest.raises(apt.InvalidInput, match="reaches elements 0..63"):
        check(0, [qkv[0], short, qkv[2]], True)  # the cached path's storage-only check
    check(0, [qkv[0], _arg("k", (1, 2, 4, 8), nbytes=256), qkv[2]])  # exactly enough
    with pytest.raises(apt.InvalidInput, match="reaches elements 1..64"):
        check(0, [qkv[0], _arg("k", (1, 2, 4, 8), offset=1, nbytes=256), qkv[2]])
    with pytest.raises(apt.InvalidInput, match=r"layout 4: 0 \(bhsd\), 1 \(bshd\), 2 \(sbhd\) or 3 \(thd\)"):
        check(4, qkv)
    with pytest.raises(apt.InvalidInput, match=r"q, k, v must be 3-D \(thd\); found 4, 4, 4 dims"):
        check(3, qkv)
    with pytest.raises(apt.InvalidInput, match="takes 3 tensors .* or 6 .*; found 2"):
        check(0, qkv[:2])
    # The backward: dO, O, LSE against the call.
    g, o = _arg("grad_out", (1, 2, 4, 8)), _arg("out", (1, 2, 4, 8))
    check(0, qkv + [g, o, _arg("lse", (1, 2, 4))])
    with pytest.raises(apt.ShapeMismatch, match=r"lse has shape \(1, 2, 4, 1\), the call's is \(1, 2, 4\)"):
        check(0, qkv + [g, o, _arg("lse", (1, 2, 4, 1))])
    with pytest.raises(apt.InvalidInput, match="lse has dtype torch.float64, the call's is torch.float32"):
        check(0, qkv + [g, o, _arg("lse", (1, 2, 4), dtype="torch.float64")])
    with pytest.raises(apt.InvalidInput, match="grad_out is on cuda:0, q on cpu: one device"):
        check(0, qkv + [_arg("grad_out", (1, 2, 4, 8), device="cuda:0"), o, _arg("lse", (1, 2, 4))])


# ---------------------------------------------------------------------------------------------
# The cases, as a new user meets them.


def test_broadcast_batch_is_refused_naming_both_shapes():
    q, k, v = R(2, 2, 4, 8), R(1, 2, 4, 8), R(1, 2, 4, 8)
    with pytest.raises(apt.ShapeMismatch) as e:
        apt.attention(q, k, v)
    msg = str(e.value)
    assert "(2, 2, 4, 8)" in msg and "(1, 2, 4, 8)" in msg and "batch" in msg and "broadcast" in msg, msg
    # The same through the op (torch.compile's path) and without gradients.
    args = (0, 0, -1, -1, False, 1 / math.sqrt(8), 0.0, False, 0, 0, False)
    with pytest.raises(apt.ShapeMismatch, match=r"\(2, 2, 4, 8\)"):
        torch.ops.attn_policy.attention(q, k, v, *args)
    with torch.no_grad(), pytest.raises(apt.ShapeMismatch):
        apt.attention(q, k, v)
    # q of batch 1 against k, v of batch 2 is refused too (no broadcasting either way).
    with pytest.raises(apt.ShapeMismatch, match="batch"):
        apt.attention(R(1, 2, 4, 8), R(2, 2, 4, 8), R(2, 2, 4, 8))


@pytest.mark.parametrize("layout", ["bhsd", "bshd", "sbhd"])
def test_k_and_v_of_different_lengths_are_refused(layout):
    def t(h, s, d):
        return {"bhsd": R(1, h, s, d), "bshd": R(1, s, h, d), "sbhd": R(s, 1, h, d)}[layout]

    with pytest.raises(apt.ShapeMismatch, match=r"k and v differ in sequence length \(16 vs 17\)"):
        apt.attention(t(2, 4, 8), t(2, 16, 8), t(2, 17, 8), layout=layout)
    with pytest.raises(apt.ShapeMismatch, match=r"q and k differ in head dim \(8 vs 16\)"):
        apt.attention(t(2, 4, 8), t(2, 16, 16), t(2, 16, 8), layout=layout)
    with pytest.raises(apt.ShapeMismatch, match=r"k and v differ in heads \(2 vs 1\)"):
        apt.attention(t(4, 4, 8), t(2, 16, 8), t(1, 16, 8), layout=layout)
    with pytest.raises(apt.ShapeMismatch, match=r"heads_q \(3\) is not a multiple of heads_kv \(2\)"):
        apt.attention(t(3, 4, 8), t(2, 16, 8), t(2, 16, 8), layout=layout)


BAD = [
    # (what, make (q, k, v), class, message fragment)
    ("zero head dim", lambda: (R(1, 2, 4, 0), R(1, 2, 4, 0), R(1, 2, 4, 0)), apt.InvalidInput, "zero-sized head dim"),
    ("zero batch", lambda: (R(0, 2, 4, 8), R(0, 2, 4, 8), R(0, 2, 4, 8)), apt.InvalidInput, "zero-sized batch"),
    ("zero kv length", lambda: (R(1, 2, 4, 8), R(1, 2, 0, 8), R(1, 2, 0, 8)), apt.InvalidInput,
     "k has a zero-sized sequence length"),
    ("meta tensors", lambda: tuple(torch.empty(1, 2, 4, 8, device="meta") for _ in range(3)), apt.InvalidInput,
     "q is on device meta, which holds no data"),
    ("one meta tensor", lambda: (R(1, 2, 4, 8), torch.empty(1, 2, 4, 8, device="meta"), R(1, 2, 4, 8)),
     apt.InvalidInput, "k is on device meta"),
    ("Python lists", lambda: ([[1.0]], [[1.0]], [[1.0]]), apt.InvalidInput, "q must be a torch.Tensor; found list"),
    ("a number for v", lambda: (R(1, 2, 4, 8), R(1, 2, 4, 8), 3.0), apt.InvalidInput, "v must be a torch.Tensor; found float"),
    ("3-D", lambda: (R(2, 4, 8), R(2, 4, 8), R(2, 4, 8)), apt.InvalidInput, "4-D"),
    ("int32", lambda: tuple(torch.ones(1, 2, 4, 8, dtype=torch.int32) for _ in range(3)), apt.InvalidInput,
     "dtype torch.int32 cannot be executed"),
    ("mixed dtypes", lambda: (R(1, 2, 4, 8), R(1, 2, 4, 8), R(1, 2, 4, 8, dtype=torch.float64)), apt.InvalidInput,
     "one dtype"),
    ("sparse", lambda: (R(1, 2, 4, 8).to_sparse(), R(1, 2, 4, 8), R(1, 2, 4, 8)), apt.InvalidInput, "strided"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
@pytest.mark.parametrize("grad", [False, True])
def test_bad_inputs_get_a_typed_error_that_says_what_is_wrong(case, grad):
    _, make, cls, fragment = case
    q, k, v = make()
    if grad and isinstance(q, torch.Tensor) and q.is_floating_point() and not q.is_meta and q.layout == torch.strided:
        q.requires_grad_(True)
    with pytest.raises(cls) as e:
        apt.attention(q, k, v)
    assert fragment in str(e.value), str(e.value)


BAD_OPTIONS = [
    # (options, message fragment). Each was taken by its truth value or float() before, or
    # failed deep inside (an unpacking ValueError, an AttributeError, an OverflowError).
    (dict(is_causal="no"), "is_causal must be True or False; found str 'no'"),
    (dict(is_causal=torch.tensor(True)), "is_causal must be True or False; found Tensor"),
    (dict(is_causal=None), "is_causal must be True or False; found NoneType"),
    (dict(no_substitute="no"), "no_substitute must be True or False; found str 'no'"),
    (dict(return_decision="no"), "return_decision must be True or False; found str 'no'"),
    (dict(scale="0.1"), "scale must be a float > 0 or None (1/sqrt(head dim)); found str '0.1'"),
    (dict(dropout_p="0.1"), "dropout_p must be a float in [0, 1); found str '0.1'"),
    (dict(dropout_p=float("nan")), "dropout_p must be a float in [0, 1); found nan"),
    (dict(softcap="30"), "softcap must be a float > 0 or None; found str '30'"),
    (dict(window="3"), "window must be None, an int or a (left, right) pair"),
    (dict(window=(1, 2, 3)), "window must be None, an int or a (left, right) pair; found 3 values (1, 2, 3)"),
    (dict(window=(2.5, 0)), "window must be None, an int or a (left, right) pair of ints or None"),
    (dict(window=True), "found True"),
    (dict(window=(2**70, 0)), "a size must fit a 64-bit integer"),
    (dict(policy="te"), "policy must be an attn_policy.Policy (attn_policy.Policy.load('te') loads one) or None"),
    (dict(policy=3), "policy must be an attn_policy.Policy or None; found int"),
]


@pytest.mark.parametrize("options, fragment", BAD_OPTIONS, ids=[repr(o) for o, _ in BAD_OPTIONS])
def test_options_of_the_wrong_type_are_refused_naming_the_option(options, fragment):
    q, k, v = R(1, 2, 4, 8), R(1, 2, 4, 8), R(1, 2, 4, 8)
    # A plain call first, so that a signature of the same tensors is cached (the fast path).
    apt.attention(q, k, v)
    with pytest.raises(apt.InvalidInput) as e:
        apt.attention(q, k, v, **options)
    assert fragment in str(e.value), str(e.value)
    # The same through a call with a feature (its own path) where the option applies to it.
    if "softcap" not in options:
        with pytest.raises(apt.InvalidInput) as e:
            apt.attention(q, k, v, sink="off_by_one", **options)
        assert fragment in str(e.value), str(e.value)


def test_options_that_are_bools_as_ints_and_numbers_as_ints_still_run():
    q, k, v = R(1, 2, 4, 8, dtype=torch.float64), R(1, 2, 4, 8, dtype=torch.float64), R(1, 2, 4, 8, dtype=torch.float64)
    ref = apt.attention(q, k, v, is_causal=True, scale=1.0, window=(2, 0))
    torch.testing.assert_close(apt.attention(q, k, v, is_causal=1, scale=1, window=[2, None]), ref)
    o, d = apt.attention(q, k, v, is_causal=True, return_decision=1)
    assert isinstance(d, attn_policy.Explanation) and o.shape == q.shape


# ---------------------------------------------------------------------------------------------
# Strides that reach outside a tensor's storage (a storage resized after its view was made).


def _shrink(t: torch.Tensor, short_by: int = 1) -> None:
    """Makes ``t``'s storage ``short_by`` elements too small for its strides (no data moves)."""
    need = (t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()
    t.untyped_storage().resize_(need - short_by * t.element_size())


def _fresh(grad: bool):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 4, 8, dtype=torch.float64, generator=g) for _ in range(3))
    return q.requires_grad_(grad), k, v


@pytest.mark.parametrize("node", ["python", "cpp"])
@pytest.mark.parametrize("grad", [False, True])
def test_a_storage_too_small_is_refused_on_the_cached_path(eager_node_mode, node, grad):
    if node == "cpp" and eager_node.compiler() is None:
        pytest.skip("no C++ compiler for the C++ eager node")
    eager_node_mode(node)
    q, k, v = _fresh(grad)
    apt.attention(q, k, v)  # decided, planned, cached for this signature
    _shrink(k)
    # The same signature: the fast path; the plan refuses the pointer (Rust), nothing is read.
    with pytest.raises(apt.InvalidInput, match="storage"):
        apt.attention(q, k, v)
    if grad:
        assert eager_node.status()["node"] == node


def test_a_storage_too_small_is_refused_on_a_first_call_and_through_the_op():
    q, k, v = _fresh(False)
    _shrink(v)
    apt.clear_cache()
    with pytest.raises(apt.InvalidInput, match=r"v \(shape \(1, 2, 4, 8\).*do not fit inside its storage"):
        apt.attention(q, k, v)
    args = (0, 0, -1, -1, False, 0.35, 0.0, False, 0, 0, False)
    with pytest.raises(apt.InvalidInput, match="do not fit inside its storage"):
        torch.ops.attn_policy.attention(q, k, v, *args)


def test_a_storage_too_small_is_refused_for_a_torch_executor(tmp_path):
    """torch_math runs torch ops, not a native plan: the fast path checks its storage in Python."""
    mine = pack_with_unfused_chain(tmp_path, ["torch_math", "reference"])
    q, k, v = _fresh(False)
    _, d = apt.attention(q, k, v, policy=mine, return_decision=True)
    assert d.executor == "torch_math"
    _shrink(q)
    with pytest.raises(apt.InvalidInput, match="do not fit inside its storage"):
        apt.attention(q, k, v, policy=mine)


def test_the_backward_checks_dO_O_and_the_lse():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 4, 8, dtype=torch.float64, generator=g) for _ in range(3))
    args = (0, 0, -1, -1, False, 0.35, 0.0, True, 0, 0, False)
    o, lse = torch.ops.attn_policy.attention(q, k, v, *args)
    do = torch.randn_like(o)
    bwd = torch.ops.attn_policy.attention_backward
    want = bwd(do, q, k, v, o, lse, *args)
    with pytest.raises(apt.ShapeMismatch, match=r"lse has shape \(1, 2\), the call's is \(1, 2, 4\)"):
        bwd(do, q, k, v, o, lse[:, :, 0], *args)
    with pytest.raises(apt.ShapeMismatch, match="grad_out has shape"):
        bwd(do[:, :, :2], q, k, v, o, lse, *args)
    with pytest.raises(apt.ShapeMismatch, match="out has shape"):
        bwd(do, q, k, v, o.expand(2, 2, 4, 8), lse, *args)
    with pytest.raises(apt.InvalidInput, match="lse has dtype torch.float32, the call's is torch.float64"):
        bwd(do, q, k, v, o, lse.float(), *args)
    with pytest.raises(apt.InvalidInput, match="grad_out is on device meta"):
        bwd(do.to("meta"), q, k, v, o, lse, *args)
    lse_short = lse.clone()
    _shrink(lse_short)
    with pytest.raises(apt.InvalidInput, match="lse .* do not fit inside its storage"):
        bwd(do, q, k, v, o, lse_short, *args)
    # O of the right shape with other strides is taken (copied for the executor): same answer.
    o_cl = o.clone(memory_format=torch.channels_last)
    assert o_cl.stride() != o.stride()
    got = bwd(do, q, k, v, o_cl, lse, *args)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_torch_compile_refuses_mismatched_shapes_while_tracing():
    def f(q, k, v):
        return apt.attention(q, k, v, is_causal=True)

    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch._dynamo.reset()
    with pytest.raises(Exception) as e:
        cf(R(2, 2, 4, 8), R(1, 2, 4, 8), R(1, 2, 4, 8))
    # Dynamo re-raises the fake's error (its class wraps ours): the message is ours.
    chain, seen = e.value, []
    while chain is not None:
        seen.append(chain)
        chain = chain.__cause__
    assert any(isinstance(x, apt.ShapeMismatch) for x in seen) or "q and k differ in batch (2 vs 1)" in str(e.value), \
        [type(x) for x in seen]
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------
# The native plans refuse what does not fit, whatever Python passes (defense in depth).


def _plan(dtype="float64", dims=(1, 2, 2, 4, 6, 8, 8)):
    b, hq, hkv, sq, skv, d, dv = dims

    def st(h, s, dd):  # bhsd contiguous (batch, head, seq)
        return (h * s * dd, s * dd, dd)

    problem = _native.make_problem(dtype, dims, (st(hq, sq, d), st(hkv, skv, d), st(hkv, skv, dv), st(hq, sq, dv)),
                                   0, -1, -1, False, 0.35, False)
    return _native.make_plan("reference", None, problem, None)


def _avail(t):
    return t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()


def test_a_plan_refuses_pointers_its_problem_reaches_past():
    plan = _plan()
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 2, 4, 8, dtype=torch.float64, generator=g)
    k = torch.randn(1, 2, 6, 8, dtype=torch.float64, generator=g)
    v = torch.randn(1, 2, 6, 8, dtype=torch.float64, generator=g)
    o, lse = torch.empty(1, 2, 4, 8, dtype=torch.float64), torch.empty(1, 2, 4, dtype=torch.float64)
    ts = (q, k, v, o, lse)
    ptrs = [t.data_ptr() for t in ts]
    avail = [_avail(t) for t in ts]
    assert avail[1] == 2 * 6 * 8 * 8
    plan.forward(*ptrs, tuple(avail))  # exactly enough: runs
    want = o.clone()
    o.fill_(7.0)
    short = list(avail)
    short[1] -= 1
    with pytest.raises(apt.InvalidInput, match=r"k's sizes and strides reach 768 bytes from its data pointer, but its storage holds 767"):
        plan.forward(*ptrs, tuple(short))
    assert torch.all(o == 7.0)  # refused before anything was written
    for i, name in enumerate(("q", "k", "v", "o", "lse")):
        bad = list(ptrs)
        bad[i] = 0
        with pytest.raises(apt.InvalidInput, match=f"{name} has no data"):
            plan.forward(*bad, tuple(avail))
    bad = list(ptrs)
    bad[2] += 4  # half a float64
    with pytest.raises(apt.InvalidInput, match="v's data pointer .* is not aligned to its 8-byte elements"):
        plan.forward(*bad, tuple(avail))
    plan.forward(*ptrs, tuple(avail))
    assert torch.equal(o, want)
    # The backward: nine tensors, each checked (the LSE by its own dtype).
    do, dq, dk, dv = torch.randn_like(o), torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    bts = (q, k, v, o, do, lse, dq, dk, dv)
    bptrs = [t.data_ptr() for t in bts]
    bavail = [_avail(t) for t in bts]
    plan.backward(*bptrs, tuple(bavail))
    for i, name in enumerate(("q", "k", "v", "o", "dO", "lse", "dQ", "dK", "dV")):
        short = list(bavail)
        short[i] -= 1
        with pytest.raises(apt.InvalidInput, match=f"{name}'s sizes and strides reach"):
            plan.backward(*bptrs, tuple(short))


def test_a_problem_whose_span_overflows_is_refused():
    huge = 2**62
    with pytest.raises(apt.InvalidInput, match="more than any storage holds"):
        _native.make_problem("float32", (2, 1, 1, 1, 1, 8, 8), ((huge, 8, 8), (8, 8, 8), (8, 8, 8), (8, 8, 8)),
                             0, -1, -1, False, 0.35, False)


# ---------------------------------------------------------------------------------------------
# The property test.

SEED = int(os.environ.get("ATTN_POLICY_PROPERTY_SEED", "30"))
CASES = int(os.environ.get("ATTN_POLICY_PROPERTY_CASES", "200"))

# Every field of an executor manifest and whether the evaluator below reads it; a field it does
# not know fails the test (the evaluator must learn it) instead of being ignored. The compute
# capability bounds are the device's, not the call's: an executor whose device does not meet
# them is unavailable, which the test already accepts as a refusal.
MANIFEST_FIELDS = {
    "name", "device", "min_compute_capability", "max_compute_capability", "dtypes", "head_dim_qk", "head_dim_v", "head_dim_v_may_differ",
    "masks", "windows", "rectangular", "layouts", "arbitrary_strides", "stride_multiple_of", "gqa", "max_seqlen",
    "max_score_elements", "backward", "deterministic", "notes",
    # Soft-capping, sinks, per-sequence lengths: the calls drawn here use none, and a manifest's
    # `features` only refuses calls that use one (test_torch_features.py covers those).
    "features",
}
_DT = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64"}


def manifest_refusal(m, c):
    """Why manifest ``m`` (as ``apt.executors()`` gives it) does not admit call ``c``, or None:
    each field read by its documented meaning."""
    unknown = set(m) - MANIFEST_FIELDS
    assert not unknown, f"manifest fields the test does not know: {unknown}"

    def dims_ok(r, d):
        return r["min"] <= d <= r["max"] and d % max(r["multiple_of"], 1) == 0

    if _DT[c["dtype"]] not in m["dtypes"]:
        return "dtype"
    if not dims_ok(m["head_dim_qk"], c["dqk"]) or not dims_ok(m["head_dim_v"], c["dv"]):
        return "head dim"
    if not m["head_dim_v_may_differ"] and c["dqk"] != c["dv"]:
        return "head_dim_v != head_dim_qk"
    if c["mask_kind"] not in m["masks"]:
        return "mask"
    if not m["windows"] and c["has_window"]:
        return "window"
    if not m["rectangular"] and c["sq"] != c["skv"]:
        return "rectangular"
    if not m["gqa"] and c["hq"] != c["hkv"]:
        return "gqa"
    if m["max_seqlen"] is not None and max(c["sq"], c["skv"]) > m["max_seqlen"]:
        return "max_seqlen"
    if m["max_score_elements"] is not None and c["b"] * c["hq"] * c["sq"] * c["skv"] > m["max_score_elements"]:
        return "max_score_elements"
    if c["deterministic"] and not m["deterministic"]:
        return "deterministic"
    mult = max(m["stride_multiple_of"], 1)
    if any(s % mult for s in c["strides"]):
        return "stride_multiple_of"
    if not m["arbitrary_strides"]:
        return "arbitrary strides" if not c["named_layout"] or c["layout"] not in m["layouts"] else None
    return None


def pack_with_unfused_chain(tmp_path, chain):
    """A copy of the te pack whose UnfusedDotProductAttention chain is ``chain``."""
    dst = tmp_path / "te"
    if not dst.exists():
        shutil.copytree(REPO / "rules" / "te", dst)
    text = (dst / "pack.yaml").read_text()
    head = text[: text.index("\nexecutors:")]
    chains = {"FlashAttention": ["torch_flash", "cudnn", "chunked", "reference"], "FusedAttention": ["cudnn", "reference"],
              "FrostAttention": ["frost", "reference"], "UnfusedDotProductAttention": chain}
    body = "".join(f"  - backend: {b}\n    chain: [{', '.join(c)}]\n" for b, c in chains.items())
    (dst / "pack.yaml").write_text(head + "\nexecutors:\n" + body)
    return attn_policy.Policy.load(str(dst))


def allowed_mask(sq, skv, causal, bottom_right, window, device):
    """Admitted (query, key) pairs ``[s_q, s_kv]``, written from the documented semantics."""
    left, right = (-1, -1) if window is None else window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    i = torch.arange(sq, device=device).unsqueeze(1) + (skv - sq if bottom_right else 0)
    j = torch.arange(skv, device=device).unsqueeze(0)
    ok = torch.ones(sq, skv, dtype=torch.bool, device=device)
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    return ok


def attention_in(q, k, v, allowed, scale, dtype):
    """Attention of bhsd tensors with every stored intermediate in ``dtype`` (the softmax in
    float32, float64 for float64): the naive same-dtype attention, and, in float64, the
    reference. Rows without an admitted key give 0."""
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~allowed, float("-inf"))
    sm = torch.float64 if dtype == torch.float64 else torch.float32
    p = torch.softmax(s.to(sm), -1)
    p = torch.where(allowed.any(-1, keepdim=True), p, torch.zeros_like(p)).to(dtype)
    return p @ v


def backward_from_stored_stats(q, k, v, do, allowed, scale, dtype):
    """dQ, dK, dV in float64 from O rounded to ``dtype`` and the LSE rounded to its stored
    dtype (float32; float64 for float64), by FlashAttention's backward formulas: what the op's
    contract (its backward starts from the O and LSE the forward stored) allows at best."""
    g = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = (q @ kr.transpose(-1, -2) * scale).masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, -1, keepdim=True)
    rows = allowed.any(-1, keepdim=True)
    lse0 = torch.where(rows, lse, torch.zeros_like(lse))
    o = torch.where(rows, torch.exp(s - lse0), torch.zeros_like(s)) @ vr
    o_r = o.to(dtype).double()
    lse_r = lse0.to(apt.lse_dtype(dtype)).double()
    p = torch.where(rows, torch.exp(s - lse_r), torch.zeros_like(s))
    ds = p * (do @ vr.transpose(-1, -2) - (do * o_r).sum(-1, keepdim=True))
    b, hq, sq, _ = q.shape
    dq = ds @ kr * scale
    dk = (ds.transpose(-1, -2) @ q * scale).view(b, hq // g, g, *k.shape[2:]).sum(2)
    dv = (p.transpose(-1, -2) @ do).view(b, hq // g, g, *v.shape[2:]).sum(2)
    return [dq, dk, dv]


def to_bhsd(t, layout):
    return {"bhsd": t, "bshd": t.transpose(1, 2), "sbhd": t.permute(1, 2, 0, 3)}[layout]


def logical_shape(layout, b, h, s, d):
    return {"bhsd": (b, h, s, d), "bshd": (b, s, h, d), "sbhd": (s, b, h, d)}[layout]


def make_tensor(rng, gen, shape, dtype, device, kind):
    """A tensor of ``shape`` with fresh random values, as a view of ``kind`` into its storage."""
    if kind == "permuted":  # the first three dims in another physical order, head dim last
        order = rng.sample(range(3), 3)
        base = torch.randn(*[shape[i] for i in order], shape[3], dtype=torch.float64, generator=gen)
        inv = [order.index(i) for i in range(3)]

        def view(t):
            return t.permute(*inv, 3)
    elif kind == "padded":  # gaps between rows, heads and batch entries
        pad = [rng.randint(0, 2) for _ in range(3)] + [rng.randint(1, 3)]
        base = torch.randn(*[n + p for n, p in zip(shape, pad)], dtype=torch.float64, generator=gen)

        def view(t):
            return t[: shape[0], : shape[1], : shape[2], : shape[3]]
    elif kind == "offset":  # a view into a larger storage, at an offset
        n, off = math.prod(shape), rng.randint(1, 9)
        base = torch.randn(n + off + rng.randint(0, 5), dtype=torch.float64, generator=gen)

        def view(t):
            return t[off: off + n].view(shape)
    elif kind == "strided-head-dim":  # head dim not contiguous: copied before an executor reads it
        base = torch.randn(*shape, 2, dtype=torch.float64, generator=gen)

        def view(t):
            return t[..., 0]
    elif kind == "expanded":  # a zero stride across a dim of size > 1
        one = list(shape)
        one[rng.randrange(3)] = 1
        base = torch.randn(*one, dtype=torch.float64, generator=gen)

        def view(t):
            return t.expand(*shape)
    else:
        base = torch.randn(*shape, dtype=torch.float64, generator=gen)

        def view(t):
            return t
    # The storage in the call's dtype and device, then the view (the values the reference reads).
    return view(base.to(dtype).to(device))


INVALID = ["batch-broadcast", "q-batch-1", "kv-seq", "dqk", "kv-heads", "gqa", "zero-dim", "dtype-mix",
           "bad-dtype", "meta", "not-a-tensor", "3d", "storage", "sparse"]
SHAPE_ERRORS = {"batch-broadcast", "q-batch-1", "kv-seq", "dqk", "kv-heads", "gqa"}
PATHS = ["eager", "cached", "op-mode", "raw-op", "no-grad"]


class _NoOpMode(torch.overrides.TorchFunctionMode):
    """A function mode that changes nothing: attention() then takes the op."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def gen_case(rng):
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    c = dict(layout=rng.choice(apt.LAYOUTS), dtype=rng.choice(list(_DT)), device=rng.choice(devices),
             b=rng.randint(1, 3), hkv=rng.randint(1, 3), sq=rng.randint(1, 9), skv=rng.randint(1, 9),
             dqk=rng.choice([1, 2, 3, 8, 16, 24, 64]), causal=rng.random() < 0.5,
             bottom_right=rng.random() < 0.5, grad=rng.random() < 0.5, path=rng.choice(PATHS),
             policy=rng.choice(["te", "te", "torch_math"]), invalid=None, big=False,
             kinds=[rng.choice(["contiguous", "permuted", "padded", "offset", "strided-head-dim", "expanded"])
                    for _ in range(3)])
    c["hq"] = c["hkv"] * rng.randint(1, 3)
    c["dv"] = c["dqk"] if rng.random() < 0.6 else rng.choice([1, 4, 8, 12])
    c["window"] = None if rng.random() < 0.6 else (rng.choice([-1, 0, 1, 3]), rng.choice([-1, 0, 2]))
    if rng.random() < 0.35:
        c["invalid"] = rng.choice(INVALID)
    elif rng.random() < 0.03 and c["device"] == "cpu":
        # More score elements than the reference's manifest admits (2^28), in small tensors
        # (one key, one query dim: no copy is larger than 33 K elements); te's chain on the CPU.
        c.update(big=True, b=1, hq=1, hkv=1, sq=16385, skv=16385, dqk=1, dv=1, policy="te", grad=False,
                 kinds=["contiguous"] * 3, window=None, causal=False, path=rng.choice(["eager", "no-grad"]))
    return c


def build(rng, c):
    """(q, k, v) of the case (invalid ones broken as the case says), and the call's facts."""
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    lay, dt, dev = c["layout"], c["dtype"], c["device"]
    b, hq, hkv, sq, skv, dqk, dv = (c[x] for x in ("b", "hq", "hkv", "sq", "skv", "dqk", "dv"))
    bq = bk = bv = b
    sv, dk_, hv, hq_ = skv, dqk, hkv, hq
    inv = c["invalid"]
    if inv == "batch-broadcast":
        bq, bk, bv = 2, 1, 1
    elif inv == "q-batch-1":
        bq, bk, bv = 1, 2, 2
    elif inv == "kv-seq":
        sv = skv + 1
    elif inv == "dqk":
        dk_ = dqk + 1
    elif inv == "kv-heads":
        hv = hkv + 1
    elif inv == "gqa":
        hkv = hv = 2
        hq_ = 3
    shapes = [logical_shape(lay, bq, hq_, sq, dqk), logical_shape(lay, bk, hkv, skv, dk_),
              logical_shape(lay, bv, hv, sv, dv)]
    if inv == "zero-dim":
        i, j = rng.randrange(3), rng.randrange(4)
        shapes[i] = tuple(0 if n == j else s for n, s in enumerate(shapes[i]))
    ts = [make_tensor(rng, gen, s, dt, dev, kind) for s, kind in zip(shapes, c["kinds"])]
    if inv == "dtype-mix":
        other = rng.choice([d for d in _DT if d != dt])
        ts[2] = ts[2].to(other)
    elif inv == "bad-dtype":
        ts = [t.to(rng.choice([torch.int32, torch.complex64])) for t in ts]
    elif inv == "meta":
        i = rng.randrange(3)
        ts[i] = torch.empty(ts[i].shape, dtype=ts[i].dtype, device="meta")
    elif inv == "not-a-tensor":
        ts[rng.randrange(3)] = ts[0].tolist() if rng.random() < 0.5 else 1.0
    elif inv == "3d":
        i = rng.randrange(3)
        ts[i] = ts[i][0]
    elif inv == "sparse":
        ts[rng.randrange(3)] = ts[0].to_sparse()
    return ts


def call_facts(c, q, k, v):
    """What the manifests are read against (the strides after the copy of a tensor whose head
    dim is not contiguous or that has a zero stride, as ``attention`` documents)."""
    def usable(t):
        st = t.stride()
        ok = st[-1] == 1 and all(s > 0 or n <= 1 for s, n in zip(st, t.shape))
        return t if ok else t.contiguous()

    strides = []
    for t in (q, k, v):
        st = usable(t).stride()
        strides += [s for s, n in zip(st[:3], t.shape[:3])]
    wl, wr = (-1, -1) if c["window"] is None else c["window"]
    mask_kind = ("causal_bottom_right" if c["bottom_right"] else "causal_top_left") if c["causal"] else "no_mask"
    return dict(dtype=c["dtype"], dqk=c["dqk"], dv=c["dv"], b=c["b"], hq=c["hq"], hkv=c["hkv"], sq=c["sq"],
                skv=c["skv"], mask_kind=mask_kind, has_window=wl >= 0 or (not c["causal"] and wr >= 0),
                deterministic=torch.are_deterministic_algorithms_enabled(), strides=strides,
                named_layout=all(usable(t).is_contiguous() for t in (q, k, v)), layout=c["layout"])


def run_call(c, q, k, v, policy):
    kw = dict(layout=c["layout"], is_causal=c["causal"], diagonal="bottom_right" if c["bottom_right"] else "top_left",
              window=c["window"], policy=policy)
    path = c["path"]
    if path == "raw-op":
        li = apt.LAYOUTS.index(c["layout"])
        mask = (2 if c["bottom_right"] else 1) if c["causal"] else 0
        wl, wr = apt._window_args(c["window"], c["causal"])
        d = q.shape[-1] if isinstance(q, torch.Tensor) and q.dim() and q.shape[-1] else 1
        args = (li, mask, wl, wr, c["bottom_right"], 1 / math.sqrt(d), 0.0, bool(c["grad"]), apt._policy_id(policy), 0,
                False)
        o, _ = torch.ops.attn_policy.attention(q, k, v, *args)
        return o, None
    if path == "no-grad":
        with torch.no_grad():
            return apt.attention(q, k, v, return_decision=True, **kw)
    if path == "op-mode":
        with _NoOpMode():
            return apt.attention(q, k, v, return_decision=True, **kw)
    if path == "cached":
        apt.attention(q, k, v, **kw)
    return apt.attention(q, k, v, return_decision=True, **kw)


def criterion(got, q, k, v, c, do):
    """Max errors against float64 and of the naive same-dtype attention (O and, with a
    gradient, dQ dK dV); raises AssertionError naming what missed err <= 2 err_naive."""
    dt = c["dtype"]
    qh, kh, vh = (to_bhsd(t.detach(), c["layout"]) for t in (q, k, v))
    allowed = allowed_mask(c["sq"], c["skv"], c["causal"], c["bottom_right"], c["window"], qh.device)
    scale = 1 / math.sqrt(c["dqk"])
    outs = {}
    for kind, d in (("exact", torch.float64), ("naive", dt)):
        xs = [t.to(d).detach().requires_grad_(c["grad"]) for t in (qh, kh, vh)]
        y = attention_in(*xs, allowed, scale, d)
        outs[kind] = [y.detach()]
        if c["grad"]:
            outs[kind] += list(torch.autograd.grad(y, xs, to_bhsd(do, c["layout"]).to(d)))
    # The forward's floor is 0 (O rounded once is "best" below); the gradients' is what
    # starting from the stored O and LSE costs.
    stats = [outs["exact"][0]]
    if c["grad"]:
        stats += backward_from_stored_stats(*(t.double() for t in (qh, kh, vh)),
                                            to_bhsd(do, c["layout"]).double(), allowed, scale, dt)
    names = ["O", "dQ", "dK", "dV"]
    for i, g in enumerate(got):
        exact = outs["exact"][i]
        err = (to_bhsd(g, c["layout"]).double() - exact).abs().max().item()
        naive = (outs["naive"][i].double() - exact).abs().max().item()
        # The criterion's floor where the naive attention happens to be exact (tiny problems):
        # the least error of an answer in this dtype (the exact one rounded once), plus, for a
        # gradient, what the stored O and LSE cost; in float64, roundoff noise.
        best = (exact.to(dt).double() - exact).abs().max().item()
        best += (stats[i] - exact).abs().max().item()
        noise = 64 * torch.finfo(torch.float64).eps * max(1.0, exact.abs().max().item())
        bound = 2 * max(naive, best, noise)
        assert math.isfinite(err) and err <= bound, f"{names[i]}: err {err:.3e} > 2 x max(naive {naive:.3e}, " \
                                                    f"floor {best:.3e}, noise {noise:.1e})"


def test_property_random_calls_run_right_or_are_refused_typed(tmp_path):
    rng = random.Random(SEED)
    policies = {"te": None, "torch_math": pack_with_unfused_chain(tmp_path, ["torch_math", "reference"])}
    manifests = {e["name"]: e for e in apt.executors()}
    seen = {"ran": 0, "declined": 0, "invalid": 0}
    outcomes_by_path = set()
    for n in range(CASES):
        c = gen_case(rng)
        where = f"case {n} of seed {SEED} (ATTN_POLICY_PROPERTY_SEED={SEED}): {c}"
        try:
            q, k, v = build(rng, c)
            if c["path"] == "raw-op" and c["invalid"] in ("not-a-tensor", "sparse"):
                # torch's own schema and dispatcher answer these before the op's code runs.
                c["path"] = "eager"
            if c["grad"] and c["invalid"] in (None, "storage") and c["path"] != "no-grad":
                q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
            if c["invalid"] == "storage":
                # First a valid call (which must be right), then the same signature with a
                # storage too small for its strides: refused on the cached path too.
                run_call(dict(c, invalid=None), q, k, v, policies[c["policy"]])
                _shrink(k)
        except Exception as e:  # noqa: BLE001 - the test's own construction must not fail
            raise AssertionError(f"building {where}: {type(e).__name__}: {e}") from e
        try:
            res = run_call(c, q, k, v, policies[c["policy"]])
        except apt.InvalidInput as e:
            assert c["invalid"] is not None, f"a valid call was refused as invalid: {e}\n{where}"
            if c["invalid"] in SHAPE_ERRORS:
                assert isinstance(e, apt.ShapeMismatch), f"{type(e).__name__} for a shape mismatch: {e}\n{where}"
            seen["invalid"] += 1
            outcomes_by_path.add((c["path"], "invalid"))
            continue
        except apt.AttentionDeclined as e:
            assert c["invalid"] is None, f"invalid tensors were declined, not refused: {e}\n{where}"
            d = e.decision
            assert d.backend is not None and d.chain, f"declined without a chain: {d.summary()}\n{where}"
            facts = call_facts(c, q, k, v)
            for entry in d.chain:
                m = manifests[entry.executor]
                if entry.outcome == "unavailable":
                    # Unavailable in this process, or on another device than the tensors'.
                    assert m["availability"] == "unavailable" or m["manifest"]["device"] != c["device"], \
                        f"{entry.executor} was unavailable but is available here: {entry.reason}\n{where}"
                else:
                    assert entry.outcome == "refused", (entry, where)
                    why = manifest_refusal(m["manifest"], facts)
                    assert why is not None, (f"{entry.executor} refused ({entry.reason}) what its manifest admits"
                                             f"\n{where}")
            seen["declined"] += 1
            outcomes_by_path.add((c["path"], "declined"))
            continue
        except Exception as e:  # noqa: BLE001 - anything else is the failure this test looks for
            raise AssertionError(f"{type(e).__name__}: {e}\n{where}") from e
        assert c["invalid"] is None, f"invalid tensors ({c['invalid']}) were not refused\n{where}"
        o, decision = res
        if decision is not None:
            assert decision.executor is not None, where
            why = manifest_refusal(manifests[decision.executor]["manifest"], call_facts(c, q, k, v))
            assert why is None, f"{decision.executor} ran what its manifest refuses ({why})\n{where}"
        got = [o]
        do = None
        if c["grad"] and o.requires_grad:
            do = torch.randn(o.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(n)).to(o)
            got += list(torch.autograd.grad(o, (q, k, v), do))
        c = dict(c, grad=do is not None)
        try:
            criterion(got, q, k, v, c, do)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{where}") from None
        seen["ran"] += 1
        outcomes_by_path.add((c["path"], "ran"))
    # The generator reached every outcome, and every path refused and ran something.
    assert all(seen.values()), seen
    for p in PATHS:
        assert (p, "ran") in outcomes_by_path and (p, "invalid") in outcomes_by_path, (p, sorted(outcomes_by_path))
