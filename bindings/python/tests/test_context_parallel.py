"""Context-parallel attention (attn_policy.context_parallel) on CPUs: the planner, the pre-flight
against the `native` pack over generated configurations, and spawned gloo worlds of 2 and 4
ranks in float64 whose forward and backward equal the single-process result to 1e-10 relative.

Gloo lacks `all_to_all` (the list form: "Backend gloo does not support alltoall"); the
implementation uses `all_to_all_single`, which gloo has, so a2a and a2a+p2p run here too. Gloo has
no CUDA streams: the second-stream overlap of the ring runs only on GPUs (NCCL), which
`python -m attn_policy.cp_check --device cuda` and the GPU test cover."""

import itertools
import random
import re

import pytest

torch = pytest.importorskip("torch")

import attn_policy  # noqa: E402
import attn_policy.context_parallel as cp  # noqa: E402
import attn_policy.torch as apt  # noqa: E402
from attn_policy import cp_check  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Sharding and the planner (no processes).


@pytest.mark.parametrize("layout", ["bhsd", "bshd", "sbhd"])
def test_sharding_is_te_s_and_round_trips(layout):
    n = 3
    full = torch.arange(2 * n * 2, dtype=torch.float64)  # 2 tokens per chunk
    shape = {"bhsd": (1, 1, -1, 1), "bshd": (1, -1, 1, 1), "sbhd": (-1, 1, 1, 1)}[layout]
    x = full.view(*shape)
    shards = [apt.shard_sequence(x, n, r, layout) for r in range(n)]
    # Rank r holds chunks r and 2n-1-r.
    assert shards[0].flatten().tolist() == [0, 1, 10, 11]
    assert shards[1].flatten().tolist() == [2, 3, 8, 9]
    assert shards[2].flatten().tolist() == [4, 5, 6, 7]
    assert torch.equal(apt.unshard_sequence(shards, layout), x)
    with pytest.raises(attn_policy.PolicyError, match="not divisible by 8"):
        apt.shard_sequence(x, 4, 0, layout)


def allowed_pairs(sq, skv, mask, wl, wr, br):
    """Admitted (query, key) pairs of the whole call, written out (independent of the planner's
    band arithmetic)."""
    off = skv - sq if br else 0
    right = 0 if mask else wr
    out = set()
    for i in range(sq):
        for j in range(skv):
            if wl >= 0 and j < i + off - wl:
                continue
            if right >= 0 and j > i + off + right:
                continue
            out.add((i, j))
    return out


def block_pairs(blk):
    """Pairs a block admits, in block coordinates, from the op's mask semantics."""
    mask, wl, wr = blk.op_mask()
    right = 0 if mask else wr
    m, w = blk.q1 - blk.q0, blk.k1 - blk.k0
    return {(i, j) for i in range(m) for j in range(w)
            if not (wl >= 0 and j < i - wl) and not (right >= 0 and j > i + right)}


MASKS = [
    (0, -1, -1, False), (1, -1, 0, False), (2, -1, 0, True), (1, 3, 0, False), (2, 5, 0, True),
    (0, 2, 3, False), (0, -1, 2, False), (0, 4, -1, True), (0, 0, 0, False), (1, 0, 0, True),
]


@pytest.mark.parametrize("comm", ["p2p", "all_gather"])
def test_blocks_cover_every_admitted_pair_exactly_once(comm):
    """For every rank, the steps' blocks (mapped back to global positions) cover exactly the
    admitted pairs of the rank's query rows, each once; every block row has a key."""
    checked = 0
    for n, (cq, ck), (mask, wl, wr, br) in itertools.product((1, 2, 3, 4), ((2, 2), (1, 3), (3, 2), (2, 5)), MASKS):
        sq, skv = 2 * n * cq, 2 * n * ck
        want = allowed_pairs(sq, skv, mask, wl, wr, br)
        spec = cp.CPSpec(comm, n, 1, 1, 1, 1, sq, skv, 8, 8, mask=mask, window_left=wl, window_right=wr, bottom_right=br)
        for r in range(n):
            qrows = list(range(r * cq, (r + 1) * cq)) + list(range((2 * n - 1 - r) * cq, (2 * n - r) * cq))
            got = []
            for st in cp.plan_work(spec, r):
                src = st.kv_from
                if comm == "p2p":
                    keys = list(range(src * ck, (src + 1) * ck)) + list(range((2 * n - 1 - src) * ck, (2 * n - src) * ck))
                else:
                    keys = list(range(skv))
                for blk in st.blocks:
                    local = block_pairs(blk)
                    assert blk.pairs() == len(local), (blk, n, mask)
                    rows_with_keys = {i for i, _ in local}
                    assert rows_with_keys == set(range(blk.q1 - blk.q0)), f"a block row without keys: {blk}"
                    got += [(qrows[blk.q0 + i], keys[blk.k0 + j]) for i, j in local]
            mine = {(i, j) for (i, j) in want if i in set(qrows)}
            assert len(got) == len(set(got)), "a pair computed twice"
            assert set(got) == mine, (comm, n, cq, ck, mask, wl, wr, br, r)
            checked += 1
    assert checked == 400  # 4 shapes x 10 masks x (1 + 2 + 3 + 4) ranks


