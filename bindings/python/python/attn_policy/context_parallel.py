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
"""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from . import Decision, Policy, PolicyError
from . import torch as _apt

__all__ = [
    "cp_attention",
    "COMM_TYPES",
    "ContextParallelDeclined",
    "ShardMismatch",
    "CPSpec",
    "CPDecision",
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

COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")
LAYOUTS = _apt.LAYOUTS
_SEQ_DIM = {"bhsd": 2, "bshd": 1, "sbhd": 0}
_HEAD_DIM = {"bhsd": 1, "bshd": 2, "sbhd": 2}
# Executors whose backward reads the given O and LSE (FlashAttention's formula) instead of
# recomputing the softmax of its own keys: a ring step's backward needs the merged ones.
_STATS_BACKWARD = frozenset({"reference", "cudnn", "chunked", "fused", "torch_flash"})


class ContextParallelDeclined(PolicyError):
    """The call cannot run context-parallel: the ``native`` pack declined it (``.decision``), a
    per-step call has no executor, or another rank declined. Raised on every rank."""

    def __init__(self, message: str, decision: Optional["CPDecision"] = None):
        super().__init__(message)
        self.decision = decision
        self.diagnostics: list = []


class ShardMismatch(PolicyError):
    """The ranks' shards or options differ (lengths, heads, dtype, mask, ...). Raised on every
    rank, naming the fields and ranks."""

    def __init__(self, message: str):
        super().__init__(message)
        self.diagnostics: list = []


# ---------------------------------------------------------------------------------------------
# Sharding.


def shard_sequence(x: torch.Tensor, cp_size: int, rank: int, layout: str = "bhsd") -> torch.Tensor:
    """Rank ``rank``'s shard of a full-sequence tensor: chunks ``rank`` and
    ``2 * cp_size - 1 - rank`` of ``2 * cp_size`` equal chunks along the sequence dim of
    ``layout``, concatenated (a new tensor)."""
    sd = _seq_dim(layout)
    c = _chunk(x.shape[sd], 2 * cp_size, "sequence length")
    if not 0 <= rank < cp_size:
        raise PolicyError(f"rank {rank} outside 0..{cp_size - 1}")
    return torch.cat([x.narrow(sd, rank * c, c), x.narrow(sd, (2 * cp_size - 1 - rank) * c, c)], dim=sd)


def unshard_sequence(shards: Sequence[torch.Tensor], layout: str = "bhsd") -> torch.Tensor:
    """The full-sequence tensor from every rank's shard (in rank order); inverse of
    :func:`shard_sequence`."""
    sd, n = _seq_dim(layout), len(shards)
    c = _chunk(shards[0].shape[sd], 2, "shard length")
    chunks: List[Optional[torch.Tensor]] = [None] * (2 * n)
    for r, t in enumerate(shards):
        chunks[r] = t.narrow(sd, 0, c)
        chunks[2 * n - 1 - r] = t.narrow(sd, c, c)
    return torch.cat(chunks, dim=sd)  # type: ignore[arg-type]


def _seq_dim(layout: str) -> int:
    if layout not in _SEQ_DIM:
        raise PolicyError(f"layout must be one of {', '.join(LAYOUTS)}, found {layout!r}")
    return _SEQ_DIM[layout]


class _Unplannable(PolicyError):
    """What this implementation cannot run (``code`` names the ``native`` rule ``cp.<code>``)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def _chunk(length: int, parts: int, what: str) -> int:
    if parts < 1 or length % parts != 0:
        raise _Unplannable("shards", f"{what} {length} is not divisible by {parts}")
    return length // parts


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
# Masks as bands, blocks, and the plan of each step.


@dataclass(frozen=True)
class _Band:
    """Allowed (query i, key j) pairs of the whole call, in global positions:
    ``-left <= j - i - off <= right`` (None: unbounded)."""

    off: int
    left: Optional[int]
    right: Optional[int]


def _band(mask: int, wl: int, wr: int, br: bool, sq: int, skv: int) -> _Band:
    off = (skv - sq) if br else 0
    left = wl if wl >= 0 else None
    # A causal mask bounds the keys at the diagonal (attention() passes window_right 0 then).
    right = 0 if mask != 0 else (wr if wr >= 0 else None)
    return _Band(off, left, right)


