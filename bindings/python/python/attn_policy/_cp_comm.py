"""Context parallelism, the communication: the process groups of each algorithm, the descriptor
every rank shares before any K/V moves (mismatched shards or a decline on any rank raise on every
rank), the ring's exchanges (on a second CUDA stream), the all-gather / all-to-all of K/V and
their gradients, Ulysses' sequence <-> heads all-to-all, and the autograd function of a
context-parallel call."""

from __future__ import annotations

import struct
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import PolicyError
from ._cp_plan import (_DTYPE_CODES, _HEAD_DIM, _SEQ_DIM, COMM_TYPES, LAYOUTS, ContextParallelDeclined,
                       ShardMismatch)
from ._cp_steps import _pack, _pack_into, _Run, _RingBackward, _RingForward, _unpack
from ._decision import InvalidInput
from ._tensors import _to_bhsd


# ---------------------------------------------------------------------------------------------
# Process groups.


def _groups(cp_group, comm: str):
    """(a2a group or None, ring/collective group or None) for ``comm``."""
    if comm == "a2a+p2p":
        if not (isinstance(cp_group, (tuple, list)) and len(cp_group) == 2):
            raise PolicyError('cp_comm_type="a2a+p2p" takes cp_group=(a2a_group, p2p_group)')
        return cp_group[0], cp_group[1]
    if isinstance(cp_group, (tuple, list)):
        raise PolicyError(f'cp_comm_type="{comm}" takes one process group; a pair is for "a2a+p2p"')
    if cp_group is None:  # torch.distributed's convention: the default group
        cp_group = dist.group.WORLD
    return (cp_group, None) if comm == "a2a" else (None, cp_group)


def cp_size(cp_group, cp_comm_type: str = "p2p") -> int:
    """The number of sequence shards: the group's size, or ``a2a size * p2p size``."""
    a, g = _groups(cp_group, cp_comm_type)
    return (dist.get_world_size(a) if a is not None else 1) * (dist.get_world_size(g) if g is not None else 1)


def cp_rank(cp_group, cp_comm_type: str = "p2p") -> int:
    """This process's shard index: its rank in the group, or ``p2p_rank * a2a_size + a2a_rank``
    for a2a+p2p (what :func:`shard_sequence` takes)."""
    a, g = _groups(cp_group, cp_comm_type)
    ar = dist.get_rank(a) if a is not None else 0
    asz = dist.get_world_size(a) if a is not None else 1
    gr = dist.get_rank(g) if g is not None else 0
    return gr * asz + ar


# ---------------------------------------------------------------------------------------------
# The descriptor every rank shares before any K/V moves.

_MAGIC = 0xC9A7
_FIELDS = ("magic", "comm", "group_size", "a2a_size", "layout", "dtype", "device", "batch", "heads_q",
           "heads_kv", "seqlen_q_local", "seqlen_kv_local", "head_dim_qk", "head_dim_v", "mask",
           "window_left", "window_right", "bottom_right", "scale", "dropout_p", "training",
           "no_substitute", "a2a_rank", "p2p_rank", "verdict")
# Fields allowed to differ between ranks.
_PER_RANK = {"a2a_rank", "p2p_rank", "verdict"}
# Verdicts, by precedence (the largest seen on any rank decides the error every rank raises).
# _INPUT: a rank's own tensors do not describe one call (attn_policy.torch.InvalidInput); it
# comes first, as the descriptor of such a rank cannot be compared with the others'.
_OK, _DECLINED, _INVALID, _MISMATCH, _INPUT = 0, 1, 2, 3, 4


def _f64_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _coll_device(group, t: torch.Tensor) -> torch.device:
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and "gloo" not in backend:
        return torch.device("cuda", torch.cuda.current_device())
    if "gloo" in backend and "nccl" not in backend:
        return torch.device("cpu")
    return t.device


def _exchange(desc: List[int], group, like: torch.Tensor) -> List[List[int]]:
    dev = _coll_device(group, like)
    mine = torch.tensor(desc, dtype=torch.int64, device=dev)
    n = dist.get_world_size(group)
    out = torch.empty(n * len(desc), dtype=torch.int64, device=dev)
    dist.all_gather_into_tensor(out, mine, group=group)
    return out.view(n, len(desc)).cpu().tolist()


