"""Runners of torch's own attention kernels: ``torch_flash`` and ``torch_efficient`` (with
their padded and packed paths, attn_policy/_varlen.py) and ``torch_cudnn``, through the aten ops
with an explicit log-sum-exp."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F

from ._call import PACKED, _Call
from ._runners import _empty, _Runner
from ._tensors import (_from_bhsd, _into_layout, _like, _restrided, _restrided_bshd, _to_bhsd, _to_bshd,
                       lse_dtype)
from ._varlen import VarlenPlan


class _VarlenRunner(_Runner):
    """What ``torch_flash`` and ``torch_efficient`` share for padded and packed batches
    (``call.packing``): the kernels' varlen arguments on a packed copy of the real tokens
    (attn_policy/_varlen.py), the results scattered back with the padding conventions."""

    def _init_varlen(self, call: _Call):
        self.packing = call.packing
        self.varlen: Optional[VarlenPlan] = None
        if call.packing:
            sq, skv = (call.tokens_q, call.tokens_kv) if call.packing == PACKED else (call.sq, call.skv)
            mask_args = (call.mask, call.window_left, call.window_right, call.bottom_right)
            self.varlen = VarlenPlan(call.packing, call.seqlens_q, call.seqlens_kv, sq, skv, mask_args)
        self.lse_shape, self.lse_dtype = call.lse_shape, lse_dtype(call.dtype)

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` as the plan reads it: ``[b, s, h, d]`` padded, ``[t, h, d]`` packed."""
        return t if self.packing == PACKED else _to_bshd(t, self.layout)

    def _kernel_forward(self, plan: VarlenPlan, qp, kp, vp) -> Tuple[torch.Tensor, torch.Tensor]:
        """The kernel on packed buffers: O ``[tokens, h, d_v]`` and the LSE ``[h, tokens]``."""
        raise NotImplementedError

    def _kernel_backward(self, plan: VarlenPlan, gp, qp, kp, vp, op, lse_hn) -> Tuple[torch.Tensor, ...]:
        """dQ, dK, dV of packed buffers (``lse_hn``: ``[h, tokens]``, ``+inf`` in empty rows)."""
        raise NotImplementedError

    def _varlen_forward(self, q, k, v):
        plan = self.varlen.to(q.device)
        if not plan.live:  # no sequence has both a query and a key: every row is empty
            o = torch.zeros(self.o_shape, dtype=q.dtype, device=q.device)
            return o, torch.full(self.lse_shape, float("-inf"), dtype=self.lse_dtype, device=q.device)
        op, lse_hn = self._kernel_forward(plan, plan.gather(self._rows(q), "q"), plan.gather(self._rows(k), "kv"),
                                          plan.gather(self._rows(v), "kv"))
        plan.fix_rows(op, lse_hn)
        if plan.in_place and op.is_contiguous():
            return op, plan.lse_out(lse_hn, self.lse_dtype)
        o = _empty(self.o_shape, dtype=q.dtype, device=q.device)
        plan.scatter(op, self._rows(o), "q")
        return o, plan.lse_out(lse_hn, self.lse_dtype)

    def _varlen_backward(self, g, q, k, v, o, lse):
        plan = self.varlen.to(q.device)
        if not plan.live:
            return tuple(_like(t).zero_() for t in (q, k, v))
        qp, kp, vp = plan.gather(self._rows(q), "q"), plan.gather(self._rows(k), "kv"), plan.gather(self._rows(v), "kv")
        gp, op = plan.gather(self._rows(g), "q"), plan.gather(self._rows(o), "q")
        lse_hn = plan.kernel_lse(plan.lse_in(lse))
        dqp, dkp, dvp = self._kernel_backward(plan, gp, qp, kp, vp, op, lse_hn)
        plan.fix_grads(dqp, dkp, dvp)
        if plan.in_place:
            return _restrided((dqp, dkp, dvp), (q, k, v))
        grads = []
        for d, t, side in ((dqp, q, "q"), (dkp, k, "kv"), (dvp, v, "kv")):
            out = _like(t)
            plan.scatter(d, self._rows(out), side)
            grads.append(out)
        return tuple(grads)


