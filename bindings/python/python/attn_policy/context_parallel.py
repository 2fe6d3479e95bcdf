"""Context-parallel attention over ``torch.distributed``: the sequence is sharded across the ranks
of a process group and each rank computes the attention of its queries against every key.

    import attn_policy.torch as apt
    q_loc, k_loc, v_loc = (apt.shard_sequence(t, cp_size, cp_rank, layout="bshd") for t in (q, k, v))
    o_loc = apt.cp_attention(q_loc, k_loc, v_loc, cp_group=group, cp_comm_type="p2p",
                             layout="bshd", is_causal=True)

Sharding (TransformerEngine's, for every layout): the sequence is cut into ``2 * cp_size`` equal
chunks and rank ``r`` holds chunks ``r`` and ``2 * cp_size - 1 - r``, concatenated, so a causal
mask gives every rank the same work. Q, K and V are sharded alike (``shard_sequence``).

Algorithms (``cp_comm_type``):

- ``"p2p"``: K/V travel around the ring with ``batch_isend_irecv``, overlapped with the current
  step's attention (on CUDA the exchange is issued on a second stream). Each step's work is
  derived from the chunk positions: each (query chunk, key chunk) pair is full, banded
  (diagonal-causal or a sliding window) or skipped, and the pairs of a step are run in as few
  executor calls as their masks allow. Partial results (O, LSE) are merged by log-sum-exp in
  float32 (float64 for float64 inputs). The backward sends K/V around again with the partial
  dK/dV travelling alongside, each rank adding its contribution in ring order (deterministic).
- ``"all_gather"``: K/V are gathered; each query chunk attends the keys its mask admits in one
  call; the backward returns dK/dV with an all-to-all and sums the ranks' parts in rank order.
- ``"a2a"`` (Ulysses): an all-to-all turns sequence shards into head shards (the whole sequence,
  ``heads / cp_size`` heads), one ordinary call runs, and another all-to-all returns O.
- ``"a2a+p2p"``: ``cp_group=(a2a_group, p2p_group)``: a2a inside each a2a group, then the p2p
  ring across the groups. The CP rank of a process is ``p2p_rank * a2a_size + a2a_rank``
  (:func:`cp_rank`).

Every attention computed is a call of the ``attention`` op (the executors, chosen per call
shape by ``policy``): no attention arithmetic happens here beyond the log-sum-exp merge.

Before any K/V moves, a pre-flight decides with the ``native`` pack on the facts of the whole
call (``context_parallel``, ``cp_size``, ``cp_comm_type``, global lengths, ...; its
``context_parallel`` layer holds this implementation's limits), and every per-step call is decided
by ``policy``. Then one small all-gather of a descriptor (shapes, dtype, options, the local
verdict) lets every rank see every other's: mismatched shards or a decline on any rank raise on
every rank instead of leaving some waiting. See docs/context-parallel.md.

The implementation's parts, in private modules this one imports (one way): ``_cp_plan`` (sharding,
the blocks of every step, the pre-flight), ``_cp_steps`` (the per-block op calls and the merge) and
``_cp_comm`` (the descriptor exchange, the ring and collectives, the autograd function).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
import torch.distributed as dist

from . import Decision, Policy, PolicyError  # noqa: F401
from ._call import DIAGONALS, _check_inputs, _flag, _real, _window_args
from ._chain import _policy_id
from ._decision import InvalidInput
from ._facts import live_facts
from ._model import deprecated_alias
from ._tensors import _bhsd, _usable, lse_dtype
# Everything below was defined in this module before it was split, and stays importable from it.
from ._cp_comm import (  # noqa: F401
    _CP, _DECLINED, _FIELDS, _INPUT, _INVALID, _MAGIC, _MISMATCH, _OK, _PER_RANK, _a2a_many, _agree,
    _coll_device, _comm_stream, _exchange, _f64_bits, _full_like, _gather_kv, _gather_messages, _groups,
    _half, _heads_to_seq, _natural, _p2p, _Peers, _rank_shard, _return_dkv, _ring_backward, _ring_forward,
    _seq_to_heads, _show, _streams, _wait, cp_rank, cp_size,
)
from ._cp_plan import (  # noqa: F401
    _DTYPE_CODES, _FACT_DTYPES, _HEAD_DIM, _SEQ_DIM, _STATS_BACKWARD, COMM_TYPES, LAYOUTS, Block,
    ContextParallelDeclined, _CPRecord, CPSpec, ShardMismatch, StepWork, _Band, _band, _block, _chunk,
    _decline_text, _full_pair, _gather_step, _native, _plan_all, _plan_work, _ring_step, _seq_dim,
    _split_heads, _sum_max0, _sum_min, _Unplannable, _whole_blocks, admitted, implementation_refusal,
    plan_work, preflight, shard_sequence, unshard_sequence,
)
from ._cp_steps import _pack, _pack_into, _Run, _RingBackward, _RingForward, _unpack  # noqa: F401


__all__ = [
    "cp_attention",
    "COMM_TYPES",
    "ContextParallelDeclined",
    "ShardMismatch",
    "CPSpec",
    "Block",
    "StepWork",
    "shard_sequence",
    "unshard_sequence",
    "cp_rank",
    "cp_size",
    "preflight",
    "implementation_refusal",
    "plan_work",
    "simulate_ring",
]


# ---------------------------------------------------------------------------------------------
# The entry point.


def cp_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    cp_group,
    cp_comm_type: str = "p2p",
    layout: str = "bhsd",
    is_causal: bool = False,
    diagonal: str = "top_left",
    window: Optional[Union[int, Tuple[Optional[int], Optional[int]]]] = None,
    scale: Optional[float] = None,
    dropout_p: float = 0.0,
    policy: Optional[Policy] = None,
    on_decline: str = "raise",
    no_substitute: bool = False,
    return_decision: bool = False,
):
    """Attention of this rank's query shard against the keys of every rank of ``cp_group``
    (context parallelism). ``q``, ``k``, ``v`` are this rank's shards (:func:`shard_sequence`:
    chunks ``r`` and ``2 * cp_size - 1 - r`` of the sequence); the result is this rank's shard
    of O. The other arguments are :func:`attn_policy.torch.attention`'s, for the whole sequence
    (the mask, window and diagonal refer to global positions; ``scale`` defaults to
    ``1/sqrt(d)``); ``policy`` chooses the executor of every per-step call.

    ``cp_comm_type``: ``"p2p"`` (ring), ``"all_gather"``, ``"a2a"`` (heads divisible by the group
    size) or ``"a2a+p2p"`` with ``cp_group=(a2a_group, p2p_group)``; otherwise ``cp_group`` is one
    process group (None: the default one). Differentiable (autograd).

    Raises :class:`ContextParallelDeclined` (the ``native`` pack's pre-flight declined, or a
    per-step call has no executor, on any rank) and :class:`ShardMismatch` (the ranks' shards or
    options differ), on every rank, before any K/V is exchanged. ``on_decline="fallback"`` is
    not available (a fallback has no log-sum-exp to merge) and is refused like a decline.
    ``return_decision``: also return this rank's :class:`attn_policy.Explanation` (kind
    ``context_parallel``)."""
    local_msg = ""
    verdict = _OK
    li = 0
    a2a_group = ring_group = None
    ring_rank = a2a_rank = 0
    decision = _CPRecord(cp_comm_type)
    # Without a valid comm type and group there is no one to tell: this rank alone raises.
    if cp_comm_type not in COMM_TYPES:
        raise PolicyError(f"cp_comm_type must be one of {', '.join(COMM_TYPES)}, found {cp_comm_type!r}")
    a2a_group, ring_group = _groups(cp_group, cp_comm_type)
    groups = [g for g in (a2a_group, ring_group) if g is not None]
    if cp_comm_type == "a2a+p2p":
        groups = [a2a_group, ring_group, a2a_group]
    a2a_size = dist.get_world_size(a2a_group) if a2a_group is not None else 1
    a2a_rank = dist.get_rank(a2a_group) if a2a_group is not None else 0
    ring_size = dist.get_world_size(ring_group) if ring_group is not None else 1
    ring_rank = dist.get_rank(ring_group) if ring_group is not None else 0
    n = a2a_size * ring_size
    rank = ring_rank * a2a_size + a2a_rank
    decision.cp_size, decision.cp_rank = n, rank
    spec: Optional[CPSpec] = None
    run: Optional[_Run] = None
    bufs: Dict[str, torch.Tensor] = {}
    dims = [0] * 7
    drop_v, nosub_v = 0.0, False  # what the descriptor carries when an option is refused
    try:
        # The options as attention() checks them (a string is not read by its truth value).
        is_causal = _flag("is_causal", is_causal)
        nosub_v = _flag("no_substitute", no_substitute)
        return_decision = _flag("return_decision", return_decision)
        drop_v = _real("dropout_p", dropout_p, "a float in [0, 1)")
        if scale is not None:
            scale = _real("scale", scale, "a float > 0 or None (1/sqrt(head dim))")
        if layout not in LAYOUTS:
            raise PolicyError(f"layout must be one of {', '.join(LAYOUTS)}, found {layout!r}")
        li = LAYOUTS.index(layout)
        if diagonal not in DIAGONALS:
            raise PolicyError(f"diagonal must be one of {', '.join(DIAGONALS)}, found {diagonal!r}")
        if on_decline != "raise":
            raise PolicyError(f'on_decline={on_decline!r} is not available under context parallelism '
                              '(a fallback returns no log-sum-exp to merge); use on_decline="raise"')
        # This rank's shards, checked as one call's tensors (the ranks' agreement: below).
        _check_inputs(q, k, v, li)
        (b, hq, sq, dqk), _ = _bhsd(q, li)
        (_, hkv, skv, _), _ = _bhsd(k, li)
        (_, _, _, dv), _ = _bhsd(v, li)
        dims = [b, hq, hkv, sq, skv, dqk, dv]
        br = diagonal == "bottom_right"
        mask = (2 if br else 1) if is_causal else 0
        wl, wr = _window_args(window, is_causal)
        scale_v = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
        training = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        spec = CPSpec(cp_comm_type, n, a2a_size if cp_comm_type in ("a2a", "a2a+p2p") else 1, b, hq, hkv,
                      sq * n, skv * n, dqk, dv, layout, str(q.dtype).replace("torch.", ""), q.device.type,
                      mask, wl, wr, br, scale_v, drop_v, training)
        # 1. The policy decides first: the native pack on the whole call.
        pre = preflight(spec, live_facts(q.device))
        decision.preflight = pre
        if not admitted(pre):
            raise ContextParallelDeclined(f"the native pack declines this context-parallel call: {_decline_text(pre)}")
        # The pack admitted it: the implementation must be able to plan it (a test keeps the
        # pack's context_parallel layer and this planner in step).
        refusal = implementation_refusal(spec)
        if refusal is not None:
            raise PolicyError(f"internal: the native pack admits what cp_attention cannot plan ({refusal}); "
                              "rules/native/context_parallel.yaml and context_parallel.py disagree")
        work = plan_work(spec, rank)
        decision.work = work
        q, k, v = (_usable(t) for t in (q, k, v))
        k, v = k.contiguous(), v.contiguous()  # the layout the received K/V have
        run = _Run(spec, li, scale_v, _policy_id(policy), nosub_v, training,
                   a2a_group, ring_group, ring_rank, work, lse_dtype(q.dtype))
        # 2. Every per-step call, decided by `policy` on tensors of the shapes it will see.
        why = _decide_steps(run, q, k, v, bufs)
        decision.steps = list(run.decisions.values())
        if why:
            raise ContextParallelDeclined(why)
    except ContextParallelDeclined as e:
        verdict, local_msg = _DECLINED, f"rank {rank}: {e}"
    except InvalidInput as e:
        verdict, local_msg = _INPUT, f"rank {rank}: {e}"
    except PolicyError as e:
        verdict, local_msg = _INVALID, f"rank {rank}: {e}"
    except Exception as e:  # noqa: BLE001 - told to every rank, then re-raised as PolicyError
        verdict, local_msg = _INVALID, f"rank {rank}: {type(e).__name__}: {e}"
    desc = [_MAGIC, COMM_TYPES.index(cp_comm_type), ring_size, a2a_size, li,
            _DTYPE_CODES.get(q.dtype, 0) if isinstance(q, torch.Tensor) else 0,
            1 if isinstance(q, torch.Tensor) and q.device.type == "cuda" else 0,
            *dims,
            spec.mask if spec else 0, spec.window_left if spec else 0, spec.window_right if spec else 0,
            int(spec.bottom_right) if spec else 0, _f64_bits(spec.scale) if spec and spec.scale else 0,
            _f64_bits(drop_v), int(spec.training) if spec else 0, int(nosub_v),
            a2a_rank, ring_rank, verdict]
    # 3. Every rank sees every rank's descriptor before any K/V moves.
    try:
        _agree(desc, groups, q if isinstance(q, torch.Tensor) else torch.empty(0), local_msg)
    except ContextParallelDeclined as e:
        decision.declined = str(e)
        e.decision = decision.explanation()
        raise
    assert run is not None and spec is not None
    o = _CP.apply(q, k, v, run, bufs)
    if return_decision:
        return o, decision.explanation()
    return o


def _kv_views(k: torch.Tensor, v: torch.Tensor, bufs: Dict[str, torch.Tensor]) -> List[torch.Tensor]:
    """K and V as the ring holds them (views of one packed buffer, ``bufs["kv"]``, which the
    ring's first step then fills): the per-step calls are decided on these."""
    bufs["kv"] = buf = torch.empty(k.numel() + v.numel(), dtype=k.dtype, device=k.device)
    return _unpack(buf, (k.shape, v.shape))


def _decide_steps(run: _Run, q, k, v, bufs: Dict[str, torch.Tensor]) -> str:
    """Decides every distinct per-step call on tensors of its shapes and strides (allocating
    the buffers the call will fill, no communication); the first reason one cannot run."""
    spec, li, sd = run.spec, run.li, run.sd
    ring, a2a = spec.ring
    if spec.comm == "all_gather":
        bufs["k_full"] = kq = _full_like(k, sd, spec.cp_size)
        bufs["v_full"] = vq = _full_like(v, sd, spec.cp_size)
        targets = [(q, kq, vq, blk) for s in run.work for blk in s.blocks]
    elif spec.comm == "p2p":
        kk, vv = _kv_views(k, v, bufs)
        targets = [(q, kk, vv, blk) for s in run.work for blk in s.blocks]
    else:
        for name, t in (("qh", q), ("kh", k), ("vh", v)):
            shape = list(t.shape)
            shape[sd] *= a2a
            shape[_HEAD_DIM[spec.layout]] = _split_heads(shape[_HEAD_DIM[spec.layout]], a2a, "heads")
            bufs[name] = torch.empty(shape, dtype=t.dtype, device=t.device)
        qh, kh, vh = bufs["qh"], bufs["kh"], bufs["vh"]
        if spec.comm == "a2a":
            targets = [(qh, kh, vh, None)]
        else:
            kk, vv = _kv_views(kh, vh, bufs)
            targets = [(qh, kk, vv, blk) for s in run.work for blk in s.blocks]
    seen = set()
    for qq, kk, vv, blk in targets:
        key = (blk.q1 - blk.q0, blk.k1 - blk.k0, blk.op_mask(), blk.q0, blk.k0) if blk else None
        if key in seen:
            continue
        seen.add(key)
        why = run.decide(qq, kk, vv, blk)
        if why:
            return why
    return ""


# ---------------------------------------------------------------------------------------------
# The ring in one process (no communication): every rank's steps on sharded tensors.


def simulate_ring(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cp_size: int,
    *,
    layout: str = "bhsd",
    is_causal: bool = False,
    diagonal: str = "top_left",
    window=None,
    scale: Optional[float] = None,
    policy: Optional[Policy] = None,
    grad_out: Optional[torch.Tensor] = None,
) -> Dict[str, Any]:
    """Runs the p2p ring of ``cp_size`` ranks in this process on full-sequence tensors: shards
    them, runs every rank's steps with the same blocks, op calls and merge as
    :func:`cp_attention`, and reassembles O (and dQ, dK, dV for ``grad_out``, accumulating dK/dV
    in ring order). Returns ``{"o", "dq", "dk", "dv", "work": [per rank: [StepWork]],
    "executors": [the executors the per-step calls ran, sorted]}``."""
    li = LAYOUTS.index(layout)
    sd = _seq_dim(layout)
    (b, hq, sq, dqk), _ = _bhsd(q, li)
    (_, hkv, skv, _), _ = _bhsd(k, li)
    dv = v.shape[-1]
    br = diagonal == "bottom_right"
    mask = (2 if br else 1) if is_causal else 0
    wl, wr = _window_args(window, is_causal)
    scale_v = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    training = grad_out is not None
    spec = CPSpec("p2p", cp_size, 1, b, hq, hkv, sq, skv, dqk, dv, layout, str(q.dtype).replace("torch.", ""),
                  q.device.type, mask, wl, wr, br, scale_v, 0.0, training)
    qs = [shard_sequence(q, cp_size, r, layout) for r in range(cp_size)]
    ks = [shard_sequence(k, cp_size, r, layout).contiguous() for r in range(cp_size)]
    vs = [shard_sequence(v, cp_size, r, layout).contiguous() for r in range(cp_size)]
    pid = _policy_id(policy)
    runs = [_Run(spec, li, scale_v, pid, False, training, None, None, r, plan_work(spec, r), lse_dtype(q.dtype))
            for r in range(cp_size)]
    fw = [_RingForward(runs[r], qs[r], dv, runs[r].work) for r in range(cp_size)]
    for i in range(cp_size):
        for r in range(cp_size):
            src = (r - i) % cp_size
            fw[r].step(i, ks[src], vs[src])
    outs = [f.finish() for f in fw]
    res: Dict[str, Any] = {"o": unshard_sequence([o for o, _ in outs], layout), "work": [rn.work for rn in runs]}
    for r in range(cp_size):
        # Records every distinct step call's decision (the ring above ran the same calls).
        _decide_steps(runs[r], qs[r], ks[r], vs[r], {})
    res["executors"] = sorted({str(d.executor) for rn in runs for d in rn.decisions.values()})
    if grad_out is None:
        return res
    dos = [shard_sequence(grad_out, cp_size, r, layout).contiguous() for r in range(cp_size)]
    bw = [_RingBackward(runs[r], qs[r], dos[r], outs[r][0], outs[r][1], runs[r].work) for r in range(cp_size)]
    acc: List[Optional[torch.Tensor]] = [None] * cp_size
    for i in range(cp_size):
        for r in range(cp_size):
            src = (r - i) % cp_size
            c = bw[r].step(i, ks[src], vs[src])
            acc[src] = c if acc[src] is None else acc[src].add_(c)  # ring order, as the ring sums
    dks, dvs = [], []
    for s in range(cp_size):
        dk_s, dv_s = _unpack(acc[s], (ks[s].shape, vs[s].shape))  # type: ignore[arg-type]
        dks.append(dk_s.to(k.dtype))
        dvs.append(dv_s.to(v.dtype))
    res["dq"] = unshard_sequence([bw[r].dq.to(q.dtype) for r in range(cp_size)], layout)
    res["dk"] = unshard_sequence(dks, layout)
    res["dv"] = unshard_sequence(dvs, layout)
    return res


def __getattr__(name: str) -> Any:
    # CPDecision, deprecated: attn_policy.Explanation (kind "context_parallel").
    return deprecated_alias(__name__, name, ("CPDecision",))