def _gather_messages(msg: str, groups: Sequence) -> List[str]:
    """Every rank's message, through each group in turn (a2a+p2p: rows, columns, rows)."""
    seen = [msg] if msg else []
    for g in groups:
        parts: List[Any] = [None] * dist.get_world_size(g)
        dist.all_gather_object(parts, seen, group=g)
        merged: List[str] = []
        for p in parts:
            for m in p or []:
                if m not in merged:
                    merged.append(m)
        seen = merged
    return seen


def _agree(desc: List[int], groups: Sequence, like: torch.Tensor, local_msg: str) -> None:
    """All-gathers the descriptor in each group (a2a+p2p: a2a, p2p, a2a again, so that what any
    rank of the grid saw reaches every rank) and raises the same error class on every rank when
    the shards differ or any rank refused."""
    vi = _FIELDS.index("verdict")
    worst = desc[vi]
    mismatch: List[str] = []
    for gi, g in enumerate(groups):
        d = list(desc)
        d[vi] = worst
        rows = _exchange(d, g, like)
        for f, name in enumerate(_FIELDS):
            if name in _PER_RANK:
                continue
            vals = [row[f] for row in rows]
            if len(set(vals)) > 1:
                mismatch.append(f"{name} differs across the ranks of a group ({_show(name, vals)})")
        if len(groups) == 3:
            # a2a+p2p: a2a peers share the p2p rank, p2p peers share the a2a rank.
            same = "p2p_rank" if gi != 1 else "a2a_rank"
            vals = [row[_FIELDS.index(same)] for row in rows]
            if len(set(vals)) > 1:
                mismatch.append(f"the a2a and p2p groups do not form a grid ({same} {vals} within one group)")
        worst = max([worst, _MISMATCH if mismatch else _OK] + [row[vi] for row in rows])
    if worst == _OK:
        return
    msgs = _gather_messages(local_msg or "; ".join(dict.fromkeys(mismatch)), groups)
    text = "; ".join(msgs) if msgs else "another rank refused the call"
    if worst == _INPUT:
        raise InvalidInput(f"context-parallel call refused on every rank (a rank's tensors): {text}")
    if worst == _MISMATCH:
        raise ShardMismatch(f"context-parallel shards differ between ranks (refused on every rank): {text}")
    if worst == _INVALID:
        raise PolicyError(f"context-parallel call refused on every rank: {text}")
    raise ContextParallelDeclined(f"context-parallel call declined (on every rank): {text}")


def _show(name: str, vals: List[int]) -> str:
    if name == "dtype":
        inv = {v: str(k).replace("torch.", "") for k, v in _DTYPE_CODES.items()}
        vals = [inv.get(v, v) for v in vals]  # type: ignore[misc]
    elif name == "comm":
        vals = [COMM_TYPES[v] if 0 <= v < len(COMM_TYPES) else v for v in vals]  # type: ignore[misc]
    elif name == "layout":
        vals = [LAYOUTS[v] if 0 <= v < len(LAYOUTS) else v for v in vals]  # type: ignore[misc]
    return "per rank: " + ", ".join(str(v) for v in vals)


# ---------------------------------------------------------------------------------------------
# Communication.


class _Peers:
    def __init__(self, group, n: int, r: int):
        self.group = group
        self.next = dist.get_global_rank(group, (r + 1) % n)
        self.prev = dist.get_global_rank(group, (r - 1) % n)


_streams: Dict[int, Any] = {}


def _comm_stream(t: torch.Tensor):
    """The second stream the ring's exchanges are issued on (one per device), None on CPU."""
    if t.device.type != "cuda":
        return None
    idx = t.device.index if t.device.index is not None else torch.cuda.current_device()
    if idx not in _streams:
        _streams[idx] = torch.cuda.Stream(device=idx)
    return _streams[idx]