class _FlashRunner(_VarlenRunner):
    """``torch_flash``: ``aten::_flash_attention_forward/backward`` on ``bshd`` views; padded
    and packed batches through ``cum_seq_q/k`` (a packed copy, ``[tokens, h, d]``, whose LSE
    is ``[h, tokens]``: torch's meta function for the op)."""

    executor = "torch_flash"

    def __init__(self, call: _Call):
        self.layout, self.scale = call.layout, call.scale
        causal = call.mask != 0
        wl, wr = call.window_left, call.window_right
        if causal:
            wr = 0
        self.causal = causal and wl < 0
        # FlashAttention takes a window around the bottom-right diagonal; -1 = unbounded.
        self.wl, self.wr = (wl, wr) if (wl >= 0 or (not causal and wr >= 0)) else (-1, -1)
        self.sq, self.skv, self.o_shape = call.sq, call.skv, call.o_shape
        self._init_varlen(call)

    def _win(self):
        if self.wl < 0 and self.wr < 0:
            return {}
        return {"window_size_left": self.wl, "window_size_right": self.wr}

    def _kernel_forward(self, plan, qp, kp, vp):
        out = torch.ops.aten._flash_attention_forward(
            qp, kp, vp, plan.cu_q, plan.cu_kv, plan.max_q, plan.max_kv, 0.0, self.causal, False,
            scale=self.scale, **self._win()
        )
        return out[0], out[1]

    def _kernel_backward(self, plan, gp, qp, kp, vp, op, lse_hn):
        seed = torch.zeros(2, dtype=torch.uint64, device=qp.device)
        off = torch.zeros((), dtype=torch.uint64, device=qp.device)
        return torch.ops.aten._flash_attention_backward(
            gp, qp, kp, vp, op, lse_hn, plan.cu_q, plan.cu_kv, plan.max_q, plan.max_kv, 0.0, self.causal, seed, off,
            scale=self.scale, **self._win()
        )

    def forward(self, q, k, v, sink=None):
        if self.varlen is not None:
            return self._varlen_forward(q, k, v)
        qb, kb, vb = (_to_bshd(t, self.layout) for t in (q, k, v))
        out = torch.ops.aten._flash_attention_forward(
            qb, kb, vb, None, None, self.sq, self.skv, 0.0, self.causal, False, scale=self.scale, **self._win()
        )
        return _into_layout(out[0], self.o_shape, self.layout, q), out[1].contiguous()

    def backward(self, g, q, k, v, o, lse, sink=None):
        if self.varlen is not None:
            return self._varlen_backward(g, q, k, v, o, lse)
        qb, kb, vb, ob, gb = (_to_bshd(t, self.layout) for t in (q, k, v, o, g))
        # No dropout: the RNG state is unused (uint64, as the forward returns it).
        seed = torch.zeros(2, dtype=torch.uint64, device=q.device)
        off = torch.zeros((), dtype=torch.uint64, device=q.device)
        dqb, dkb, dvb = torch.ops.aten._flash_attention_backward(
            gb, qb, kb, vb, ob, lse, None, None, self.sq, self.skv, 0.0, self.causal, seed, off,
            scale=self.scale, **self._win()
        )
        return _restrided_bshd((dqb, dkb, dvb), (q, k, v), self.layout)


