"""Attention as a PyTorch op whose backend a policy chooses and whose executor says what ran.

    import attn_policy.torch as apt
    o = apt.attention(q, k, v, layout="bshd", is_causal=True)          # O, like SDPA
    o, d = apt.attention(q, k, v, return_decision=True)                # and its Explanation

``attention`` is a real ``torch.library`` op (``torch.ops.attn_policy.attention``): it has a fake
implementation for shapes and a registered autograd formula (the forward saves O and the
log-sum-exp, the backward calls the executor's backward), so ``torch.compile(fullgraph=True)``
traces it without graph breaks and ``torch.library.opcheck`` passes. In eager mode (plain
tensors, no dispatch or function mode, no functorch transform, not compiling) a call whose
signature was seen before skips the dispatcher: the cached plan runs through an autograd node
(the same executor calls, the same results), which costs less host time per call (see
``bindings/python/bench/overhead.py``): the C++ node of :mod:`attn_policy.eager_node`, compiled
against this torch on first use, or the Python ``torch.autograd.Function`` where it cannot be
built (``ATTN_POLICY_EAGER_NODE`` chooses).

What happens on a call (once per input signature; later calls with the same shapes, strides,
dtype, device and options reuse the result, see :func:`cache_info`):

1. The policy (default: the embedded ``te`` pack) decides with the call's facts and the live
   facts of this process (compute capability of the tensors' device, the cuDNN torch loaded,
   installed flash-attn / TE / cuDNN-frontend versions, the deterministic flag, ``NVTE_*``).
   A probe that cannot be answered stays unknown.
2. The selected backend's executor chain, as the pack declares it (``executors:`` in
   pack.yaml, :func:`executor_chain`), is walked by the CLI's own walk
   (``_native.walk_chain``): the first entry whose checks and plan pass runs; a refusal, an
   unavailable executor or a failed check or plan moves on, and every entry's outcome
   (``ran``, ``refused``, ``unavailable``, ``failed``, ``not_tried``, with the reason) is
   recorded in the decision. Running any entry but the first is a substitution, logged once
   per call signature at WARNING and reported, never silent; ``no_substitute=True`` makes it
   an error (docs/executors.md, "the rule for what does not run").
3. CPU tensors run the float64 reference on their memory (fp16, bf16, fp32, fp64). CUDA
   tensors run the GPU executors on ``torch.cuda.current_stream()`` with outputs and
   workspace from torch's allocator: no synchronisation, no host round trip, so a warmed-up
   call can be captured in a ``torch.cuda.CUDAGraph``.

A call no executor serves (dropout today) is declined with the reasons:
``on_decline="raise"`` raises :class:`AttentionDeclined`; ``"fallback"`` runs
``torch.nn.functional.scaled_dot_product_attention`` instead and logs why.

The machinery lives in private modules this one imports (one way; see docs/architecture.md):
``_call`` (a call's parameters and the native input check), ``_facts`` (live facts and
probes), ``_executors`` and ``_runners`` (the torch-side executors and what each runs),
``_chain`` (the chain walk and the per-signature cache), ``_autograd`` and ``_op`` (the
``torch.library`` op); this module holds the public entry points and re-exports the rest.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Optional, Tuple, Union

import torch

from . import Decision, Policy, PolicyError, _native, eager_node  # noqa: F401
from ._model import ExecutorAttempt, Explanation, deprecated_alias  # noqa: F401
# Everything below was defined in this module before it was split, and stays importable from
# it (the private names too: tests and benchmarks reach some of them).
from ._autograd import _backward, _Eager, _eager_apply, _setup_context  # noqa: F401
from ._call import (  # noqa: F401
    _DTYPE_NAMES, _FACT_DTYPES, _LAYOUT_TE, _ON_DECLINE, DIAGONALS, LAYOUTS, _Call, _check_backward,
    _check_inputs, _check_storage, _layout_index, _tensor_arg, _window_args, te_window_fact,
)
from ._chain import (  # noqa: F401
    _CACHE_CAP, _cache, _cache_lock, _decide, _Entry, _entry, _fast, _key, _packs, _policies,
    _policies_lock, _policy_id, _policy_ids, _policy_of, _raise_for, _runner_for, _stats, cache_info,
    clear_cache, executor_chain,
)
from ._decision import (  # noqa: F401
    AttentionDeclined, InvalidInput, ShapeMismatch, SubstitutionRefused,
)
from ._executors import (  # noqa: F401
    _TORCH_EXECUTORS, _aten, _frost_unavailable, _register_host_executors, _TorchCudnn,
    _TorchEfficient, _TorchExecutor, _TorchFlash, _TorchMath, executors,
)
from ._facts import _cudnn_fact, _device_facts, _facts_lock, _live_probes, live_facts  # noqa: F401
# The op (torch.ops.attn_policy.attention), defined on import of attn_policy._op.
from ._op import _ARGS, _bwd_fake, _bwd_impl, _fwd_fake, _fwd_impl, _lib  # noqa: F401
from ._runners import (  # noqa: F401
    _F32, _NODE_ERRORS, _U8, _avail, _CudnnSdpaRunner, _EfficientRunner, _empty, _empty_strided,
    _FlashRunner, _mask_bool, _math_forward, _MathRunner, _NativeRunner, _no_stream, _raw_stream,
    _retyped, _Runner, _SdpaFallback, _through_node,
)
from ._tensors import (  # noqa: F401
    _bhsd, _contiguous_strides, _from_bhsd, _from_bshd, _into_layout, _like, _o_shape, _restrided,
    _restrided_bshd, _to_bhsd, _to_bshd, _usable, lse_dtype,
)
# PyTorch's own SDPA choice explained by the `torch` pack (attn_policy/sdpa.py).
from .sdpa import SdpaError, explain_sdpa, log_sdpa_decisions  # noqa: F401


__all__ = [
    "attention",
    "DotProductAttention",
    "AttentionDeclined",
    "SubstitutionRefused",
    "InvalidInput",
    "ShapeMismatch",
    "Explanation",
    "ExecutorAttempt",
    "executor_chain",
    "executors",
    "live_facts",
    "cache_info",
    "clear_cache",
    "explain_sdpa",
    "log_sdpa_decisions",
    "SdpaError",
    "lse_dtype",
    "cp_attention",
    "shard_sequence",
    "unshard_sequence",
    "ContextParallelDeclined",
    "ShardMismatch",
]

logger = logging.getLogger("attn_policy.torch")


# The eager path's checks, bound once (its autograd Function is attn_policy._autograd's).
_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_deterministic = torch.are_deterministic_algorithms_enabled
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._len_torch_function_stack
_functorch_transform = torch._C._functorch.peek_interpreter_stack


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
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
    """Scaled dot-product attention whose backend ``policy`` selects (default: the embedded
    ``te`` pack with live facts) and whose executor chain runs it.

    ``layout`` is stated, never inferred: ``"bhsd"`` (SDPA's order, the default), ``"bshd"`` or
    ``"sbhd"``; any strides with a contiguous head dim are read in place. GQA/MQA by head counts
    (``h_q`` a multiple of ``h_kv``). ``is_causal`` with ``diagonal`` ``"top_left"`` (SDPA's) or
    ``"bottom_right"`` (FlashAttention's, for KV-cache decoding); ``window=(left, right)``
    keys around that diagonal (-1 or None: unbounded; an int is ``(left, -1)``). ``scale``
    defaults to ``1/sqrt(d)``. Returns O in ``layout`` (and the call's :class:`Explanation`
    when ``return_decision``). Raises :class:`AttentionDeclined` when nothing can run the call
    (``on_decline="fallback"``: torch SDPA instead, logged) and :class:`SubstitutionRefused`
    for a substitute executor with ``no_substitute=True``.

    Under ``torch.compile`` (and with tensor subclasses, dispatch or function modes, functorch
    transforms) the call goes through ``torch.ops.attn_policy.attention``; in plain eager mode
    a signature seen before runs its cached plan directly (same executor, same results)."""
    if _is_compiling():
        return _attention_op(q, k, v, layout, is_causal, diagonal, window, scale, dropout_p, policy,
                             on_decline, no_substitute, return_decision)
    try:
        grad = _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
               q.device, k.device, v.device, grad, _deterministic(), layout, is_causal, diagonal, window,
               scale, dropout_p, policy, on_decline, no_substitute)
        hit = _fast.get(key)
    except (TypeError, AttributeError):  # an unhashable option (a list window), or not tensors
        key = hit = None
        grad = False  # not read: what is not a tensor is refused before
    if (hit is None or type(q) is not _Tensor or type(k) is not _Tensor or type(v) is not _Tensor
            or _dispatch_modes() or _function_modes() or _functorch_transform() is not None):
        return _attention_first(q, k, v, key, grad, layout, is_causal, diagonal, window, scale, dropout_p,
                                policy, on_decline, no_substitute, return_decision)
    _stats["hits"] += 1
    runner, decision, copy = hit
    if copy or not runner.checks_storage:
        # The key fixed shapes and strides, not the storage behind them: a native plan checks
        # the pointers it reads, but not the tensors a copy is made from (torch reads them).
        _check_storage(q, k, v)
    if copy:
        q, k, v = _usable(q), _usable(k), _usable(v)
    o = runner.apply(q, k, v) if grad else runner.output(q, k, v)
    return (o, decision) if return_decision else o


def _op_args(q, layout, is_causal, diagonal, window, scale, dropout_p, policy, on_decline, no_substitute, training):
    """The op's arguments after the checks (bad options are ``PolicyError``s)."""
    try:
        li = LAYOUTS.index(layout)
    except ValueError:
        raise PolicyError(f"layout must be one of {', '.join(LAYOUTS)}, found {layout!r}") from None
    if diagonal not in DIAGONALS:
        raise PolicyError(f"diagonal must be one of {', '.join(DIAGONALS)}, found {diagonal!r}")
    if on_decline not in _ON_DECLINE:
        raise PolicyError(f"on_decline must be one of {', '.join(_ON_DECLINE)}, found {on_decline!r}")
    br = diagonal == "bottom_right"
    mask = (2 if br else 1) if is_causal else 0
    wl, wr = _window_args(window, is_causal)
    if scale is None:
        # (A zero-sized head dim is refused by the op's checks; none is divided by here.)
        scale = 1.0 / math.sqrt(q.shape[-1]) if q.shape[-1] else 1.0
    od = 1 if on_decline == "fallback" else 0
    return (li, mask, wl, wr, br, float(scale), float(dropout_p), training, _policy_id(policy), od, bool(no_substitute))


def _attention_op(q, k, v, layout, is_causal, diagonal, window, scale, dropout_p, policy, on_decline,
                  no_substitute, return_decision):
    """The call through ``torch.ops.attn_policy.attention`` (traced by ``torch.compile``)."""
    if not _is_compiling():
        # (While tracing, the op's fake checks the shapes: nothing here is traced into the graph.)
        _check_inputs(q, k, v, _layout_index(layout))
    q, k, v = (_usable(t) for t in (q, k, v))
    training = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    args = _op_args(q, layout, is_causal, diagonal, window, scale, dropout_p, policy, on_decline,
                    no_substitute, training)
    o, _ = torch.ops.attn_policy.attention(q, k, v, *args)
    if not return_decision:
        return o
    return o, _entry(q, k, v, args).decision


def _attention_first(q, k, v, key, grad, layout, is_causal, diagonal, window, scale, dropout_p, policy,
                     on_decline, no_substitute, return_decision):
    """An eager call not seen before (or one the direct path does not take): decided and
    planned, remembered for the next call with the same key, then run."""
    plain = (type(q) is _Tensor and type(k) is _Tensor and type(v) is _Tensor and not _dispatch_modes()
             and not _function_modes() and _functorch_transform() is None)
    if not plain:
        return _attention_op(q, k, v, layout, is_causal, diagonal, window, scale, dropout_p, policy,
                             on_decline, no_substitute, return_decision)
    _check_inputs(q, k, v, _layout_index(layout))
    args = _op_args(q, layout, is_causal, diagonal, window, scale, dropout_p, policy, on_decline,
                    no_substitute, grad)
    qu, ku, vu = _usable(q), _usable(k), _usable(v)
    e = _entry(qu, ku, vu, args)
    if e.runner is None:
        _raise_for(e, no_substitute)
    if key is not None:
        with _cache_lock:
            if len(_fast) >= _CACHE_CAP:
                _fast.clear()
            _fast[key] = (e.runner, e.decision, qu is not q or ku is not k or vu is not v)
    o = e.runner.apply(qu, ku, vu) if grad else e.runner.output(qu, ku, vu)
    return (o, e.decision) if return_decision else o


class DotProductAttention(torch.nn.Module):
    """Mirrors TransformerEngine's ``DotProductAttention``: constructor ``(num_attention_heads,
    kv_channels, num_gqa_groups=None, attention_dropout=0.0, qkv_format="sbhd",
    attn_mask_type="causal", window_size=None, softmax_scale=None, ...)`` and ``forward(query,
    key, value, attn_mask_type=None, window_size=None)`` returning ``[s, b, h*d]`` for
    ``sbhd`` (``[b, s, h*d]`` for ``bshd``), like TE. Dense masks are not taken (TE's
    ``attention_mask``): mask kinds only."""

    def __init__(
        self,
        num_attention_heads: int,
        kv_channels: Union[int, Tuple[int, int]],
        num_gqa_groups: Optional[int] = None,
        attention_dropout: float = 0.0,
        qkv_format: str = "sbhd",
        attn_mask_type: str = "causal",
        window_size: Optional[Tuple[int, int]] = None,
        softmax_scale: Optional[float] = None,
        policy: Optional[Policy] = None,
        on_decline: str = "raise",
        no_substitute: bool = False,
        **unsupported: Any,
    ):
        super().__init__()
        known_noops = {"layer_number", "attention_type", "tp_size", "tp_group", "get_rng_state_tracker", "sequence_parallel"}
        bad = sorted(k for k in unsupported if k not in known_noops)
        if bad:
            raise PolicyError(f"DotProductAttention: arguments not supported here: {', '.join(bad)}")
        if qkv_format not in ("sbhd", "bshd", "bhsd"):
            raise PolicyError(f"qkv_format {qkv_format!r}: sbhd, bshd or bhsd (thd is not supported)")
        self.num_attention_heads = num_attention_heads
        self.kv_channels = kv_channels
        self.num_gqa_groups = num_gqa_groups or num_attention_heads
        self.attention_dropout = attention_dropout
        self.qkv_format = qkv_format
        self.attn_mask_type = attn_mask_type
        self.window_size = window_size
        self.softmax_scale = softmax_scale
        self.policy = policy
        self.on_decline = on_decline
        self.no_substitute = no_substitute

    @staticmethod
    def _mask(kind: str) -> Tuple[bool, str]:
        table = {
            "no_mask": (False, "top_left"),
            "causal": (True, "top_left"),
            "causal_bottom_right": (True, "bottom_right"),
        }
        if kind not in table:
            raise PolicyError(
                f"attn_mask_type {kind!r} is not supported (no_mask, causal, causal_bottom_right; padding masks need per-sequence lengths)"
            )
        return table[kind]

    def forward(
        self,
        query_layer: torch.Tensor,
        key_layer: torch.Tensor,
        value_layer: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        qkv_format: Optional[str] = None,
        attn_mask_type: Optional[str] = None,
        window_size: Optional[Tuple[int, int]] = None,
    ) -> torch.Tensor:
        if attention_mask is not None:
            raise PolicyError("dense attention masks are not supported: pass attn_mask_type")
        fmt = qkv_format or self.qkv_format
        causal, diagonal = self._mask(attn_mask_type or self.attn_mask_type)
        window = window_size if window_size is not None else self.window_size
        o = attention(
            query_layer, key_layer, value_layer, layout=fmt, is_causal=causal, diagonal=diagonal,
            window=window, scale=self.softmax_scale,
            dropout_p=self.attention_dropout if self.training else 0.0,
            policy=self.policy, on_decline=self.on_decline, no_substitute=self.no_substitute,
        )
        if fmt == "bhsd":
            return o
        return o.reshape(*o.shape[:2], -1)


# Context parallelism (the sequence sharded across a process group) on top of the op, in
# attn_policy.context_parallel (imported on first use: it imports torch.distributed).
_CP_NAMES = frozenset({"cp_attention", "shard_sequence", "unshard_sequence", "ContextParallelDeclined",
                       "ShardMismatch"})
# The classes Explanation replaces, deprecated (importable for one release).
_DEPRECATED = ("CallDecision", "ChainEntry", "SdpaDecision", "CPDecision")


def __getattr__(name: str) -> Any:
    if name in _CP_NAMES:
        from . import context_parallel

        return getattr(context_parallel, name)
    return deprecated_alias(__name__, name, _DEPRECATED)