@dataclass(frozen=True)
class Block:
    """One executor call of a step: query rows ``[q0, q1)`` of the rank's local Q against keys
    ``[k0, k1)`` of the K/V the step sees, with the band ``left``/``right`` (None: unbounded)
    around the block's top-left diagonal. Every row of a block has at least one key."""

    q0: int
    q1: int
    k0: int
    k1: int
    left: Optional[int]
    right: Optional[int]

    @property
    def kind(self) -> str:
        """``full`` (no mask), ``causal`` (diagonal, maybe with a left window) or ``band``."""
        if self.left is None and self.right is None:
            return "full"
        return "causal" if self.right == 0 else "band"

    def op_mask(self) -> Tuple[int, int, int]:
        """(mask, window_left, window_right) for the op, top-left diagonal."""
        wl = -1 if self.left is None else self.left
        if self.right == 0:
            return 1, wl, 0
        return 0, wl, -1 if self.right is None else self.right

    def pairs(self) -> int:
        """Admitted (query, key) pairs, per head."""
        m, w = self.q1 - self.q0, self.k1 - self.k0
        hi = m * (w - 1) if self.right is None else _sum_min(m, self.right, w - 1)
        lo = 0 if self.left is None else _sum_max0(m, self.left)
        return hi - lo + m


def _sum_min(m: int, a: int, cap: int) -> int:
    """sum over i in [0, m) of min(cap, i + a)."""
    t = max(0, min(m, cap - a + 1))
    return t * (t - 1) // 2 + a * t + (m - t) * cap


def _sum_max0(m: int, left: int) -> int:
    """sum over i in [0, m) of max(0, i - left)."""
    u = max(0, m - left)
    return u * (u - 1) // 2


def _block(band: _Band, g0: int, m: int, h0: int, w: int, lq0: int, lk0: int) -> Optional[Block]:
    """The block of global query rows ``[g0, g0 + m)`` (local from ``lq0``) against global keys
    ``[h0, h0 + w)`` (local from ``lk0``): only the rows with a key and the keys some row
    admits; None when no pair is admitted."""
    off, L, R = band.off, band.left, band.right
    i0, i1 = g0, g0 + m - 1
    if R is not None:
        i0 = max(i0, h0 - off - R)
    if L is not None:
        i1 = min(i1, h0 + w - 1 - off + L)
    if i0 > i1:
        return None
    lo = h0 if L is None else max(h0, i0 + off - L)
    hi = h0 + w - 1 if R is None else min(h0 + w - 1, i1 + off + R)
    mq, mk = i1 - i0 + 1, hi - lo + 1
    # Key index of row i0's diagonal, relative to lo: the band is [delta - L, delta + R] around
    # the block's top-left diagonal; both ends are >= 0 by the choice of rows and keys.
    delta = i0 + off - lo
    bl = None if L is None else L - delta
    brt = None if R is None else delta + R
    if bl is not None and bl >= mq - 1:
        bl = None
    if brt is not None and brt >= mk - 1:
        brt = None
    return Block(lq0 + i0 - g0, lq0 + i1 - g0 + 1, lk0 + lo - h0, lk0 + hi - h0 + 1, bl, brt)


def _full_pair(b: Block, q0: int, m: int, k0: int, w: int) -> bool:
    return b.kind == "full" and (b.q0, b.q1, b.k0, b.k1) == (q0, q0 + m, k0, k0 + w)


@dataclass(frozen=True)
class StepWork:
    """What one rank computes at one step: the blocks (executor calls), the K/V source rank
    (for a ring step), and how many (query chunk, key chunk) pairs were skipped (no admitted
    pair)."""

    step: int
    kv_from: int
    blocks: Tuple[Block, ...]
    pairs_skipped: int

    def pairs(self) -> int:
        return sum(b.pairs() for b in self.blocks)