def _p2p(sends: Sequence[torch.Tensor], recvs: Sequence[torch.Tensor], peers: _Peers, stream):
    """Sends to the next rank and receives from the previous one, in this order on every rank
    (so the n-th send matches the n-th receive). On CUDA the exchange is issued on ``stream``,
    after the work already queued on the current stream."""
    ops = [dist.P2POp(dist.isend, t, peers.next, peers.group) for t in sends]
    ops += [dist.P2POp(dist.irecv, t, peers.prev, peers.group) for t in recvs]
    if stream is None:
        return dist.batch_isend_irecv(ops)
    stream.wait_stream(torch.cuda.current_stream(stream.device))
    with torch.cuda.stream(stream):
        return dist.batch_isend_irecv(ops)


def _wait(reqs, stream) -> None:
    for r in reqs:
        r.wait()
    if stream is not None:
        torch.cuda.current_stream(stream.device).wait_stream(stream)


def _ring_forward(run: _Run, q, k, v, peers: _Peers, n: int, kv: torch.Tensor):
    """``kv``: the packed K/V buffer the per-step calls were decided on; filled here."""
    kshape, vshape = k.shape, v.shape
    cur = _pack_into(kv, [k, v])
    stream = _comm_stream(q)
    st = _RingForward(run, q, v.shape[-1], run.work)
    for i in range(n):
        reqs = nxt = None
        if i < n - 1:
            nxt = torch.empty_like(cur)
            reqs = _p2p([cur], [nxt], peers, stream)
        kk, vv = _unpack(cur, (kshape, vshape))
        st.step(i, kk, vv)
        if reqs is not None:
            _wait(reqs, stream)
            cur = nxt
    return st.finish()


def _ring_backward(run: _Run, q, k, v, o, lse, do, peers: _Peers, n: int):
    kshape, vshape = k.shape, v.shape
    cur = _pack([k, v])  # the ring's K/V layout, as in the forward
    stream = _comm_stream(q)
    st = _RingBackward(run, q, do, o, lse, run.work)
    out: Optional[torch.Tensor] = None  # the dK/dV accumulator finished at the previous step
    for i in range(n):
        sends: List[torch.Tensor] = []
        recvs: List[torch.Tensor] = []
        acc_in = nxt = None
        if out is not None:
            # The accumulator of the K/V this rank used goes on to the next rank, which holds
            # that K/V now; this rank receives the accumulator of the K/V it holds.
            acc_in = torch.empty_like(out)
            sends.append(out)
            recvs.append(acc_in)
        if i < n - 1:
            nxt = torch.empty_like(cur)
            sends.append(cur)
            recvs.append(nxt)
        reqs = _p2p(sends, recvs, peers, stream) if sends else None
        kk, vv = _unpack(cur, (kshape, vshape))
        mine = st.step(i, kk, vv)
        if reqs is not None:
            _wait(reqs, stream)
        # Deterministic: the K/V of rank s collects ranks s, s+1, ..., s-1, in that order.
        out = mine if acc_in is None else acc_in.add_(mine)
        if nxt is not None:
            cur = nxt
    assert out is not None
    if n > 1:
        own = torch.empty_like(out)
        _wait(_p2p([out], [own], peers, stream), stream)
        out = own
    dk, dv = _unpack(out, (kshape, vshape))
    return st.dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _natural(parts: Sequence[torch.Tensor], sd: int, out: torch.Tensor) -> torch.Tensor:
    """Writes the full sequence into ``out`` from every rank's shard (rank order)."""
    n = len(parts)
    c = parts[0].shape[sd] // 2
    for r, t in enumerate(parts):
        out.narrow(sd, r * c, c).copy_(t.narrow(sd, 0, c))
        out.narrow(sd, (2 * n - 1 - r) * c, c).copy_(t.narrow(sd, c, c))
    return out


def _rank_shard(full: torch.Tensor, n: int, r: int, sd: int) -> List[torch.Tensor]:
    c = full.shape[sd] // (2 * n)
    return [full.narrow(sd, r * c, c), full.narrow(sd, (2 * n - 1 - r) * c, c)]


def _full_like(t: torch.Tensor, sd: int, n: int) -> torch.Tensor:
    shape = list(t.shape)
    shape[sd] *= n
    return torch.empty(shape, dtype=t.dtype, device=t.device)


