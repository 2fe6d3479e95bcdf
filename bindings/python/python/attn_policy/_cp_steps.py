"""Context parallelism, the per-step calls: one call's configuration (:class:`_Run`: the op per
block, each block's decision, the log-sum-exp merge of partial results), the ring's forward and
backward steps (shared by the distributed ring and :func:`simulate_ring`), and the packing of
K/V buffers."""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch

# The op every block calls (torch.ops.attn_policy.attention), defined on import of _op.
from . import _op  # noqa: F401
from ._chain import _entry, _key
from ._cp_plan import _SEQ_DIM, _STATS_BACKWARD, Block, CPSpec, StepWork
from ._model import Explanation
from ._tensors import _bhsd, _from_bhsd


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
        self.decisions: Dict[tuple, Explanation] = {}

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
        e = _entry(q, k, v, args)
        d = e.decision
        self.decisions[_key(q, k, v, args)] = d
        if d.substitution_refused:
            return f"substitution refused (no_substitute=True): {d.summary()}"
        if e.runner is None:
            return f"a per-step call has no executor: {d.summary()}"
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
        b, h, s = _bhsd(q, self.li)[0][:3]
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
        w_old = _from_bhsd(w_old.unsqueeze(-1), self.li)
        w_blk = _from_bhsd(w_blk.unsqueeze(-1), self.li)
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