def _ring_step(n: int, r: int, i: int, sq: int, skv: int, band: _Band) -> StepWork:
    """Step ``i`` of rank ``r`` in a ring of ``n``: local Q holds chunks (r, 2n-1-r) of
    ``2n``, the K/V received hold chunks (src, 2n-1-src) with ``src = (r - i) mod n``."""
    cq, ck = _chunk(sq, 2 * n, "max_seqlen_q"), _chunk(skv, 2 * n, "max_seqlen_kv")
    src = (r - i) % n
    if src == r and sq == skv and band == _Band(0, None, 0):
        # Own chunks under a plain causal mask: the local concatenation keeps the order of the
        # chunks, so one causal call over both is exact (the upper-right pair is masked out).
        pairs = [_block(band, c * cq, cq, d * ck, ck, a * cq, b * ck)
                 for a, c in enumerate((r, 2 * n - 1 - r)) for b, d in enumerate((r, 2 * n - 1 - r))]
        return StepWork(i, src, (Block(0, 2 * cq, 0, 2 * ck, None, 0),), sum(p is None for p in pairs))
    qc, kc = (r, 2 * n - 1 - r), (src, 2 * n - 1 - src)
    live: Dict[Tuple[int, int], Block] = {}
    skipped = 0
    for a in (0, 1):
        for b in (0, 1):
            blk = _block(band, qc[a] * cq, cq, kc[b] * ck, ck, a * cq, b * ck)
            if blk is None:
                skipped += 1
            else:
                live[(a, b)] = blk
    if live and all(_full_pair(blk, a * cq, cq, b * ck, ck) for (a, b), blk in live.items()):
        qa = sorted({a for a, _ in live})
        kb = sorted({b for _, b in live})
        if len(live) == len(qa) * len(kb):
            # A rectangle of full pairs, contiguous locally: one unmasked call.
            return StepWork(i, src, (Block(qa[0] * cq, (qa[-1] + 1) * cq, kb[0] * ck, (kb[-1] + 1) * ck, None, None),), skipped)
    return StepWork(i, src, tuple(live.values()), skipped)


def _gather_step(n: int, r: int, sq: int, skv: int, band: _Band) -> StepWork:
    """all_gather: each local query chunk against the whole gathered K/V (natural order)."""
    cq = _chunk(sq, 2 * n, "max_seqlen_q")
    _chunk(skv, 2 * n, "max_seqlen_kv")
    blocks = [_block(band, c * cq, cq, 0, skv, a * cq, 0) for a, c in enumerate((r, 2 * n - 1 - r))]
    live = [b for b in blocks if b is not None]
    if len(live) == 2 and all(_full_pair(b, a * cq, cq, 0, skv) for a, b in enumerate(live)):
        live = [Block(0, 2 * cq, 0, skv, None, None)]
    return StepWork(0, -1, tuple(live), sum(b is None for b in blocks))


# ---------------------------------------------------------------------------------------------
# The call's description, the pre-flight and the implementation's own limits.

_FACT_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp32"}
_DTYPE_CODES = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3, torch.float64: 4}