def _gather_kv(k, v, group, n: int, sd: int, kf, vf) -> None:
    local = _pack([k, v])
    out = torch.empty(n * local.numel(), dtype=local.dtype, device=local.device)
    dist.all_gather_into_tensor(out, local, group=group)
    parts = [_unpack(p, (k.shape, v.shape)) for p in out.view(n, -1)]
    _natural([p[0] for p in parts], sd, kf)
    _natural([p[1] for p in parts], sd, vf)


def _return_dkv(dkf, dvf, kshape, vshape, group, n: int, sd: int):
    """dK/dV over the whole sequence from this rank -> each owner's shard, summed over the
    ranks in rank order (an all-to-all, then a deterministic local sum)."""
    send = torch.stack([_pack(_rank_shard(dkf, n, j, sd) + _rank_shard(dvf, n, j, sd)) for j in range(n)])
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    total = recv[0].clone()
    for j in range(1, n):
        total.add_(recv[j])
    # Each row holds [dK chunk r, dK chunk 2n-1-r, dV chunk r, dV chunk 2n-1-r] of this rank r.
    hk, hv = _half(kshape, sd), _half(vshape, sd)
    k0, k1, v0, v1 = _unpack(total, (hk, hk, hv, hv))
    return torch.cat([k0, k1], dim=sd), torch.cat([v0, v1], dim=sd)


def _half(shape, sd: int) -> Tuple[int, ...]:
    s = list(shape)
    s[sd] //= 2
    return tuple(s)


def _a2a_many(bufs: Sequence[torch.Tensor], group) -> List[torch.Tensor]:
    """One all_to_all_single for several ``[A, n_i]`` buffers (row j goes to rank j)."""
    send = torch.cat(list(bufs), dim=1) if len(bufs) > 1 else bufs[0].contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    out, at = [], 0
    for b in bufs:
        out.append(recv[:, at:at + b.shape[1]])
        at += b.shape[1]
    return out


def _seq_to_heads(ts: Sequence[torch.Tensor], group, a2a: int, li: int,
                  outs: Optional[Sequence[torch.Tensor]] = None) -> List[torch.Tensor]:
    """a2a: each tensor from (local shard, all heads) to (the a2a group's shards, heads /
    a2a). The shards arrive as rank a' holding chunks (c', 2n-1-c'); the result holds the first
    halves in a' order then the second halves in reverse order: two contiguous runs of the
    sequence (the whole sequence in order when a2a is the whole CP group)."""
    sends, metas = [], []
    for t in ts:
        x = _to_bhsd(t, li)
        b, h, s, d = x.shape
        hp = h // a2a
        sends.append(x.reshape(b, a2a, hp, s, d).transpose(0, 1).reshape(a2a, -1))
        metas.append((t, b, hp, s, d))
    result = []
    for i, (r, (t, b, hp, s, d)) in enumerate(zip(_a2a_many(sends, group), metas)):
        r = r.reshape(a2a, b, hp, s, d)
        c = s // 2
        shape = list(t.shape)
        shape[_SEQ_DIM[LAYOUTS[li]]] = s * a2a
        shape[_HEAD_DIM[LAYOUTS[li]]] = hp
        out = outs[i] if outs is not None else torch.empty(shape, dtype=t.dtype, device=t.device)
        ob = _to_bhsd(out, li)
        # Copied straight into place: [a2a, b, hp, c, d] -> [b, hp, a2a * c, d] views.
        ob[:, :, : a2a * c].view(b, hp, a2a, c, d).copy_(r[:, :, :, :c].permute(1, 2, 0, 3, 4))
        ob[:, :, a2a * c:].view(b, hp, a2a, c, d).copy_(r[:, :, :, c:].flip(0).permute(1, 2, 0, 3, 4))
        result.append(out)
    return result