def test_causal_ring_balances_work_and_skips_masked_chunk_pairs():
    n, c = 4, 8
    spec = cp.CPSpec("p2p", n, 1, 1, 1, 1, 2 * n * c, 2 * n * c, 8, 8, mask=1)
    per_rank = []
    for r in range(n):
        steps = cp.plan_work(spec, r)
        # One call per step: own chunks causal (the upper-right pair skipped), then two full
        # chunk pairs of four.
        assert [len(s.blocks) for s in steps] == [1] * n
        assert steps[0].blocks[0].kind == "causal" and steps[0].pairs_skipped == 1
        assert all(s.pairs_skipped == 2 and s.blocks[0].kind == "full" for s in steps[1:])
        per_rank.append(sum(s.pairs() for s in steps))
    assert len(set(per_rank)) == 1, per_rank
    assert sum(per_rank) == len(allowed_pairs(2 * n * c, 2 * n * c, 1, -1, -1, False))


# ---------------------------------------------------------------------------------------------
# The pre-flight (native pack) against the implementation's own planner.


def generated_specs():
    """>= 10k configurations: every comm type, cp_size 1-8 (a2a sizes dividing it or not),
    divisible and non-divisible heads and lengths, masks and windows, all layouts."""
    heads = [(8, 8), (8, 2), (6, 3), (12, 4), (5, 5), (4, 1), (16, 8)]
    masks = [(0, -1, -1, False), (1, -1, 0, False), (2, -1, 0, True), (1, 4, 0, False),
             (0, 3, 2, False), (0, -1, 2, False), (2, 6, 0, True), (0, 2, -1, True)]
    layouts = ["bshd", "sbhd", "bhsd"]
    i = 0
    for comm in cp.COMM_TYPES:
        for n in range(1, 9):
            a2a_sizes = sorted({1, 2, 3, 4, n}) if comm == "a2a+p2p" else [n if comm == "a2a" else 1]
            lengths = [(2 * n * 3, 2 * n * 3), (2 * n * 2, 2 * n * 4), (2 * n * 3 + 1, 2 * n * 3),
                       (2 * n * 4, 2 * n * 3 + 2), (2 * n * 2 + n, 2 * n * 2 + n)]
            for a2a, (hq, hkv), (sq, skv), (mask, wl, wr, br) in itertools.product(a2a_sizes, heads, lengths, masks):
                i += 1
                yield cp.CPSpec(comm, n, a2a, 1, hq, hkv, sq, skv, 16, 16, layouts[i % 3], "bfloat16", "cpu",
                                mask, wl, wr, br)


def test_preflight_agrees_with_the_implementation_over_generated_configs():
    env = apt.live_facts("cpu")
    n_adm = n_dec = 0
    codes = set()
    for spec in generated_specs():
        d = cp.preflight(spec, env)
        refusal = cp.implementation_refusal(spec)
        ok = cp.admitted(d)
        # The fused backend serves neither these small head dims nor a CPU: its declines
        # (fused.head-dim, fused.device) say nothing about the ring.
        declined = {r.id: r.layer for b in d.backends if b.name != "fused" for r in b.declined_by}
        if refusal is None:
            assert ok, f"the pack declines what cp_attention runs: {spec} {declined}"
            n_adm += 1
        else:
            assert not ok, f"the pack admits what cp_attention cannot run ({refusal}): {spec}"
            # Declined by the context_parallel layer, including the limit the planner hit.
            cp_rules = {i for i, layer in declined.items() if layer == "context_parallel"}
            assert f"cp.{refusal.code}" in cp_rules, (spec, declined, refusal.code)
            assert set(declined) - cp_rules <= {"cudnn.device", "chunked.device"}, declined
            n_dec += 1
            codes.add(refusal.code)
    assert n_adm + n_dec >= 10_000
    assert n_adm >= 2000 and n_dec >= 2000, (n_adm, n_dec)
    assert codes == {"shards", "a2a-heads", "a2a-grid"}