class _EfficientRunner(_VarlenRunner):
    """``torch_efficient``: ``aten::_efficient_attention_forward/backward`` on ``bshd`` views.
    ``custom_mask_type`` 0 / 1 / 2 = no mask / causal top-left / causal bottom-right (type 2 is
    not per sequence with ``cu_seqlens``: see the gate). Padded and packed batches: a packed copy
    as one batch ``[1, tokens, h, d]``, whose LSE is ``[sequences, h, rows]`` (torch's meta
    function for the op)."""

    executor = "torch_efficient"

    def __init__(self, call: _Call):
        self.layout, self.scale = call.layout, call.scale
        # With lengths a causal mask runs top-left: the gate admits bottom-right only where every
        # running sequence is square (one diagonal), the kernel's type 2 being wrong there.
        self.mask_type = 0 if call.mask == 0 else (2 if call.bottom_right and not call.packing else 1)
        self.sq, self.skv, self.o_shape = call.sq, call.skv, call.o_shape
        # The kernel's LSE has ceil(s_q / 32) * 32 rows.
        self.lse_rows = -(-call.sq // 32) * 32
        # The RNG state the forward returns (not read without dropout), as the backward gets it.
        self.rng: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
        self._init_varlen(call)

    def _seed(self):
        return self.rng or (torch.zeros((), dtype=torch.int64), torch.zeros((), dtype=torch.int64))

    def _kernel_forward(self, plan, qp, kp, vp):
        out = torch.ops.aten._efficient_attention_forward(
            qp.unsqueeze(0), kp.unsqueeze(0), vp.unsqueeze(0), None, plan.cu_q, plan.cu_kv, plan.max_q, plan.max_kv,
            0.0, self.mask_type, True, scale=self.scale
        )
        self.rng = (out[2], out[3])
        return out[0][0], plan.lse_from_eff(out[1])

    def _kernel_backward(self, plan, gp, qp, kp, vp, op, lse_hn):
        seed, offset = self._seed()
        dq, dk, dv, _ = torch.ops.aten._efficient_attention_backward(
            gp.unsqueeze(0), qp.unsqueeze(0), kp.unsqueeze(0), vp.unsqueeze(0), None, op.unsqueeze(0), plan.cu_q,
            plan.cu_kv, plan.max_q, plan.max_kv, plan.lse_to_eff(lse_hn), 0.0, seed, offset, self.mask_type, False,
            scale=self.scale,
        )
        return dq[0], dk[0], dv[0]

    def forward(self, q, k, v, sink=None):
        if self.varlen is not None:
            return self._varlen_forward(q, k, v)
        qb, kb, vb = (_to_bshd(t, self.layout) for t in (q, k, v))
        out = torch.ops.aten._efficient_attention_forward(
            qb, kb, vb, None, None, None, None, None, 0.0, self.mask_type, True, scale=self.scale
        )
        self.rng = (out[2], out[3])
        o = _into_layout(out[0], self.o_shape, self.layout, q)
        return o, out[1][:, :, : self.sq].contiguous()

    def backward(self, g, q, k, v, o, lse, sink=None):
        if self.varlen is not None:
            return self._varlen_backward(g, q, k, v, o, lse)
        qb, kb, vb, ob, gb = (_to_bshd(t, self.layout) for t in (q, k, v, o, g))
        lse_k = F.pad(lse, (0, self.lse_rows - self.sq)) if self.lse_rows != self.sq else lse
        seed, offset = self._seed()
        dqb, dkb, dvb, _ = torch.ops.aten._efficient_attention_backward(
            gb, qb, kb, vb, None, ob, None, None, self.sq, self.skv, lse_k, 0.0, seed, offset,
            self.mask_type, False, scale=self.scale,
        )
        return _restrided_bshd((dqb, dkb, dvb), (q, k, v), self.layout)


class _CudnnSdpaRunner(_Runner):
    """``torch_cudnn``: ``aten::_scaled_dot_product_cudnn_attention`` and its backward on
    ``bhsd`` views. The LSE the forward returns is kept as ``[b, h, s_q]``; the backward gets
    it back in the shape the forward gave (so the pair stays consistent across versions)."""

    executor = "torch_cudnn"

    def __init__(self, call: _Call):
        self.layout, self.scale = call.layout, call.scale
        self.causal = call.mask != 0
        self.sq, self.skv, self.o_shape = call.sq, call.skv, call.o_shape
        self.lse_shape: Optional[Tuple[int, ...]] = None
        # The RNG state the forward returns (not read without dropout), as the backward gets it.
        self.rng: Optional[Tuple[Any, Any]] = None

    def forward(self, q, k, v, sink=None):
        qh, kh, vh = (_to_bhsd(t, self.layout) for t in (q, k, v))
        out = torch.ops.aten._scaled_dot_product_cudnn_attention(
            qh, kh, vh, None, True, 0.0, self.causal, False, scale=self.scale
        )
        o_bhsd, lse = out[0], out[1]
        self.lse_shape = tuple(lse.shape)
        self.rng = (out[6], out[7])
        o = _from_bhsd(o_bhsd, self.layout)
        if not o.is_contiguous():
            o = o.contiguous()
        return o, lse.reshape(lse.shape[0], lse.shape[1], self.sq).contiguous()

    def backward(self, g, q, k, v, o, lse, sink=None):
        qh, kh, vh, oh, gh = (_to_bhsd(t, self.layout) for t in (q, k, v, o, g))
        lse_k = lse.reshape(self.lse_shape) if self.lse_shape is not None else lse
        seed, offset = self.rng or (torch.zeros((), dtype=torch.int64), torch.zeros((), dtype=torch.int64))
        dq, dk, dv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            gh, qh, kh, vh, oh, lse_k, seed, offset, None, None, None, self.sq, self.skv, 0.0,
            self.causal, scale=self.scale,
        )
        grads = tuple(_from_bhsd(t, self.layout) for t in (dq, dk, dv))
        return _restrided(grads, (q, k, v))