def _heads_to_seq(ts: Sequence[torch.Tensor], group, a2a: int, li: int) -> List[torch.Tensor]:
    """The inverse of :func:`_seq_to_heads`."""
    sends, metas = [], []
    for t in ts:
        x = _to_bhsd(t, li)
        b, hp, s2, d = x.shape
        c = s2 // (2 * a2a)
        first = x[:, :, : a2a * c].reshape(b, hp, a2a, c, d)
        second = x[:, :, a2a * c:].reshape(b, hp, a2a, c, d).flip(2)
        piece = torch.cat([first, second], dim=3)  # [b, hp, a2a (dest), 2c, d]
        sends.append(piece.permute(2, 0, 1, 3, 4).reshape(a2a, -1))
        metas.append((t, b, hp, 2 * c, d))
    outs = []
    for r, (t, b, hp, s, d) in zip(_a2a_many(sends, group), metas):
        full = r.reshape(a2a, b, hp, s, d).transpose(0, 1).reshape(b, a2a * hp, s, d)
        shape = list(t.shape)
        shape[_SEQ_DIM[LAYOUTS[li]]] = s
        shape[_HEAD_DIM[LAYOUTS[li]]] = hp * a2a
        out = torch.empty(shape, dtype=t.dtype, device=t.device)
        _to_bhsd(out, li).copy_(full)
        outs.append(out)
    return outs


# ---------------------------------------------------------------------------------------------
# The autograd function.


class _CP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, run: "_Run", bufs: Dict[str, torch.Tensor]):
        spec, li, sd = run.spec, run.li, run.sd
        ring, a2a = spec.ring
        if spec.comm == "all_gather":
            n = spec.cp_size
            kf, vf = bufs["k_full"], bufs["v_full"]
            _gather_kv(k, v, run.ring_group, n, sd, kf, vf)
            st = _RingForward(run, q, v.shape[-1], run.work)
            st.step(0, kf, vf)
            o, lse = st.finish()
            ctx.save_for_backward(q, k, v, o, lse)
        elif spec.comm == "p2p":
            o, lse = _ring_forward(run, q, k, v, _Peers(run.ring_group, ring, run.ring_rank), ring, bufs["kv"])
            ctx.save_for_backward(q, k, v, o, lse)
        else:
            qh, kh, vh = _seq_to_heads((q, k, v), run.a2a_group, a2a, li, outs=(bufs["qh"], bufs["kh"], bufs["vh"]))
            if spec.comm == "a2a":
                oh, lseh = run.fwd(qh, kh, vh, None)
            else:
                oh, lseh = _ring_forward(run, qh, kh, vh, _Peers(run.ring_group, ring, run.ring_rank), ring,
                                         bufs["kv"])
            (o,) = _heads_to_seq((oh,), run.a2a_group, a2a, li)
            ctx.save_for_backward(qh, kh, vh, oh, lseh)
        ctx.run = run
        ctx.kv_shapes = (k.shape, v.shape)
        return o

    @staticmethod
    def backward(ctx, do):
        run: _Run = ctx.run
        spec, li, sd = run.spec, run.li, run.sd
        ring, a2a = spec.ring
        a, b, c, o, lse = ctx.saved_tensors
        do = do.contiguous()
        if spec.comm == "all_gather":
            q, k, v = a, b, c
            n = spec.cp_size
            kf, vf = _full_like(k, sd, n), _full_like(v, sd, n)
            _gather_kv(k, v, run.ring_group, n, sd, kf, vf)
            st = _RingBackward(run, q, do, o, lse, run.work)
            dkv = st.step(0, kf, vf)
            dkf, dvf = _unpack(dkv, (kf.shape, vf.shape))
            dk, dv = _return_dkv(dkf, dvf, k.shape, v.shape, run.ring_group, n, sd)
            return st.dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None
        if spec.comm == "p2p":
            dq, dk, dv = _ring_backward(run, a, b, c, o, lse, do, _Peers(run.ring_group, ring, run.ring_rank), ring)
            return dq, dk, dv, None, None
        qh, kh, vh = a, b, c
        (doh,) = _seq_to_heads((do,), run.a2a_group, a2a, li)
        if spec.comm == "a2a":
            dqh, dkh, dvh = run.bwd(doh, qh, kh, vh, o, lse, None)
        else:
            dqh, dkh, dvh = _ring_backward(run, qh, kh, vh, o, lse, doh, _Peers(run.ring_group, ring, run.ring_rank), ring)
        dq, dk, dv = _heads_to_seq((dqh, dkh, dvh), run.a2a_group, a2a, li)
        return dq, dk, dv, None, None