@dataclass(frozen=True)
class CPSpec:
    """A context-parallel call, whole-sequence view: what the pre-flight and the planner read.
    ``seqlen_q``/``seqlen_kv`` are global (local length x ``cp_size``); ``a2a_size`` is the a2a
    group size for a2a+p2p (``cp_size`` for a2a, 1 otherwise)."""

    comm: str
    cp_size: int
    a2a_size: int
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_kv: int
    head_dim_qk: int
    head_dim_v: int
    layout: str = "bshd"
    dtype: str = "bfloat16"
    device: str = "cpu"
    mask: int = 0
    window_left: int = -1
    window_right: int = -1
    bottom_right: bool = False
    scale: Optional[float] = None
    dropout_p: float = 0.0
    training: bool = True

    @property
    def ring(self) -> Tuple[int, int]:
        """(ring size, a2a size) of the algorithm."""
        if self.comm == "a2a+p2p":
            return self.cp_size // max(self.a2a_size, 1), self.a2a_size
        if self.comm == "a2a":
            return 1, self.cp_size
        return self.cp_size, 1

    def config(self) -> Dict[str, Any]:
        """The call's facts by TransformerEngine's names, for the ``native`` pack."""
        window = _apt.te_window_fact(self.mask, self.window_left, self.window_right, self.seqlen_q, self.seqlen_kv)
        return {
            "qkv_type": "Tensor",
            "qkv_dtype": _FACT_DTYPES[self.dtype],
            "qkv_layout": _apt._LAYOUT_TE[self.layout],
            "batch_size": self.batch,
            "num_heads": self.heads_q,
            "num_gqa_groups": self.heads_kv,
            "max_seqlen_q": self.seqlen_q,
            "max_seqlen_kv": self.seqlen_kv,
            "head_dim_qk": self.head_dim_qk,
            "head_dim_v": self.head_dim_v,
            "attn_mask_type": ("no_mask", "causal", "causal_bottom_right")[self.mask],
            "window_size": window,
            "bottom_right_diagonal": bool(self.bottom_right),
            "attention_dropout": float(self.dropout_p),
            "is_training": bool(self.training),
            "softmax_scale": float(self.scale if self.scale is not None else 1.0 / math.sqrt(self.head_dim_qk)),
            "fp8": False,
            "core_attention_bias_type": "no_bias",
            # The CP path is active whatever the group size: even cp_size 1 shards in 2 chunks.
            "context_parallel": True,
            "cp_comm_type": self.comm,
            "cp_size": self.cp_size,
            "cp_size_a2a": self.a2a_size if self.comm == "a2a+p2p" else 1,
            "probe": {"cuda_device": self.device == "cuda", "fused_attn_graph": None, "frost_plan": None},
        }


_native_policy: Optional[Policy] = None


def _native() -> Policy:
    global _native_policy
    if _native_policy is None:
        _native_policy = Policy.load("native")
    return _native_policy


def preflight(spec: CPSpec, env: Optional[Dict[str, Tuple[Any, str]]] = None) -> Decision:
    """The ``native`` pack's decision on the whole call (``env``: live facts, default those of
    ``spec.device``). Admitted when a backend is selected or awaits a probe."""
    env = env if env is not None else _apt.live_facts(spec.device)
    return Decision(_native()._p.te_select(spec.config(), env, None))


def admitted(d: Decision) -> bool:
    """Whether a pre-flight decision lets the call run."""
    return d.selected is not None or any(b.status == "undecided" for b in d.backends)


def _decline_text(d: Decision) -> str:
    seen: Dict[str, str] = {}
    for b in d.backends:
        for r in b.declined_by:
            seen.setdefault(r.id, r.reason)
    return "; ".join(f"{k}: {v}" for k, v in seen.items())


@functools.lru_cache(maxsize=1024)
def implementation_refusal(spec: CPSpec) -> Optional[_Unplannable]:
    """What this implementation cannot run, found by planning every rank and step exactly as
    the drivers do (None: it can). The ``native`` pack's ``context_parallel`` layer states the
    same limits as rules; the tests compare the two. Cached per spec (a pure function)."""
    try:
        _plan_all(spec)
    except _Unplannable as e:
        return e.with_traceback(None)  # cached: keep no frames alive
    return None


def _split_heads(heads: int, parts: int, what: str) -> int:
    if parts < 1 or heads % parts != 0:
        raise _Unplannable("a2a-heads", f"{what} {heads} is not divisible by the a2a size {parts}")
    return heads // parts


def _plan_all(spec: CPSpec) -> List[List[StepWork]]:
    """Every rank's steps (CP rank order)."""
    if spec.comm not in COMM_TYPES:
        raise PolicyError(f"cp_comm_type must be one of {', '.join(COMM_TYPES)}, found {spec.comm!r}")
    n = spec.cp_size
    _chunk(spec.seqlen_q, 2 * n, "max_seqlen_q")
    _chunk(spec.seqlen_kv, 2 * n, "max_seqlen_kv")
    if spec.comm == "a2a+p2p" and (spec.a2a_size < 1 or n % spec.a2a_size != 0):
        raise _Unplannable("a2a-grid", f"cp_size {n} is not a multiple of the a2a size {spec.a2a_size}")
    ring, a2a = spec.ring
    if spec.comm in ("a2a", "a2a+p2p"):
        _split_heads(spec.heads_q, a2a, "num_heads")
        _split_heads(spec.heads_kv, a2a, "num_gqa_groups")
    return [plan_work(spec, c) for c in range(n)]


