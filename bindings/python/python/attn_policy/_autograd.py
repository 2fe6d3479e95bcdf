"""Autograd glue of :func:`attn_policy.torch.attention`: the op's registered formula (the forward
saves Q, K, V, O and the LSE; the backward calls ``attention_backward``), registered by
:mod:`attn_policy._op`, and the ``torch.autograd.Function`` an eager call runs through without
the dispatcher (where the C++ eager node is not used)."""

from __future__ import annotations

import torch

from . import PolicyError


# The op's arguments after Q, K, V: 11 options, then the features (softcap, softmax, sink,
# packing, seqlens_q, seqlens_kv; `_op._FEATURES`), the sink tensor at this index among them.
_N_OPTIONS = 11
_SINK = 2


def _setup_context(ctx, inputs, output):
    # (torch fills the arguments the caller left at their defaults back in.)
    q, k, v = inputs[0], inputs[1], inputs[2]
    o, lse = output
    rest = tuple(inputs[3:])
    ctx.n_args = len(rest)
    ctx.args = rest[:_N_OPTIONS]
    feats = rest[_N_OPTIONS:]
    sink = feats[_SINK] if len(feats) > _SINK else None
    # The features but the sink tensor, as the backward op takes them after the options.
    ctx.feats = feats[:_SINK] + feats[_SINK + 1:]
    if not ctx.feats or (not ctx.feats[0] and not ctx.feats[1] and not ctx.feats[2]):
        ctx.feats = ()  # no feature: the backward op as before the features
    ctx.has_sink = sink is not None
    if ctx.has_sink:
        ctx.save_for_backward(q, k, v, o, lse, sink)
    else:
        ctx.save_for_backward(q, k, v, o, lse)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_o, grad_lse):
    if grad_o is None:
        return (None,) * (3 + ctx.n_args)
    if not ctx.has_sink:
        q, k, v, o, lse = ctx.saved_tensors
        if not ctx.feats:
            dq, dk, dv = torch.ops.attn_policy.attention_backward(grad_o, q, k, v, o, lse, *ctx.args)
        else:
            c, sm, pk, lq, lkv = ctx.feats
            dq, dk, dv = torch.ops.attn_policy.attention_backward(grad_o, q, k, v, o, lse, *ctx.args, c, sm,
                                                                  None, pk, lq, lkv)
        return (dq, dk, dv) + (None,) * ctx.n_args
    q, k, v, o, lse, sink = ctx.saved_tensors
    c, sm, pk, lq, lkv = ctx.feats
    dq, dk, dv, d_sink = torch.ops.attn_policy.attention_backward_sink(
        grad_o, q, k, v, o, lse, sink, *ctx.args, c, sm, pk, lq, lkv)
    grads = [None] * ctx.n_args
    grads[_N_OPTIONS + _SINK] = d_sink
    return (dq, dk, dv, *grads)


# Eager calls skip the dispatcher: the cached runner through an autograd Function.


class _Eager(torch.autograd.Function):
    """The op's forward and registered backward for an eager call, without the dispatcher:
    the cached runner's forward (saving Q, K, V, O and the LSE) and its backward."""

    @staticmethod
    def forward(ctx, q, k, v, runner):
        o, lse = runner.forward(q, k, v)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.runner = runner
        return o

    @staticmethod
    def backward(ctx, g):
        if _grad_enabled():
            # The executors' backward is not itself differentiable (`once_differentiable`,
            # without its wrapper's cost on every backward).
            raise PolicyError("attn_policy.torch.attention supports one backward: double backward (create_graph=True) is not supported")
        q, k, v, o, lse = ctx.saved_tensors
        if g.stride() != o.stride():
            # dO must have the strides of O.
            g = g.contiguous() if o.is_contiguous() else torch.empty_like(o).copy_(g)
        dq, dk, dv = ctx.runner.backward(g, q, k, v, o, lse)
        return dq, dk, dv, None


class _EagerSink(torch.autograd.Function):
    """As :class:`_Eager`, for a call with learnable sink logits: their gradient (in the
    sink's dtype) flows back too."""

    @staticmethod
    def forward(ctx, q, k, v, sink, runner):
        o, lse = runner.forward(q, k, v, sink)
        ctx.save_for_backward(q, k, v, o, lse, sink)
        ctx.runner = runner
        return o

    @staticmethod
    def backward(ctx, g):
        if _grad_enabled():
            raise PolicyError("attn_policy.torch.attention supports one backward: double backward (create_graph=True) is not supported")
        q, k, v, o, lse, sink = ctx.saved_tensors
        if g.stride() != o.stride():
            g = g.contiguous() if o.is_contiguous() else torch.empty_like(o).copy_(g)
        dq, dk, dv, d_sink = ctx.runner.backward(g, q, k, v, o, lse, sink)
        return dq, dk, dv, d_sink, None


# `Function.apply` without its Python wrapper (default-argument binding for `setup_context`,
# functorch handling): the direct path runs only where no functorch transform is active.
_eager_apply = super(torch.autograd.Function, _Eager).apply
_eager_sink_apply = _EagerSink.apply
_grad_enabled = torch.is_grad_enabled
