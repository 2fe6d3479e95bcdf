"""Padded and packed batches through torch's varlen kernels (``torch_flash``,
``torch_efficient``): pure tensor helpers, no policy.

The kernels take packed ``[tokens, heads, head dim]`` sequences with ``cu_seqlens``. A
:class:`VarlenPlan` says, once per call signature, where each sequence's tokens sit in the
call's tensors:
- padded batches (right or left) are gathered into a packed copy (``gather``) and the results
  scattered back (``scatter``), as transformers' FlashAttention integration unpads; that costs
  one copy of Q, K, V (and dO, O) in and of O (dQ, dK, dV) out;
- a packed call runs in place, unless a sequence has no query or no key: such a sequence is
  left out of the kernel's ``cu_seqlens`` (its rows are empty by the conventions), which takes a
  gather too.

The conventions (docs/features.md) are applied here, whatever a kernel writes there: padding
rows and rows that see no key get ``O = 0``, ``LSE = -inf``, ``dQ = 0``; padding keys and keys
no row sees get ``dK = dV = 0``. FlashAttention marks an empty row's LSE ``+inf`` (so that its
backward reads ``exp(S - LSE) = 0``); the backward is given ``+inf`` there again (``kernel_lse``).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

# The call's packing (``_Call.packing``): 1 padded right, 2 padded left, 3 packed.
RIGHT, LEFT, PACKED = 1, 2, 3


def visible_keys(lq: int, lkv: int, mask_args) -> Tuple[List[int], List[int]]:
    """The first and last key (inclusive) each of a sequence's ``lq`` rows sees, in the
    sequence's own coordinates (``mask_args``: mask 0 none / 1 causal, window left, window
    right (-1: unbounded), bottom-right diagonal); ``lo > hi``: the row sees no key."""
    mask, wl, wr, br = mask_args
    if mask != 0:
        wr = 0 if wr < 0 else min(wr, 0)
    off = (lkv - lq) if br else 0
    lo, hi = [], []
    for i in range(lq):
        d = i + off
        lo.append(max(0, d - wl) if wl >= 0 else 0)
        hi.append(min(lkv - 1, d + wr) if wr >= 0 else lkv - 1)
    return lo, hi


class VarlenPlan:
    """Where each sequence's tokens sit, for one call signature (host data made once; ``to``
    copies the index tensors to the device once).

    ``live``: the sequences with at least one query and one key, the only ones the kernel runs
    (in order). Per packed token of the kernel's buffers: ``q_b``/``q_s`` (padded: batch and
    row of the call's tensors) or ``q_t`` (packed: token), the same for the keys, and
    ``q_seq``/``q_pos`` (the live sequence and the row inside it: the memory-efficient kernel's
    LSE is ``[live, h, rows]``). ``empty_q``: the packed rows that see no key; ``unseen_kv``:
    the packed keys no row sees. ``cu_q``/``cu_kv``: int32 prefix sums of the live lengths."""

    def __init__(self, packing: int, lens_q: Sequence[int], lens_kv: Sequence[int], sq: int, skv: int, mask_args):
        if packing not in (RIGHT, LEFT, PACKED):
            raise ValueError(f"packing {packing}: 1 (padded right), 2 (padded left) or 3 (packed)")
        self.packing = packing
        self.lens_q, self.lens_kv = tuple(lens_q), tuple(lens_kv)
        # The call's token extent: padded `[b, s]` rows, packed `t` tokens.
        self.sq, self.skv = sq, skv
        self.live = [i for i, (a, b) in enumerate(zip(lens_q, lens_kv)) if a > 0 and b > 0]
        qb, qs, kb, ks, qseq, qpos, empty, unseen = [], [], [], [], [], [], [], []
        cu_q, cu_kv = [0], [0]
        start_q = start_kv = 0  # packed: each sequence's first token
        starts_q, starts_kv = [], []
        for lq, lkv in zip(lens_q, lens_kv):
            starts_q.append(start_q)
            starts_kv.append(start_kv)
            start_q, start_kv = start_q + lq, start_kv + lkv
        for n, b in enumerate(self.live):
            lq, lkv = lens_q[b], lens_kv[b]
            if packing == PACKED:
                qs += range(starts_q[b], starts_q[b] + lq)
                ks += range(starts_kv[b], starts_kv[b] + lkv)
            else:
                first_q = 0 if packing == RIGHT else sq - lq
                first_kv = 0 if packing == RIGHT else skv - lkv
                qb += [b] * lq
                qs += range(first_q, first_q + lq)
                kb += [b] * lkv
                ks += range(first_kv, first_kv + lkv)
            qseq += [n] * lq
            qpos += range(lq)
            lo, hi = visible_keys(lq, lkv, mask_args)
            seen = [i for i in range(lq) if lo[i] <= hi[i]]
            empty += [cu_q[-1] + i for i in range(lq) if lo[i] > hi[i]]
            # The rows' key ranges move by at most one per row: the keys seen are one run.
            first, last = (min(lo[i] for i in seen), max(hi[i] for i in seen)) if seen else (lkv, -1)
            unseen += [cu_kv[-1] + j for j in range(lkv) if j < first or j > last]
            cu_q.append(cu_q[-1] + lq)
            cu_kv.append(cu_kv[-1] + lkv)
        self.total_q, self.total_kv = cu_q[-1], cu_kv[-1]
        self.max_q = max((lens_q[b] for b in self.live), default=0)
        self.max_kv = max((lens_kv[b] for b in self.live), default=0)
        # A packed call whose every sequence runs: the tensors are the kernel's buffers.
        self.in_place = packing == PACKED and len(self.live) == len(self.lens_q)
        self._host = {
            "q_b": qb, "q_s": qs, "kv_b": kb, "kv_s": ks, "q_seq": qseq, "q_pos": qpos,
            "empty_q": empty, "unseen_kv": unseen,
        }
        self._cu = (cu_q, cu_kv)
        self.device: Optional[torch.device] = None

    def to(self, device) -> "VarlenPlan":
        """The index tensors on ``device`` (int64; ``cu_q``/``cu_kv`` int32), made once."""
        device = torch.device(device)
        if self.device == device:
            return self
        for name, vals in self._host.items():
            setattr(self, name, torch.tensor(vals, dtype=torch.int64, device=device))
        self.cu_q, self.cu_kv = (torch.tensor(c, dtype=torch.int32, device=device) for c in self._cu)
        self.device = device
        return self

    # -- Rows in and out -----------------------------------------------------------------------

    def gather(self, t: torch.Tensor, side: str) -> torch.Tensor:
        """The kernel's packed ``[tokens, h, d]`` buffer of ``t`` (``side`` "q" or "kv"): padded
        tensors as ``bshd`` views ``[b, s, h, d]``, packed ones ``[t, h, d]``. In place (``t``
        itself, its head dim made contiguous) for a packed call whose every sequence runs."""
        if self.in_place:
            return t if t.stride(-1) == 1 else t.contiguous()
        if self.packing == PACKED:
            return t[getattr(self, f"{side}_s")]
        return t[getattr(self, f"{side}_b"), getattr(self, f"{side}_s")]

    def scatter(self, packed: torch.Tensor, out: torch.Tensor, side: str) -> torch.Tensor:
        """``out`` (the call's tensor as ``gather`` reads it) with the kernel's rows written
        back and every other row zero (padding rows, the tokens of sequences that did not run)."""
        if self.in_place:
            out.copy_(packed)
            return out
        out.zero_()
        if self.packing == PACKED:
            out[getattr(self, f"{side}_s")] = packed
        else:
            out[getattr(self, f"{side}_b"), getattr(self, f"{side}_s")] = packed
        return out

    def fix_rows(self, o: Optional[torch.Tensor], lse_hn: Optional[torch.Tensor]) -> None:
        """The rows that see no key, in the kernel's buffers: ``O = 0`` (``[tokens, h, d]``),
        ``LSE = -inf`` (``[h, tokens]``), in place."""
        if not self._host["empty_q"]:
            return
        if o is not None:
            o.index_fill_(0, self.empty_q, 0.0)
        if lse_hn is not None:
            lse_hn.index_fill_(1, self.empty_q, float("-inf"))

    def fix_grads(self, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor) -> None:
        """``dQ = 0`` in rows that see no key, ``dK = dV = 0`` for keys no row sees (packed
        buffers, in place): nothing flows back through them, whatever the kernel wrote."""
        if self._host["empty_q"]:
            dq.index_fill_(0, self.empty_q, 0.0)
        if self._host["unseen_kv"]:
            dk.index_fill_(0, self.unseen_kv, 0.0)
            dv.index_fill_(0, self.unseen_kv, 0.0)

    # -- The LSE -------------------------------------------------------------------------------

    def lse_out(self, lse_hn: torch.Tensor, lse_dtype: torch.dtype) -> torch.Tensor:
        """The call's LSE from the kernel's ``[h, tokens]``: ``[b, h, s]`` padded, ``[1, h, t]``
        packed; ``-inf`` in every row the kernel did not run."""
        h = lse_hn.shape[0]
        if self.packing == PACKED:
            if self.in_place:
                return lse_hn.to(lse_dtype).unsqueeze(0).contiguous()
            out = torch.full((1, h, self.sq), float("-inf"), dtype=lse_dtype, device=lse_hn.device)
            out[0].transpose(0, 1)[self.q_s] = lse_hn.transpose(0, 1).to(lse_dtype)
            return out
        out = torch.full((len(self.lens_q), h, self.sq), float("-inf"), dtype=lse_dtype, device=lse_hn.device)
        out.transpose(1, 2)[self.q_b, self.q_s] = lse_hn.transpose(0, 1).to(lse_dtype)
        return out

    def lse_in(self, lse: torch.Tensor) -> torch.Tensor:
        """The kernel's ``[h, tokens]`` fp32 LSE from the call's (``lse_out``'s inverse on the
        rows the kernel ran)."""
        if self.packing == PACKED:
            rows = lse[0] if self.in_place else lse[0][:, self.q_s]
        else:
            rows = lse.transpose(1, 2)[self.q_b, self.q_s].transpose(0, 1)
        return rows.to(torch.float32).contiguous()

    def kernel_lse(self, lse_hn: torch.Tensor) -> torch.Tensor:
        """The LSE a backward kernel is given: ``+inf`` in the rows that see no key (as
        FlashAttention's forward marks them), so ``exp(S - LSE)`` is 0 there, never NaN."""
        if not self._host["empty_q"]:
            return lse_hn
        return lse_hn.index_fill(1, self.empty_q, float("inf"))

    def eff_lse_rows(self) -> int:
        """The rows of the memory-efficient kernel's LSE: the longest live sequence, rounded
        up to 32."""
        return -(-self.max_q // 32) * 32

    def lse_from_eff(self, lse_eff: torch.Tensor) -> torch.Tensor:
        """``[h, tokens]`` from the memory-efficient kernel's ``[live, h, rows]``."""
        return lse_eff.transpose(1, 2)[self.q_seq, self.q_pos].transpose(0, 1).contiguous()

    def lse_to_eff(self, lse_hn: torch.Tensor) -> torch.Tensor:
        """The memory-efficient kernel's ``[live, h, rows]`` from ``[h, tokens]`` (rows past a
        sequence's end, which it does not read: 0)."""
        out = torch.zeros((len(self.live), lse_hn.shape[0], self.eff_lse_rows()), dtype=torch.float32,
                          device=lse_hn.device)
        out.transpose(1, 2)[self.q_seq, self.q_pos] = lse_hn.transpose(0, 1).to(torch.float32)
        return out
