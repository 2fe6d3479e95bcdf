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
import operator
from typing import Any, List, Optional, Tuple, Union

import torch

from . import Decision, Policy, PolicyError, _native, eager_node  # noqa: F401
from ._model import ExecutorAttempt, Explanation, deprecated_alias  # noqa: F401
# Everything below was defined in this module before it was split, and stays importable from
# it (the private names too: tests and benchmarks reach some of them).
from ._autograd import _backward, _Eager, _eager_apply, _setup_context  # noqa: F401
from ._call import (  # noqa: F401
    _DTYPE_NAMES, _FACT_DTYPES, _LAYOUT_TE, _ON_DECLINE, ALL_LAYOUTS, DIAGONALS, LAYOUTS, PACKED, PADDINGS,
    SOFTMAX_TYPES, THD, _Call, _check_backward, _check_inputs, _check_storage, _flag, _layout_index, _real, _tensor_arg,
    _window_args, _with_features, te_window_fact,
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
from ._kernel_runners import _CudnnSdpaRunner, _EfficientRunner, _FlashRunner  # noqa: F401
from ._runners import (  # noqa: F401
    _F32, _NODE_ERRORS, _U8, _avail, _empty, _empty_strided, _mask_bool, _math_forward, _MathRunner,
    _NativeRunner, _no_stream, _raw_stream, _retyped, _Runner, _SdpaFallback, _through_node,
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
    softcap: Optional[float] = None,
    sink: Union[None, str, torch.Tensor] = None,
    seqlens_q: Any = None,
    seqlens_kv: Any = None,
    padding: str = "right",
    cu_seqlens_q: Any = None,
    cu_seqlens_kv: Any = None,
):
    """Scaled dot-product attention whose backend ``policy`` selects (default: the embedded
    ``te`` pack with live facts) and whose executor chain runs it.

    ``layout`` is stated, never inferred: ``"bhsd"`` (SDPA's order, the default), ``"bshd"``,
    ``"sbhd"``, or ``"thd"`` (packed sequences, ``[t, h, d]``, with ``cu_seqlens_q`` /
    ``cu_seqlens_kv``); any strides with a contiguous head dim are read in place. GQA/MQA by head counts
    (``h_q`` a multiple of ``h_kv``). ``is_causal`` with ``diagonal`` ``"top_left"`` (SDPA's) or
    ``"bottom_right"`` (FlashAttention's, for KV-cache decoding); ``window=(left, right)``
    keys around that diagonal (-1 or None: unbounded; an int is ``(left, -1)``). ``scale``
    defaults to ``1/sqrt(d)``. Returns O in ``layout`` (and the call's :class:`Explanation`
    when ``return_decision``). Raises :class:`AttentionDeclined` when nothing can run the call
    (``on_decline="fallback"``: torch SDPA instead, logged) and :class:`SubstitutionRefused`
    for a substitute executor with ``no_substitute=True``.

    Features (each one the decision's facts state by TransformerEngine's names, and the
    executors' manifests admit or refuse: a call no executor serves is declined with the
    reasons, never run without the feature; on the CPU the reference serves them all):

    - ``softcap``: a float > 0, logit soft-capping (``softcap * tanh(scale * q.k / softcap)``
      before the mask and softmax; fact ``softcap``).
    - ``sink``: ``"off_by_one"`` (a sink logit of 0 in every row's softmax denominator) or a
      ``[h_q]`` tensor of learnable sink logits (any float dtype, on the call's device; its
      gradient flows back through autograd in its dtype; executors compute with it in fp32).
      Fact ``softmax_type``: ``off-by-one`` / ``learnable``.
    - ``seqlens_q`` / ``seqlens_kv``: per-sequence lengths of a padded batch (lists of ints or
      integer tensors of ``[b]``, each within ``0..s``), the tokens of each sequence at the
      start (``padding="right"``) or at the end (``"left"``) of its rows. Giving one of them
      means the other is equal, which needs ``s_q == s_kv`` (else give both). The mask kinds
      apply in each sequence's own coordinates (``diagonal="bottom_right"`` sits at
      ``seqlens_kv[i] - seqlens_q[i]``). Padding query rows get ``O = 0`` and no gradient;
      padding keys get ``dK = dV = 0``. Facts: ``attn_mask_type`` ``padding``,
      ``padding_causal``, ``padding_causal_bottom_right``.
    - ``cu_seqlens_q`` / ``cu_seqlens_kv``: packed sequences (``layout="thd"``, q/k/v
      ``[t, h, d]``): ``[b + 1]`` cumulative offsets from 0, nondecreasing, ending at ``t``
      (one of them alone: the other is equal, which needs ``t_q == t_kv``). The LSE is
      ``[1, h_q, t_q]``. Facts: ``qkv_layout`` ``thd_thd_thd``, ``batch_size`` the sequences,
      ``max_seqlen_*`` the longest, ``num_tokens_*``, ``pad_between_seqs`` False.

    Lengths are read to the host once per call (the executors' problem holds them; the
    per-signature cache key includes them); wrong ones are refused with
    :class:`InvalidInput`, never read out of bounds. ``on_decline="fallback"`` does not
    apply to a call with features (torch SDPA computes none of them): it is declined.

    Under ``torch.compile`` (and with tensor subclasses, dispatch or function modes, functorch
    transforms) the call goes through ``torch.ops.attn_policy.attention``; in plain eager mode
    a signature seen before runs its cached plan directly (same executor, same results).

    Options of the wrong type or value are refused with :class:`InvalidInput` (or its base
    ``PolicyError``, a ``ValueError``) naming the option: a bool option given anything but
    True/False/1/0 (``is_causal="no"``, a tensor), a number given as a str, a float window
    size, ``policy`` that is not a :class:`attn_policy.Policy`."""
    # return_decision is not in the plan cache's key, so it is checked on every call; the other
    # options are checked on a miss (`_op_args`). Inline for True/False: this is the hit path.
    if return_decision is not True and return_decision is not False:
        return_decision = _flag("return_decision", return_decision)
    if (softcap is not None or sink is not None or seqlens_q is not None or seqlens_kv is not None
            or cu_seqlens_q is not None or cu_seqlens_kv is not None or padding != "right"):
        return _attention_features(q, k, v, layout, is_causal, diagonal, window, scale, dropout_p, policy,
                                   on_decline, no_substitute, return_decision, softcap, sink, seqlens_q,
                                   seqlens_kv, padding, cu_seqlens_q, cu_seqlens_kv)
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
        li = ALL_LAYOUTS.index(layout)
    except ValueError:
        raise PolicyError(f"layout must be one of {', '.join(ALL_LAYOUTS)}, found {layout!r}") from None
    if diagonal not in DIAGONALS:
        raise PolicyError(f"diagonal must be one of {', '.join(DIAGONALS)}, found {diagonal!r}")
    if on_decline not in _ON_DECLINE:
        raise PolicyError(f"on_decline must be one of {', '.join(_ON_DECLINE)}, found {on_decline!r}")
    is_causal, no_substitute = _flag("is_causal", is_causal), _flag("no_substitute", no_substitute)
    if policy is not None and not isinstance(policy, Policy):
        raise InvalidInput(f"policy must be an attn_policy.Policy (attn_policy.Policy.load({policy!r}) "
                           f"loads one) or None; found {type(policy).__name__} {policy!r}"
                           if isinstance(policy, str) else
                           f"policy must be an attn_policy.Policy or None; found {type(policy).__name__}")
    if scale is not None:
        scale = _real("scale", scale, "a float > 0 or None (1/sqrt(head dim))")
    dropout_p = _real("dropout_p", dropout_p, "a float in [0, 1)")
    if math.isnan(dropout_p):
        raise InvalidInput("dropout_p must be a float in [0, 1); found nan")
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


def _host_ints(*xs: Any) -> List[Optional[List[int]]]:
    """Lists of ints from lists or 1-D integer tensors (None stays None): the tensors read to
    the host together, once."""
    out: List[Any] = list(xs)
    tensors = [i for i, x in enumerate(xs) if isinstance(x, torch.Tensor)]
    for i in tensors:
        t = xs[i]
        if t.dim() != 1 or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise InvalidInput(f"lengths must be a 1-D integer tensor or a list of ints; found {t.dtype} "
                               f"of shape {tuple(t.shape)}")
    if tensors:
        dev = xs[tensors[0]].device
        if all(xs[i].device == dev for i in tensors):
            flat = torch.cat([xs[i].to(torch.int64) for i in tensors]).tolist()  # one host read
            at = 0
            for i in tensors:
                n = xs[i].numel()
                out[i], at = flat[at:at + n], at + n
        else:
            for i in tensors:
                out[i] = xs[i].tolist()
    for i, x in enumerate(out):
        if x is None or i in tensors:
            continue
        try:
            out[i] = [operator.index(n) for n in x]
        except TypeError:
            raise InvalidInput(f"lengths must be a 1-D integer tensor or a list of ints; found {x!r}") from None
    return out


def _features(q, k, li: int, softcap, sink, seqlens_q, seqlens_kv, padding, cu_seqlens_q, cu_seqlens_kv):
    """(softcap, softmax index, the sink tensor or None, packing index, seqlens_q, seqlens_kv)
    of a call's feature arguments, checked against the tensors (``InvalidInput``)."""
    if padding not in PADDINGS:
        raise PolicyError(f"padding must be one of {', '.join(PADDINGS)}, found {padding!r}")
    (b, hq, sq, _), _ = _bhsd(q, li)
    if softcap is None:
        cap = 0.0
    else:
        cap = _real("softcap", softcap, "a float > 0 or None")
        if not (math.isfinite(cap) and cap > 0.0):
            raise InvalidInput(f"softcap must be a finite float > 0 (None: no soft-capping); found {softcap!r}")
    sink_t = None
    if sink is None:
        softmax = 0
    elif isinstance(sink, str):
        if sink not in ("off_by_one", "off-by-one"):
            raise InvalidInput(f"sink must be None, 'off_by_one' or a [h_q] tensor of sink logits; found {sink!r}")
        softmax = 1
    elif isinstance(sink, torch.Tensor):
        if tuple(sink.shape) != (hq,) or not sink.is_floating_point() or sink.device != q.device:
            raise InvalidInput(f"sink must be a floating-point [{hq}] tensor (h_q) on {q.device}; found "
                               f"{sink.dtype} {tuple(sink.shape)} on {sink.device}")
        softmax, sink_t = 2, sink
    else:
        raise InvalidInput(f"sink must be None, 'off_by_one' or a [h_q] tensor; found {type(sink).__name__}")
    packed = cu_seqlens_q is not None or cu_seqlens_kv is not None
    padded = seqlens_q is not None or seqlens_kv is not None
    if packed and padded:
        raise InvalidInput("give either seqlens_q / seqlens_kv (a padded batch) or cu_seqlens_q / cu_seqlens_kv "
                           "(packed sequences), not both")
    if packed != (li == THD):
        raise InvalidInput("packed sequences (cu_seqlens_q / cu_seqlens_kv) take layout 'thd', and layout 'thd' "
                           "takes cu_seqlens_q / cu_seqlens_kv")
    if padding != "right" and not padded:
        raise InvalidInput(f"padding={padding!r} applies to seqlens_q / seqlens_kv, and none is given")
    if not packed and not padded:
        return cap, softmax, sink_t, 0, (), ()
    (_, _, skv, _), _ = _bhsd(k, li)
    if packed:
        cq, ckv = _host_ints(cu_seqlens_q, cu_seqlens_kv)
        if cq is None or ckv is None:
            if sq != skv:
                raise InvalidInput(f"give both cu_seqlens_q and cu_seqlens_kv: q holds {sq} tokens, k {skv}")
            cq = ckv = cq if cq is not None else ckv
        lens = []
        for name, cu, t in (("cu_seqlens_q", cq, sq), ("cu_seqlens_kv", ckv, skv)):
            if len(cu) < 2 or cu[0] != 0:
                raise InvalidInput(f"{name} must hold b + 1 >= 2 offsets starting at 0; found {cu}")
            steps = [y - x for x, y in zip(cu, cu[1:])]
            if any(d < 0 for d in steps):
                raise InvalidInput(f"{name} must not decrease; found {cu}")
            if cu[-1] != t:
                raise InvalidInput(f"{name} must end at t = {t} (the tokens of the tensors); it ends at {cu[-1]}")
            lens.append(tuple(steps))
        if len(lens[0]) != len(lens[1]):
            raise InvalidInput(f"cu_seqlens_q and cu_seqlens_kv describe {len(lens[0])} and {len(lens[1])} sequences")
        return cap, softmax, sink_t, PACKED, lens[0], lens[1]
    lq, lkv = _host_ints(seqlens_q, seqlens_kv)
    if lq is None or lkv is None:
        if sq != skv:
            raise InvalidInput(f"give both seqlens_q and seqlens_kv when s_q != s_kv ({sq} vs {skv})")
        lq = lkv = lq if lq is not None else lkv
    for name, lens, s_ in (("seqlens_q", lq, sq), ("seqlens_kv", lkv, skv)):
        if len(lens) != b:
            raise InvalidInput(f"{name} has {len(lens)} entries for a batch of {b}")
        bad = [n for n in lens if n < 0 or n > s_]
        if bad:
            raise InvalidInput(f"{name} has a length {bad[0]} outside 0..{s_}: {lens}")
    return cap, softmax, sink_t, 1 if padding == "right" else 2, tuple(lq), tuple(lkv)


def _attention_features(q, k, v, layout, is_causal, diagonal, window, scale, dropout_p, policy, on_decline,
                        no_substitute, return_decision, softcap, sink, seqlens_q, seqlens_kv, padding,
                        cu_seqlens_q, cu_seqlens_kv):
    """A call with features: checked, its lengths read to the host, then decided (cached per
    signature, lengths included) and run through the Python autograd Function (eager) or the
    op (compiling, tensor subclasses, modes)."""
    li = _layout_index(layout)
    if not _is_compiling():
        # (While tracing, the op's fake checks the shapes: nothing here is traced into the graph.)
        _check_inputs(q, k, v, li)
    cap, softmax, sink_t, packing, lq, lkv = _features(q, k, li, softcap, sink, seqlens_q, seqlens_kv, padding,
                                                       cu_seqlens_q, cu_seqlens_kv)
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                        or (sink_t is not None and sink_t.requires_grad))
    base = _op_args(q, layout, is_causal, diagonal, window, scale, dropout_p, policy, on_decline, no_substitute,
                    grad)
    qu, ku, vu = _usable(q), _usable(k), _usable(v)
    args = _with_features(base, cap, softmax, packing, lq, lkv)
    plain = (not _is_compiling() and type(q) is _Tensor and type(k) is _Tensor and type(v) is _Tensor
             and (sink_t is None or type(sink_t) is _Tensor) and not _dispatch_modes() and not _function_modes()
             and _functorch_transform() is None)
    if not plain:
        o, _ = torch.ops.attn_policy.attention(qu, ku, vu, *base, cap, softmax, sink_t, packing, list(lq), list(lkv))
        return (o, _entry(qu, ku, vu, args).decision) if return_decision else o
    e = _entry(qu, ku, vu, args)
    if e.runner is None:
        _raise_for(e, no_substitute)
    r = e.runner
    if sink_t is None:
        o = r.apply(qu, ku, vu) if grad else r.output(qu, ku, vu)
    else:
        o = r.apply_sink(qu, ku, vu, sink_t) if grad else r.forward(qu, ku, vu, sink_t)[0]
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
        dims = tuple(kv_channels) if isinstance(kv_channels, (tuple, list)) else (kv_channels, kv_channels)
        for name, value, ns in (("num_attention_heads", num_attention_heads, (num_attention_heads,)),
                                ("num_gqa_groups", num_gqa_groups, (1 if num_gqa_groups is None else num_gqa_groups,)),
                                ("kv_channels", kv_channels, dims if len(dims) == 2 else (None,))):
            if any(type(n) is not int or n <= 0 for n in ns):
                pair = " (or a pair (qk, v) of them)" if name == "kv_channels" else ""
                raise PolicyError(f"DotProductAttention: {name} must be an int > 0{pair}; found {value!r}")
        if num_gqa_groups and num_attention_heads % num_gqa_groups:
            raise PolicyError(f"DotProductAttention: num_attention_heads ({num_attention_heads}) is not a multiple "
                              f"of num_gqa_groups ({num_gqa_groups})")
        self._mask(attn_mask_type)  # a mask kind the forward would refuse, refused here
        self._dims = tuple(dims)
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
        # Like TE: the tensors must have the heads and head dims the module was built with (run
        # with the tensors' own, a model's wiring mistake would pass unnoticed).
        hd = 1 if fmt == "bhsd" else 2
        want = ((self.num_attention_heads, self._dims[0]), (self.num_gqa_groups, self._dims[0]),
                (self.num_gqa_groups, self._dims[1]))
        for name, t, (h, d) in zip(("query_layer", "key_layer", "value_layer"), (query_layer, key_layer, value_layer),
                                   want):
            if isinstance(t, torch.Tensor) and t.dim() == 4 and (t.shape[hd], t.shape[3]) != (h, d):
                raise InvalidInput(f"DotProductAttention: {name} has {t.shape[hd]} heads of dim {t.shape[3]} "
                                   f"(shape {tuple(t.shape)}, {fmt}); the module was built for {h} heads of dim {d} "
                                   "(num_attention_heads / num_gqa_groups, kv_channels)")
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