def plan_work(spec: CPSpec, rank: int) -> List[StepWork]:
    """The steps of CP rank ``rank`` (for a2a+p2p, ``p2p_rank * a2a_size + a2a_rank``)."""
    return list(_plan_work(spec, rank))


@functools.lru_cache(maxsize=4096)
def _plan_work(spec: CPSpec, rank: int) -> Tuple[StepWork, ...]:
    ring, a2a = spec.ring
    band = _band(spec.mask, spec.window_left, spec.window_right, spec.bottom_right, spec.seqlen_q, spec.seqlen_kv)
    if spec.comm == "a2a":
        # One ordinary call on the whole sequence with the call's own mask; the block only
        # reports its work (the admitted pairs).
        return (StepWork(0, -1, _whole_blocks(band, spec), 0),)
    if spec.comm == "all_gather":
        return (_gather_step(spec.cp_size, rank, spec.seqlen_q, spec.seqlen_kv, band),)
    r = rank // a2a
    return tuple(_ring_step(ring, r, i, spec.seqlen_q, spec.seqlen_kv, band) for i in range(ring))


def _whole_blocks(band: _Band, spec: CPSpec) -> Tuple[Block, ...]:
    b = _block(band, 0, spec.seqlen_q, 0, spec.seqlen_kv, 0, 0)
    return () if b is None else (b,)


# ---------------------------------------------------------------------------------------------
# What cp_attention returns with return_decision=True.


@dataclass
class CPDecision:
    """The decisions of one context-parallel call on this rank: the ``native`` pack's pre-flight
    on the whole call, and ``policy``'s decision for each distinct per-step call."""

    comm_type: str
    cp_size: int
    cp_rank: int
    preflight: Optional[Decision]
    steps: List["_apt.CallDecision"] = field(default_factory=list)
    work: List[StepWork] = field(default_factory=list)
    declined: str = ""

    def summary(self) -> str:
        calls = sum(len(s.blocks) for s in self.work)
        skipped = sum(s.pairs_skipped for s in self.work)
        ex = sorted({d.executor or "none" for d in self.steps})
        head = f"context parallel {self.comm_type}, cp_size {self.cp_size}, rank {self.cp_rank}"
        if self.declined:
            return f"{head}: declined: {self.declined}"
        return (f"{head}: native pre-flight admitted ({self.preflight.selected if self.preflight else '-'}); "
                f"{len(self.work)} step(s), {calls} call(s), {skipped} chunk pair(s) skipped; executors {', '.join(ex)}")

    def __str__(self) -> str:
        return self.summary()


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
        raise _apt.InvalidInput(f"context-parallel call refused on every rank (a rank's tensors): {text}")
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
# Running: one call's configuration and the per-block op calls.