def test_native_a2a_reason_is_te_s():
    """Where TE has the same limit, the native rule states TE's reason."""
    config = cp.CPSpec("a2a", 4, 4, 1, 6, 3, 32, 32, 128, 128, "bshd", "bfloat16", "cuda", 1).config()
    config["device_compute_capability"] = [9, 0]
    te = attn_policy.Policy.load("te").select(config)
    native = cp.preflight(cp.CPSpec("a2a", 4, 4, 1, 6, 3, 32, 32, 128, 128, "bshd", "bfloat16", "cpu", 1))
    te_reason = {r.reason for b in te.backends for r in b.declined_by if r.id == "RG.a2a_heads"}
    native_reason = {r.reason for b in native.backends for r in b.declined_by if r.id == "cp.a2a-heads"}
    assert te_reason and te_reason == native_reason


def test_fp64_lse_and_backward_from_the_given_statistics():
    """The op's LSE is float64 for float64 inputs, and its backward uses the O and LSE it is
    given (what a ring step's backward needs): with the LSE of a larger softmax the gradient is
    that softmax's restricted to the call's keys."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 5, 8, dtype=torch.float64, generator=g)
    k = torch.randn(1, 2, 12, 8, dtype=torch.float64, generator=g)
    v = torch.randn(1, 2, 12, 8, dtype=torch.float64, generator=g)
    args = (0, 0, -1, -1, False, 0.35, 0.0, True, 0, 0, False)
    o, lse = torch.ops.attn_policy.attention(q, k, v, *args)
    assert lse.dtype == torch.float64
    want = torch.logsumexp(q @ k.transpose(-1, -2) * 0.35, -1)
    torch.testing.assert_close(lse, want, rtol=1e-14, atol=1e-14)
    # Keys 0..6 as one call, with the whole softmax's O and LSE: gradients of the whole softmax.
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    full = torch.softmax(qq @ kk.transpose(-1, -2) * 0.35, -1) @ vv
    do = torch.randn(full.shape, dtype=torch.float64, generator=g)
    full.backward(do)
    dq, dk, dv = torch.ops.attn_policy.attention_backward(
        do, q, k[:, :, :7].contiguous(), v[:, :, :7].contiguous(), o, lse, *args)
    torch.testing.assert_close(dk, kk.grad[:, :, :7], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dv, vv.grad[:, :, :7], rtol=1e-12, atol=1e-12)
    dq2, _, _ = torch.ops.attn_policy.attention_backward(
        do, q, k[:, :, 7:].contiguous(), v[:, :, 7:].contiguous(), o, lse, *args)
    torch.testing.assert_close(dq + dq2, qq.grad, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Spawned gloo worlds, float64 through the CPU reference.


def spec_case(spec: cp.CPSpec, group, name: str, expect: str = "pass", seed: int = 0):
    a, p = spec.a2a_size, spec.cp_size // max(spec.a2a_size, 1)
    return dict(b=spec.batch, hq=spec.heads_q, hkv=spec.heads_kv, sq=spec.seqlen_q, skv=spec.seqlen_kv,
                d=spec.head_dim_qk, dv=spec.head_dim_v, causal=spec.mask != 0,
                diagonal="bottom_right" if spec.bottom_right else "top_left",
                window=[spec.window_left, spec.window_right] if (spec.window_left >= 0 or spec.window_right >= 0) else None,
                layout=spec.layout, comm=spec.comm, group=group, name=name, expect=expect, seed=seed)


def group_for(spec: cp.CPSpec, world: int):
    if spec.cp_size > world:
        return None
    if spec.comm == "a2a+p2p":
        if spec.cp_size % spec.a2a_size:
            return None  # no pair of real groups has these sizes
        return ["grid", spec.a2a_size, spec.cp_size // spec.a2a_size]
    return ["world"] if spec.cp_size == world else ["sub", spec.cp_size]


def world_cases(world: int, n_generated: int):
    cases = cp_check.default_cases(world, "cpu")
    n = world
    base = dict(b=2, hq=2 * n, hkv=n, d=8, dv=8, group=["world"], expect="pass")
    extra = [
        ("MQA, causal, d_v != d_qk", dict(hq=4, hkv=1, dv=6, sq=4 * n, skv=4 * n, causal=True, layout="sbhd")),
        ("two-sided window (3, 2), no mask", dict(sq=6 * n, skv=6 * n, window=[3, 2], layout="bshd")),
        ("bottom-right, s_q = 2 s_kv (rows without keys)", dict(sq=8 * n, skv=4 * n, causal=True,
                                                               diagonal="bottom_right", layout="bhsd")),
        ("causal top-left, s_kv = 3 s_q", dict(sq=2 * n, skv=6 * n, causal=True, layout="bshd")),
        ("window (4, 0) around bottom-right, rect", dict(sq=4 * n, skv=8 * n, causal=True, window=[4, 0],
                                                        diagonal="bottom_right", layout="sbhd")),
    ]
    for comm in cp.COMM_TYPES:
        grp = ["grid", 2, n // 2] if comm == "a2a+p2p" else ["world"]
        for name, shp in extra:
            case = dict(base, **shp, comm=comm, group=grp, name=name)
            if comm in ("a2a", "a2a+p2p") and case["hkv"] % (n if comm == "a2a" else 2):
                continue
            cases.append(case)
    # Declined on every rank, before any K/V moves.
    cases += [
        dict(base, sq=3 * n, skv=3 * n, comm="p2p", name="local length 3 (cp.shards)", expect="declined",
             causal=True, layout="bshd"),
        dict(base, hq=6, hkv=3, sq=4 * n, skv=4 * n, comm="a2a", name="3 KV heads (cp.a2a-heads)",
             expect="declined", layout="bshd"),
        dict(base, sq=4 * n, skv=4 * n, comm="all_gather", name="dropout (native extras)", expect="declined",
             layout="bshd", dropout_p=0.1),
    ]
    # Mismatched shards: refused on every rank.
    cases += [
        dict(base, sq=4 * n, skv=4 * n, causal=True, comm="p2p", layout="bshd", name="rank 0 float32", expect="mismatch",
             rank0_dtype="float32"),
        dict(base, sq=4 * n, skv=4 * n, causal=True, comm="a2a", layout="bshd", name="rank 0 has fewer heads",
             expect="mismatch", rank0_drop_heads=n),
        dict(base, sq=4 * n, skv=4 * n, causal=True, comm="all_gather", layout="bshd",
             name="rank 0 says p2p", expect="mismatch", rank0_comm="p2p"),
        dict(base, sq=4 * n, skv=4 * n, causal=True, comm="a2a+p2p", group=["grid", 2, n // 2], layout="bshd",
             name="rank 0 longer (grid)", expect="mismatch", rank0_extra_tokens=2),
    ]
    # Admitted configurations of the generator that fit this world, run end to end.
    rng = random.Random(world)
    pool = [s for s in generated_specs() if group_for(s, world) is not None and cp.implementation_refusal(s) is None
            and s.cp_size > 1 and s.heads_q <= 8 and s.seqlen_kv <= 40]
    for i, spec in enumerate(rng.sample(pool, n_generated)):
        spec = cp.CPSpec(**{**spec.__dict__, "head_dim_qk": 8, "head_dim_v": 8, "batch": 1 + i % 2})
        cases.append(spec_case(spec, group_for(spec, world), f"generated #{i}", seed=i))
    # Declined configurations of the generator: refused on every member rank.
    # (A grid whose sizes do not multiply to cp_size cannot be built from real groups.)
    pool = [s for s in generated_specs() if group_for(s, world) is not None and s.seqlen_kv <= 40
            and s.seqlen_q % s.cp_size == 0 and s.seqlen_kv % s.cp_size == 0
            and (cp.implementation_refusal(s) or cp._Unplannable("", "")).code in ("shards", "a2a-heads")]
    for i, spec in enumerate(rng.sample(pool, 10)):
        cases.append(spec_case(spec, group_for(spec, world), f"generated declined #{i}", expect="declined", seed=i))
    return cases


@pytest.fixture(scope="module")
def world4():
    cases = world_cases(4, 60)
    return cases, cp_check.spawn(4, "cpu", cases, timeout_s=900)


@pytest.fixture(scope="module")
def world2():
    cases = world_cases(2, 20)
    return cases, cp_check.spawn(2, "cpu", cases, timeout_s=600)


def check_world(cases, results):
    ok, lines = cp_check.table(cases, results, "float64")
    failed = [ln for ln in lines[1:] if " FAIL " in ln]
    assert not failed, "\n".join([lines[0]] + failed)
    return lines


def test_world2_every_comm_type_equals_the_single_process_result(world2):
    lines = check_world(*world2)
    comms = {ln.split()[0] for ln in lines[1:]}
    assert comms == set(cp.COMM_TYPES)


def test_world4_every_comm_type_equals_the_single_process_result(world4):
    cases, results = world4
    check_world(cases, results)
    ran = [c for c in cases if c["expect"] == "pass" and c["name"].startswith("generated")]
    assert len(ran) >= 50
    assert {c["comm"] for c in ran} == set(cp.COMM_TYPES)
    # Each of those really ran on every member rank (errors measured), none was refused.
    for i, c in enumerate(cases):
        if c["expect"] == "pass":
            members = [results[r][i] for r in range(4) if results[r][i]["member"]]
            assert members and all("rel_o" in m for m in members), c


def test_world4_declines_and_mismatches_are_refused_on_every_rank(world4):
    cases, results = world4
    for i, c in enumerate(cases):
        if c["expect"] == "pass":
            continue
        members = [results[r][i] for r in range(4) if results[r][i]["member"]]
        want = {"mismatch": "ShardMismatch", "declined": "ContextParallelDeclined", "invalid": "InvalidInput"}[c["expect"]]
        assert members and all(m.get("raised") == want for m in members), (c["name"], members)
        if c["name"].startswith("rank 0 float32"):
            assert all("dtype differs" in m["message"] for m in members), members
        if c["expect"] == "invalid":
            # Every rank names the rank whose shards disagree, and how.
            assert all("rank 0: q and k differ in batch (2 vs 1)" in m["message"] for m in members), members
    assert any(c["expect"] == "invalid" for c in cases)


def test_bench_dry_run_with_world_size_1():
    """The torchrun bench runs every comm type (world of one, CPU) and prints its table."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    bench = Path(__file__).with_name("bench_cp.py")
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--master-port", str(port),
         str(bench), "--device", "cpu", "--dtype", "float32", "--seqlen", "64", "--head-dim", "16", "--heads", "2",
         "--kv-heads", "1", "--causal", "--iters", "1", "--warmup", "0"],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("context-parallel bench: world 1 (gloo, cpu)"), out.stdout
    rows = [re.match(r"^(\S+)(?: \d+x\d+)?\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s", ln) for ln in lines[2:]]
    assert all(rows), out.stdout
    assert {m.group(1) for m in rows} == {"p2p", "all_gather", "a2a", "a2a+p2p"}, out.stdout
    for m in rows:
        fwd_ms, fb_ms = float(m.group(2)), float(m.group(3))
        assert 0 < fwd_ms and 0 < fb_ms, m.group(0)


