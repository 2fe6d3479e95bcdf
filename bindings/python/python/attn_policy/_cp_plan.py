"""Context parallelism, the plan: sharding (TransformerEngine's ``2 * cp_size`` chunks), the
call's mask as a band over global positions, the blocks (executor calls) of each rank's steps,
the whole-call description (:class:`CPSpec`) with the ``native`` pack's pre-flight and this
implementation's own limits, and what a call decided (``_CPRecord``: its
:class:`attn_policy.Explanation`). No communication: every function here is a pure function of
its arguments (the planner is cached). Re-exported by :mod:`attn_policy.context_parallel`."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from . import Decision, Policy, PolicyError
from ._call import _LAYOUT_TE, LAYOUTS, te_window_fact
from ._facts import live_facts
from ._model import Explanation
from ._native import NativeCall


COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")
_SEQ_DIM = {"bhsd": 2, "bshd": 1, "sbhd": 0}
_HEAD_DIM = {"bhsd": 1, "bshd": 2, "sbhd": 2}
# Executors whose backward reads the given O and LSE (FlashAttention's formula) instead of
# recomputing the softmax of its own keys: a ring step's backward needs the merged ones.
_STATS_BACKWARD = frozenset({"reference", "cudnn", "chunked", "fused", "torch_flash"})


class ContextParallelDeclined(PolicyError):
    """The call cannot run context-parallel: the ``native`` pack declined it (``.decision``), a
    per-step call has no executor, or another rank declined. Raised on every rank."""

    def __init__(self, message: str, decision: Optional[Explanation] = None):
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
        window = te_window_fact(self.mask, self.window_left, self.window_right, self.seqlen_q, self.seqlen_kv)
        return {
            "qkv_type": "Tensor",
            "qkv_dtype": _FACT_DTYPES[self.dtype],
            "qkv_layout": _LAYOUT_TE[self.layout],
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
    env = env if env is not None else live_facts(spec.device)
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


class _CPRecord:
    """What one context-parallel call on this rank has decided so far (filled in as
    ``cp_attention`` goes): the ``native`` pack's pre-flight on the whole call, and
    ``policy``'s decision for each distinct per-step call; :meth:`explanation` is the call's
    :class:`Explanation` (kind ``context_parallel``)."""

    __slots__ = ("comm_type", "cp_size", "cp_rank", "preflight", "steps", "work", "declined")

    def __init__(self, comm_type: str):
        self.comm_type, self.cp_size, self.cp_rank = comm_type, 0, 0
        self.preflight: Optional[Decision] = None
        self.steps: List[Explanation] = []
        self.work: List[StepWork] = []
        self.declined = ""

    def explanation(self) -> Explanation:
        work = [{"step": w.step, "kv_from": w.kv_from, "pairs_skipped": w.pairs_skipped,
                 "blocks": [{"q0": b.q0, "q1": b.q1, "k0": b.k0, "k1": b.k1, "left": b.left, "right": b.right}
                            for b in w.blocks]} for w in self.work]
        extra = {"comm_type": self.comm_type, "cp_size": self.cp_size, "cp_rank": self.cp_rank,
                 "declined": self.declined or None, "work": work}
        pre = self.preflight
        native = NativeCall(
            pre._d if pre is not None else None, [], None, pack=None if pre is not None else "native",
            kind="context_parallel", error=self.declined or None, extra=extra,
            steps=[s._n for s in self.steps],
        )
        return Explanation(native, pre, self.steps, self.work)