class _Run:
    """One call's parameters, shared by its forward and backward."""

    def __init__(self, spec: CPSpec, li: int, scale: float, pid: int, no_sub: bool, training: bool,
                 a2a_group, ring_group, ring_rank: int, work: List[StepWork], lse_dtype: torch.dtype):
        self.spec, self.li, self.scale, self.pid, self.no_sub = spec, li, scale, pid, no_sub
        self.training = training
        self.a2a_group, self.ring_group, self.ring_rank = a2a_group, ring_group, ring_rank
        self.work = work
        self.sd = _SEQ_DIM[spec.layout]
        self.acc = lse_dtype  # merge precision = the op's LSE dtype (fp64 for fp64, else fp32)
        self.user_mask = (spec.mask, spec.window_left, spec.window_right, spec.bottom_right)
        self.decisions: Dict[tuple, "_apt.CallDecision"] = {}

    # -- the op, per block ----------------------------------------------------------------

    def _args(self, mask: int, wl: int, wr: int, br: bool) -> tuple:
        return (self.li, mask, wl, wr, br, self.scale, 0.0, self.training, self.pid, 0, self.no_sub)

    def block_args(self, blk: Optional[Block]) -> tuple:
        if blk is None:  # the user's own mask on the whole sequence (a2a)
            return self._args(*self.user_mask)
        mask, wl, wr = blk.op_mask()
        return self._args(mask, wl, wr, False)

    def narrow(self, t: torch.Tensor, a: int, b: int) -> torch.Tensor:
        return t.narrow(self.sd, a, b - a)

    def fwd(self, q, k, v, blk: Optional[Block]):
        if blk is not None:
            q, k, v = self.narrow(q, blk.q0, blk.q1), self.narrow(k, blk.k0, blk.k1), self.narrow(v, blk.k0, blk.k1)
        return torch.ops.attn_policy.attention(q, k, v, *self.block_args(blk))

    def bwd(self, do, q, k, v, o, lse, blk: Optional[Block]):
        if blk is not None:
            q, k, v = self.narrow(q, blk.q0, blk.q1), self.narrow(k, blk.k0, blk.k1), self.narrow(v, blk.k0, blk.k1)
            # The op's O and dO are contiguous in the layout; LSE is [b, h, s] contiguous.
            o = self.narrow(o, blk.q0, blk.q1).contiguous()
            do = self.narrow(do, blk.q0, blk.q1).contiguous()
            lse = lse.narrow(2, blk.q0, blk.q1 - blk.q0).contiguous()
        return torch.ops.attn_policy.attention_backward(do, q, k, v, o, lse, *self.block_args(blk))

    def decide(self, q, k, v, blk: Optional[Block]) -> Optional[str]:
        """Decides the block's call with ``policy`` (cached by the op); the reason it cannot
        run under CP, or None."""
        if blk is not None:
            q, k, v = self.narrow(q, blk.q0, blk.q1), self.narrow(k, blk.k0, blk.k1), self.narrow(v, blk.k0, blk.k1)
        args = self.block_args(blk)
        e = _apt._entry(q, k, v, args)
        d = e.decision
        self.decisions[_apt._key(q, k, v, args)] = d
        if e.runner is None:
            return f"a per-step call has no executor: {d.summary()}"
        if d.substitute and self.no_sub:
            return f"substitution refused (no_substitute=True): {d.summary()}"
        if d.executor == "torch_sdpa_fallback":
            return "a fallback returns no log-sum-exp to merge"
        if self.training and d.executor not in _STATS_BACKWARD:
            return (f"executor {d.executor}'s backward recomputes the softmax of its own keys; a ring "
                    f"step needs the merged O and LSE ({', '.join(sorted(_STATS_BACKWARD))} use them)")
        return None

    # -- merging ----------------------------------------------------------------------------

    def new_acc(self, q: torch.Tensor, dv: int):
        o_shape = list(q.shape)
        o_shape[-1] = dv
        b, h, s = _apt._bhsd(q, self.li)[0][:3]
        acc_o = torch.zeros(o_shape, dtype=self.acc, device=q.device)
        acc_lse = torch.full((b, h, s), float("-inf"), dtype=self.acc, device=q.device)
        return acc_o, acc_lse

    def merge(self, acc_o, acc_lse, o_blk, lse_blk, q0: int, q1: int) -> None:
        """acc <- logaddexp-weighted sum of acc and the block's partial result, rows [q0, q1)."""
        ao = self.narrow(acc_o, q0, q1)
        al = acc_lse.narrow(2, q0, q1 - q0)
        lb = lse_blk.to(self.acc)
        new = torch.logaddexp(al, lb)
        # Rows with no key so far (al = -inf) weigh 0; new is finite on a block's rows.
        w_old = torch.nan_to_num(torch.exp(al - new), nan=0.0)
        w_blk = torch.nan_to_num(torch.exp(lb - new), nan=0.0)
        w_old = _apt._from_bhsd(w_old.unsqueeze(-1), self.li)
        w_blk = _apt._from_bhsd(w_blk.unsqueeze(-1), self.li)
        ao.mul_(w_old).add_(o_blk.to(self.acc) * w_blk)
        al.copy_(new)


# ---------------------------------------------------------------------------------------------
# Ring steps (shared by the distributed ring and the one-process simulation).