_BAD_OPTIONS = r'''
import os, torch, torch.distributed as dist
from attn_policy import context_parallel as cp
from attn_policy._decision import InvalidInput
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=0, world_size=1)
q, k, v = (torch.randn(1, 2, 8, 16, dtype=torch.float64) for _ in range(3))
for name, value in [("is_causal", "no"), ("scale", "0.1"), ("dropout_p", "0"), ("no_substitute", "yes"),
                    ("return_decision", torch.tensor(True))]:
    try:
        cp.cp_attention(q, k, v, cp_group=None, **{name: value})
    except InvalidInput as e:
        assert name in str(e), (name, str(e))
        print("refused", name)
    else:
        raise SystemExit(f"{name}={value!r} was accepted")
o = cp.cp_attention(q, k, v, cp_group=None, is_causal=1)  # 1 and 0 are flags, as in attention()
assert o.shape == q.shape
print("ran")
dist.destroy_process_group()
'''


def test_cp_attention_refuses_options_of_the_wrong_type_naming_them():
    """cp_attention checks its scalar options as attention() does: a string is not read by its
    truth value or parsed as a number (a world of one, gloo, in a subprocess)."""
    import os
    import socket
    import subprocess
    import sys

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    out = subprocess.run([sys.executable, "-c", _BAD_OPTIONS], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PORT=str(port), OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    refused = [ln.split()[1] for ln in out.stdout.splitlines() if ln.startswith("refused ")]
    assert refused == ["is_causal", "scale", "dropout_p", "no_substitute", "return_decision"], out.stdout
    assert out.stdout.splitlines()[-1] == "ran", out.stdout
