"""Autograd glue of :func:`attn_policy.torch.attention`: the op's registered formula (the forward
saves Q, K, V, O and the LSE; the backward calls ``attention_backward``), registered by
:mod:`attn_policy._op`, and the ``torch.autograd.Function`` an eager call runs through without
the dispatcher (where the C++ eager node is not used)."""

from __future__ import annotations

import torch

from . import PolicyError


def _setup_context(ctx, inputs, output):
    q, k, v = inputs[0], inputs[1], inputs[2]
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.args = tuple(inputs[3:])
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_o, grad_lse):
    q, k, v, o, lse = ctx.saved_tensors
    if grad_o is None:
        return (None,) * (3 + len(ctx.args))
    dq, dk, dv = torch.ops.attn_policy.attention_backward(grad_o, q, k, v, o, lse, *ctx.args)
    return (dq, dk, dv) + (None,) * len(ctx.args)


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


# `Function.apply` without its Python wrapper (default-argument binding for `setup_context`,
# functorch handling): the direct path runs only where no functorch transform is active.
_eager_apply = super(torch.autograd.Function, _Eager).apply
_grad_enabled = torch.is_grad_enabled
