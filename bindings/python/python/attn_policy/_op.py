"""The op: ``torch.ops.attn_policy.attention`` and ``attention_backward`` (defined with
``torch.library`` on import), their CPU and CUDA kernels (the cached chain decision's runner),
their fake implementations and the registered autograd formula."""

from __future__ import annotations

import torch

from ._autograd import _backward, _setup_context
from ._call import _check_backward, _check_inputs
from ._chain import _entry, _raise_for
from ._tensors import _like, _o_shape, _restrided, _usable, lse_dtype


# ---------------------------------------------------------------------------------------------
# The op.

_lib = torch.library.Library("attn_policy", "DEF")
_ARGS = ("int layout, int mask, int window_left, int window_right, bool bottom_right, float scale, "
         "float dropout_p, bool training, int policy, int on_decline, bool no_substitute")
_lib.define(f"attention(Tensor q, Tensor k, Tensor v, {_ARGS}) -> (Tensor, Tensor)")
_lib.define(
    f"attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, {_ARGS}) "
    "-> (Tensor, Tensor, Tensor)"
)


def _fwd_impl(q, k, v, layout, mask, wl, wr, br, scale, dropout_p, training, pid, on_decline, no_substitute):
    # Every call: a cached plan was made for these shapes, not for these storages.
    _check_inputs(q, k, v, layout)
    # The executors read rows with a contiguous head dim: a view of another kind is copied first
    # (as attention() does), never read as if it were one.
    q, k, v = _usable(q), _usable(k), _usable(v)
    args = (layout, mask, wl, wr, br, scale, dropout_p, training, pid, on_decline, no_substitute)
    e = _entry(q, k, v, args)
    if e.runner is None:
        _raise_for(e, no_substitute)
    return e.runner.forward(q, k, v)


def _bwd_impl(g, q, k, v, o, lse, layout, mask, wl, wr, br, scale, dropout_p, training, pid, on_decline, no_substitute):
    _check_backward(g, q, k, v, o, lse, layout)
    like = (q, k, v)
    q, k, v = _usable(q), _usable(k), _usable(v)
    args = (layout, mask, wl, wr, br, scale, dropout_p, training, pid, on_decline, no_substitute)
    e = _entry(q, k, v, args)
    if e.runner is None:
        _raise_for(e, no_substitute)
    # The executors read O contiguous in the layout and the LSE contiguous (the forward's); a
    # caller of the op may pass views (the context-parallel steps narrow them).
    o, lse = o.contiguous(), lse.contiguous()
    if g.stride() != o.stride():
        # dO must have the strides of O.
        g = g.contiguous() if o.is_contiguous() else torch.empty_like(o).copy_(g)
    # The gradients take the strides of the tensors given (the fake's), copied where Q, K or V was.
    return _restrided(e.runner.backward(g, q, k, v, o, lse), like)


for _dk in ("CPU", "CUDA"):
    _lib.impl("attention", _fwd_impl, _dk)
    _lib.impl("attention_backward", _bwd_impl, _dk)


@torch.library.register_fake("attn_policy::attention")
def _fwd_fake(q, k, v, layout, mask, wl, wr, br, scale, dropout_p, training, pid, on_decline, no_substitute):
    _check_inputs(q, k, v, layout, storage=False)  # a shape error surfaces while tracing
    o = q.new_empty(_o_shape(q, v))
    if layout == 0:
        b, h, s = q.shape[0], q.shape[1], q.shape[2]
    elif layout == 1:
        b, h, s = q.shape[0], q.shape[2], q.shape[1]
    else:
        b, h, s = q.shape[1], q.shape[2], q.shape[0]
    return o, q.new_empty((b, h, s), dtype=lse_dtype(q.dtype))


@torch.library.register_fake("attn_policy::attention_backward")
def _bwd_fake(g, q, k, v, o, lse, layout, *args):
    _check_backward(g, q, k, v, o, lse, layout, storage=False)
    return _like(q), _like(k), _like(v)


torch.library.register_autograd("attn_policy::attention", _backward, setup_context=_setup_context)
