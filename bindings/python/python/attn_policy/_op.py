"""The op: ``torch.ops.attn_policy.attention``, ``attention_backward`` and
``attention_backward_sink`` (a learnable sink's gradient too; defined with ``torch.library`` on
import), their CPU and CUDA kernels (the cached chain decision's runner),
their fake implementations and the registered autograd formula."""

from __future__ import annotations

import torch

from ._autograd import _backward, _setup_context
from ._call import _check_backward, _check_inputs, _with_features
from ._chain import _entry, _raise_for
from ._tensors import _like, _lse_shape, _o_shape, _restrided, _usable, lse_dtype


# ---------------------------------------------------------------------------------------------
# The op.

_lib = torch.library.Library("attn_policy", "DEF")
_ARGS = ("int layout, int mask, int window_left, int window_right, bool bottom_right, float scale, "
         "float dropout_p, bool training, int policy, int on_decline, bool no_substitute")
# The features, after the options and defaulted (a call without them passes none): logit
# soft-capping (0: none), the softmax (0 vanilla, 1 off-by-one, 2 learnable, with the sink
# logits `[h_q]`), the packing (0 none, 1 padded right, 2 padded left, 3 packed `thd`) and the
# per-sequence lengths (read to the host once per call: the native problem holds them).
_FEATURES = ("float softcap=0.0, int softmax=0, Tensor? sink=None, int packing=0, int[] seqlens_q=[], "
             "int[] seqlens_kv=[]")
_FEATURES_NO_SINK = "float softcap=0.0, int softmax=0, int packing=0, int[] seqlens_q=[], int[] seqlens_kv=[]"
_lib.define(f"attention(Tensor q, Tensor k, Tensor v, {_ARGS}, {_FEATURES}) -> (Tensor, Tensor)")
_lib.define(
    f"attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, {_ARGS}, "
    f"{_FEATURES}) -> (Tensor, Tensor, Tensor)"
)
# The backward of a call with learnable sink logits: their gradient too (in the sink's dtype).
_lib.define(
    f"attention_backward_sink(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
    f"Tensor sink, {_ARGS}, {_FEATURES_NO_SINK}) -> (Tensor, Tensor, Tensor, Tensor)"
)


def _fwd_impl(q, k, v, layout, mask, wl, wr, br, scale, dropout_p, training, pid, on_decline, no_substitute,
              softcap=0.0, softmax=0, sink=None, packing=0, seqlens_q=(), seqlens_kv=()):
    # Every call: a cached plan was made for these shapes, not for these storages.
    _check_inputs(q, k, v, layout)
    # The executors read rows with a contiguous head dim: a view of another kind is copied first
    # (as attention() does), never read as if it were one.
    q, k, v = _usable(q), _usable(k), _usable(v)
    args = _with_features((layout, mask, wl, wr, br, scale, dropout_p, training, pid, on_decline, no_substitute),
                          softcap, softmax, packing, seqlens_q, seqlens_kv)
    e = _entry(q, k, v, args)
    if e.runner is None:
        _raise_for(e, no_substitute)
    if sink is None:
        return e.runner.forward(q, k, v)
    return e.runner.forward(q, k, v, sink)


def _bwd_run(g, q, k, v, o, lse, sink, base, feats):
    """dQ, dK, dV (and d_sink with ``sink``) from the cached call's runner."""
    _check_backward(g, q, k, v, o, lse, base[0])
    like = (q, k, v)
    q, k, v = _usable(q), _usable(k), _usable(v)
    e = _entry(q, k, v, _with_features(base, *feats))
    if e.runner is None:
        _raise_for(e, base[-1])
    # The executors read O contiguous in the layout and the LSE contiguous (the forward's); a
    # caller of the op may pass views (the context-parallel steps narrow them).
    o, lse = o.contiguous(), lse.contiguous()
    if g.stride() != o.stride():
        # dO must have the strides of O.
        g = g.contiguous() if o.is_contiguous() else torch.empty_like(o).copy_(g)
    # The gradients take the strides of the tensors given (the fake's), copied where Q, K or V was.
    if sink is None:
        return _restrided(e.runner.backward(g, q, k, v, o, lse), like)
    dq, dk, dv, d_sink = e.runner.backward(g, q, k, v, o, lse, sink)
    return (*_restrided((dq, dk, dv), like), d_sink)


def _bwd_impl(g, q, k, v, o, lse, layout, mask, wl, wr, br, scale, dropout_p, training, pid, on_decline, no_substitute,
              softcap=0.0, softmax=0, sink=None, packing=0, seqlens_q=(), seqlens_kv=()):
    base = (layout, mask, wl, wr, br, scale, dropout_p, training, pid, on_decline, no_substitute)
    return _bwd_run(g, q, k, v, o, lse, sink, base, (softcap, softmax, packing, seqlens_q, seqlens_kv))


def _bwd_sink_impl(g, q, k, v, o, lse, sink, layout, mask, wl, wr, br, scale, dropout_p, training, pid, on_decline,
                   no_substitute, softcap=0.0, softmax=0, packing=0, seqlens_q=(), seqlens_kv=()):
    base = (layout, mask, wl, wr, br, scale, dropout_p, training, pid, on_decline, no_substitute)
    return _bwd_run(g, q, k, v, o, lse, sink, base, (softcap, softmax, packing, seqlens_q, seqlens_kv))


for _dk in ("CPU", "CUDA"):
    _lib.impl("attention", _fwd_impl, _dk)
    _lib.impl("attention_backward", _bwd_impl, _dk)
    _lib.impl("attention_backward_sink", _bwd_sink_impl, _dk)


@torch.library.register_fake("attn_policy::attention")
def _fwd_fake(q, k, v, layout, mask, wl, wr, br, scale, dropout_p, training, pid, on_decline, no_substitute,
              *features):
    _check_inputs(q, k, v, layout, storage=False)  # a shape error surfaces while tracing
    o = q.new_empty(_o_shape(q, v))
    return o, q.new_empty(_lse_shape(q, layout), dtype=lse_dtype(q.dtype))


@torch.library.register_fake("attn_policy::attention_backward")
def _bwd_fake(g, q, k, v, o, lse, layout, *args):
    _check_backward(g, q, k, v, o, lse, layout, storage=False)
    return _like(q), _like(k), _like(v)


@torch.library.register_fake("attn_policy::attention_backward_sink")
def _bwd_sink_fake(g, q, k, v, o, lse, sink, layout, *args):
    _check_backward(g, q, k, v, o, lse, layout, storage=False)
    return _like(q), _like(k), _like(v), torch.empty_like(sink)


torch.library.register_autograd("attn_policy::attention", _backward, setup_context=_setup_context)