class _RingForward:
    def __init__(self, run: _Run, q: torch.Tensor, dv: int, work: List[StepWork]):
        self.run, self.q, self.work = run, q, work
        self.acc_o, self.acc_lse = run.new_acc(q, dv)

    def step(self, i: int, k: torch.Tensor, v: torch.Tensor) -> None:
        for blk in self.work[i].blocks:
            o, lse = self.run.fwd(self.q, k, v, blk)
            self.run.merge(self.acc_o, self.acc_lse, o, lse, blk.q0, blk.q1)

    def finish(self) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.acc_o.to(self.q.dtype), self.acc_lse


class _RingBackward:
    def __init__(self, run: _Run, q, do, o, lse, work: List[StepWork]):
        self.run, self.q, self.do, self.o, self.lse, self.work = run, q, do, o, lse, work
        self.dq = torch.zeros(q.shape, dtype=run.acc, device=q.device)

    def step(self, i: int, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """This rank's dK/dV contribution for the step's K/V, packed (accumulation dtype)."""
        run = self.run
        dkv = torch.zeros(k.numel() + v.numel(), dtype=run.acc, device=k.device)
        dk, dv = _unpack(dkv, (k.shape, v.shape))
        for blk in self.work[i].blocks:
            gq, gk, gv = run.bwd(self.do, self.q, k, v, self.o, self.lse, blk)
            run.narrow(self.dq, blk.q0, blk.q1).add_(gq)
            run.narrow(dk, blk.k0, blk.k1).add_(gk)
            run.narrow(dv, blk.k0, blk.k1).add_(gv)
        return dkv


def _pack(ts: Sequence[torch.Tensor], dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    return torch.cat([t.reshape(-1).to(dtype) if dtype else t.reshape(-1) for t in ts])


def _pack_into(buf: torch.Tensor, ts: Sequence[torch.Tensor]) -> torch.Tensor:
    at = 0
    for t in ts:
        buf[at:at + t.numel()].view(t.shape).copy_(t)
        at += t.numel()
    return buf


def _unpack(buf: torch.Tensor, shapes: Sequence[Sequence[int]]) -> List[torch.Tensor]:
    out, at = [], 0
    for s in shapes:
        n = math.prod(s)
        out.append(buf[at:at + n].view(*s))
        at += n
    return out


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
        x = _apt._to_bhsd(t, li)
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
        ob = _apt._to_bhsd(out, li)
        # Copied straight into place: [a2a, b, hp, c, d] -> [b, hp, a2a * c, d] views.
        ob[:, :, : a2a * c].view(b, hp, a2a, c, d).copy_(r[:, :, :, :c].permute(1, 2, 0, 3, 4))
        ob[:, :, a2a * c:].view(b, hp, a2a, c, d).copy_(r[:, :, :, c:].flip(0).permute(1, 2, 0, 3, 4))
        result.append(out)
    return result


def _heads_to_seq(ts: Sequence[torch.Tensor], group, a2a: int, li: int) -> List[torch.Tensor]:
    """The inverse of :func:`_seq_to_heads`."""
    sends, metas = [], []
    for t in ts:
        x = _apt._to_bhsd(t, li)
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
        _apt._to_bhsd(out, li).copy_(full)
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
    ``return_decision``: also return the :class:`CPDecision` of this rank."""
    local_msg = ""
    verdict = _OK
    li = 0
    a2a_group = ring_group = None
    ring_rank = a2a_rank = 0
    decision = CPDecision(cp_comm_type, 0, 0, None)
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
    try:
        if layout not in LAYOUTS:
            raise PolicyError(f"layout must be one of {', '.join(LAYOUTS)}, found {layout!r}")
        li = LAYOUTS.index(layout)
        if diagonal not in _apt.DIAGONALS:
            raise PolicyError(f"diagonal must be one of {', '.join(_apt.DIAGONALS)}, found {diagonal!r}")
        if on_decline != "raise":
            raise PolicyError(f'on_decline={on_decline!r} is not available under context parallelism '
                              '(a fallback returns no log-sum-exp to merge); use on_decline="raise"')
        # This rank's shards, checked as one call's tensors (the ranks' agreement: below).
        _apt._check_inputs(q, k, v, li)
        (b, hq, sq, dqk), _ = _apt._bhsd(q, li)
        (_, hkv, skv, _), _ = _apt._bhsd(k, li)
        (_, _, _, dv), _ = _apt._bhsd(v, li)
        dims = [b, hq, hkv, sq, skv, dqk, dv]
        br = diagonal == "bottom_right"
        mask = (2 if br else 1) if is_causal else 0
        wl, wr = _apt._window_args(window, is_causal)
        scale_v = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
        training = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        spec = CPSpec(cp_comm_type, n, a2a_size if cp_comm_type in ("a2a", "a2a+p2p") else 1, b, hq, hkv,
                      sq * n, skv * n, dqk, dv, layout, str(q.dtype).replace("torch.", ""), q.device.type,
                      mask, wl, wr, br, scale_v, float(dropout_p), training)
        # 1. The policy decides first: the native pack on the whole call.
        pre = preflight(spec, _apt.live_facts(q.device))
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
        q, k, v = (_apt._usable(t) for t in (q, k, v))
        k, v = k.contiguous(), v.contiguous()  # the layout the received K/V have
        run = _Run(spec, li, scale_v, _apt._policy_id(policy), bool(no_substitute), training,
                   a2a_group, ring_group, ring_rank, work, _apt.lse_dtype(q.dtype))
        # 2. Every per-step call, decided by `policy` on tensors of the shapes it will see.
        why = _decide_steps(run, q, k, v, bufs)
        decision.steps = list(run.decisions.values())
        if why:
            raise ContextParallelDeclined(why)
    except ContextParallelDeclined as e:
        verdict, local_msg = _DECLINED, f"rank {rank}: {e}"
    except _apt.InvalidInput as e:
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
            _f64_bits(dropout_p), int(spec.training) if spec else 0, int(bool(no_substitute)),
            a2a_rank, ring_rank, verdict]
    # 3. Every rank sees every rank's descriptor before any K/V moves.
    try:
        _agree(desc, groups, q if isinstance(q, torch.Tensor) else torch.empty(0), local_msg)
    except ContextParallelDeclined as e:
        decision.declined = str(e)
        e.decision = decision
        raise
    assert run is not None and spec is not None
    o = _CP.apply(q, k, v, run, bufs)
    if return_decision:
        return o, decision
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
    in ring order). Returns ``{"o", "dq", "dk", "dv", "work": [per rank: [StepWork]]}``."""
    li = LAYOUTS.index(layout)
    sd = _seq_dim(layout)
    (b, hq, sq, dqk), _ = _apt._bhsd(q, li)
    (_, hkv, skv, _), _ = _apt._bhsd(k, li)
    dv = v.shape[-1]
    br = diagonal == "bottom_right"
    mask = (2 if br else 1) if is_causal else 0
    wl, wr = _apt._window_args(window, is_causal)
    scale_v = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    training = grad_out is not None
    spec = CPSpec("p2p", cp_size, 1, b, hq, hkv, sq, skv, dqk, dv, layout, str(q.dtype).replace("torch.", ""),
                  q.device.type, mask, wl, wr, br, scale_v, 0.0, training)
    qs = [shard_sequence(q, cp_size, r, layout) for r in range(cp_size)]
    ks = [shard_sequence(k, cp_size, r, layout).contiguous() for r in range(cp_size)]
    vs = [shard_sequence(v, cp_size, r, layout).contiguous() for r in range(cp_size)]
    pid = _apt._policy_id(policy)
    runs = [_Run(spec, li, scale_v, pid, False, training, None, None, r, plan_work(spec, r), _apt.lse_dtype(q.dtype))
            for r in range(cp_size)]
    fw = [_RingForward(runs[r], qs[r], dv, runs[r].work) for r in range(cp_size)]
    for i in range(cp_size):
        for r in range(cp_size):
            src = (r - i) % cp_size
            fw[r].step(i, ks[src], vs[src])
    outs = [f.finish() for f in fw]
    res: Dict[str, Any] = {"o": unshard_sequence([o for o, _ in outs], layout), "work": [rn.work for rn in runs]}
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
