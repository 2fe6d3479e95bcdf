"""Shapes, strides and layout views of attention tensors: pure torch helpers, no policy and no
executor. ``layout`` is an index into ``LAYOUTS`` (0 bhsd, 1 bshd, 2 sbhd, 3 thd: packed
``[tokens, heads, head dim]``, one batch of ``tokens`` rows)."""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the log-sum-exp the op returns for inputs of ``dtype``: float64 for float64
    inputs (the CPU reference keeps them exact, so a context-parallel merge of partial results
    stays float64-accurate), float32 otherwise (every executor's convention)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _bhsd(t: torch.Tensor, layout: int) -> Tuple[Tuple[int, int, int, int], Tuple[int, int, int]]:
    """(b, h, s, d) and strides (batch, head, seq) of a tensor in layout ``layout`` (``thd``:
    one batch of ``t`` rows, batch stride 0)."""
    sz, st = t.shape, t.stride()
    if layout == 3:  # thd
        return (1, sz[1], sz[0], sz[2]), (0, st[1], st[0])
    if layout == 0:  # bhsd
        return (sz[0], sz[1], sz[2], sz[3]), (st[0], st[1], st[2])
    if layout == 1:  # bshd
        return (sz[0], sz[2], sz[1], sz[3]), (st[0], st[2], st[1])
    return (sz[1], sz[2], sz[0], sz[3]), (st[1], st[2], st[0])  # sbhd


def _lse_shape(q: torch.Tensor, layout: int) -> Tuple[int, int, int]:
    """The LSE's shape: ``[b, h_q, s_q]``, ``[1, h_q, t_q]`` for packed ``thd``."""
    (b, h, s, _), _ = _bhsd(q, layout)
    return (b, h, s)


def _o_shape(q: torch.Tensor, v: torch.Tensor) -> List[int]:
    return [*q.shape[:-1], v.shape[-1]]


def _contiguous_strides(shape: Sequence[int]) -> List[int]:
    st, acc = [0] * len(shape), 1
    for i in range(len(shape) - 1, -1, -1):
        st[i] = acc
        acc *= max(int(shape[i]), 1)
    return st


def _usable(t: torch.Tensor) -> torch.Tensor:
    """The tensor itself when its head dim is contiguous and no stride is zero or negative
    across more than one element; else a contiguous copy (an executor reads rows in place)."""
    st = t.stride()
    if st[-1] == 1 and all(s > 0 or n <= 1 for s, n in zip(st, t.shape)):
        return t
    return t.contiguous()


def _like(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor with ``t``'s shape and strides (gradients use the strides of
    their inputs; ``empty_like`` would not keep the strides of a view with gaps), contiguous
    where those strides would make elements share memory (an ``expand``ed input) or the head
    dim is not contiguous (the inputs the op copies first)."""
    if _usable(t) is not t:
        return torch.empty(t.shape, dtype=t.dtype, device=t.device)
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)


def _to_bhsd(t: torch.Tensor, layout: int) -> torch.Tensor:
    return t if layout == 0 else (t.transpose(1, 2) if layout == 1 else t.permute(1, 2, 0, 3))


def _from_bhsd(t: torch.Tensor, layout: int) -> torch.Tensor:
    return t if layout == 0 else (t.transpose(1, 2) if layout == 1 else t.permute(2, 0, 1, 3))


def _to_bshd(t: torch.Tensor, layout: int) -> torch.Tensor:
    return t.transpose(1, 2) if layout == 0 else (t if layout == 1 else t.transpose(0, 1))


def _from_bshd(t: torch.Tensor, layout: int) -> torch.Tensor:
    return t.transpose(1, 2) if layout == 0 else (t if layout == 1 else t.transpose(0, 1))


def _into_layout(o_bshd: torch.Tensor, call_o_shape, layout: int, like: torch.Tensor) -> torch.Tensor:
    """O computed as a ``bshd`` tensor, as the op returns it: contiguous in the call's layout
    (the same tensor when it already is)."""
    o = o_bshd if layout == 1 else _from_bshd(o_bshd, layout)
    if o.is_contiguous():
        return o
    out = torch.empty(call_o_shape, dtype=like.dtype, device=like.device)
    _to_bshd(out, layout).copy_(o_bshd)
    return out


def _restrided_bshd(grads_bshd, like, layout: int) -> Tuple[torch.Tensor, ...]:
    """Gradients computed as ``bshd`` tensors, with the strides of ``like``."""
    return _restrided(tuple(_from_bshd(g, layout) for g in grads_bshd), like)


def _restrided(grads, like) -> Tuple[torch.Tensor, ...]:
    """Gradients with the strides of ``like`` (what the fake says): copied where they differ."""
    out = []
    for gr, t in zip(grads, like):
        if gr.stride() == t.stride() and gr.dtype == t.dtype:
            out.append(gr)
            continue
        dst = _like(t)
        dst.copy_(gr)
        out.append(dst)
    return tuple(out)
