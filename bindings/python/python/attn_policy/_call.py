"""One call's parameters: the option values (layouts, diagonals), the native check of a call's
tensors before anything is decided or planned, the call's facts by TransformerEngine's names,
and :class:`_Call` (the parameters read from the tensors, with the executors' problem)."""

from __future__ import annotations

import math
import operator
from typing import Any, Dict, List, Optional, Tuple

import torch

from . import PolicyError, _native
from ._decision import InvalidInput
from ._tensors import _bhsd, _contiguous_strides, _lse_shape, _o_shape


# The padded layouts (4-D), and with them `thd` (index 3): packed sequences, `[tokens, heads,
# head dim]`, with `cu_seqlens` (attention() only: context parallelism takes the padded ones).
LAYOUTS = ("bhsd", "bshd", "sbhd")
ALL_LAYOUTS = LAYOUTS + ("thd",)
THD = 3
DIAGONALS = ("top_left", "bottom_right")
_ON_DECLINE = ("raise", "fallback")
PADDINGS = ("right", "left")
# The softmax kinds by TransformerEngine's names (`softmax_type`); the op takes the index.
SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")
LEARNABLE = 2
# Where a batch's sequences sit (the op's `packing`): 0 every sequence full length, 1 padded
# right, 2 padded left, 3 packed (`thd`); the native problem's names.
_PACKINGS = (None, "padded_right", "padded_left", "packed")
PACKED = 3
# A call's features after the options (the op's trailing arguments but the sink tensor):
# (softcap (0.0: none), softmax index, packing index, seqlens_q, seqlens_kv (tuples of ints)).
NO_FEATURES = (0.0, 0, 0, (), ())


# ---------------------------------------------------------------------------------------------
# The one check of a call's tensors, before any decision or plan, is native
# (`_native.check_tensors`, bindings/python/src/inputs.rs: the rules and their messages); every
# entry path calls it (eager calls, the op and its fake, the backward, the context-parallel
# shards). Python only reads what each argument is.


def _tensor_arg(name: str, t: Any, storage: bool = True) -> tuple:
    """What ``check_tensors`` reads of one argument: name, layout, device, dtype, shape,
    strides, storage offset, the storage's bytes (None where not read: a fake tensor, a
    subclass without a storage of its own) and the element size."""
    if not isinstance(t, torch.Tensor):
        raise InvalidInput(f"{name} must be a torch.Tensor; found {type(t).__name__}")
    if t.layout is not torch.strided:  # no strides to read
        return (name, str(t.layout), str(t.device), str(t.dtype), tuple(t.shape), (), 0, None, t.element_size())
    nbytes = None
    if storage:
        try:
            nbytes = t.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):
            # A tensor subclass without a storage of its own: the op's kernel gets the real
            # tensors and checks them.
            pass
    return (name, "torch.strided", str(t.device), str(t.dtype), tuple(t.shape), t.stride(), t.storage_offset(),
            nbytes, t.element_size())


def _check_inputs(q: Any, k: Any, v: Any, layout: int, storage: bool = True) -> None:
    """Refuses (``InvalidInput``, ``ShapeMismatch``) tensors that do not describe one call in
    ``layout`` (an index into ``LAYOUTS``): not tensors, not strided, not CPU/CUDA, not 4-D, a
    dtype other than fp16/bf16/fp32/fp64, dtypes or devices that differ, a zero-sized dim,
    batch / heads / sequence length / head dim that disagree (no broadcasting), query heads not
    a multiple of the KV heads and, with ``storage``, strides that reach outside a tensor's
    storage. Shapes only (``storage=False``) for fake tensors, which have none."""
    _native.check_tensors(layout, [_tensor_arg("q", q, storage), _tensor_arg("k", k, storage),
                                   _tensor_arg("v", v, storage)])


def _check_backward(g: Any, q, k, v, o: Any, lse: Any, layout: int, storage: bool = True) -> None:
    """``_check_inputs`` and the backward's own tensors: O and dO of the forward's O shape and
    dtype, the LSE ``[b, h_q, s_q]`` of ``lse_dtype``, all on Q's device, inside their storage."""
    _native.check_tensors(layout, [_tensor_arg(n, t, storage) for n, t in
                                   (("q", q), ("k", k), ("v", v), ("grad_out", g), ("out", o), ("lse", lse))])


def _check_storage(q, k, v) -> None:
    """Only that each one's strides fit inside its storage (a cached call: its key fixed the rest)."""
    _native.check_tensors(0, [_tensor_arg("q", q), _tensor_arg("k", k), _tensor_arg("v", v)], True)


# ---------------------------------------------------------------------------------------------
# One call's parameters, read from the tensors.


_LAYOUT_TE = {"bhsd": "bhsd_bhsd_bhsd", "bshd": "bshd_bshd_bshd", "sbhd": "sbhd_sbhd_sbhd", "thd": "thd_thd_thd"}
_DTYPE_NAMES = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
}
# The TE schema has no fp64: a float64 call is decided as fp32 (the widest dtype it knows) and
# says so in the decision's provenance; the reference then runs it in float64.
_FACT_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp32"}


class _Call:
    """The parameters of one call and its problem for the executors."""

    __slots__ = (
        "layout", "mask", "window_left", "window_right", "bottom_right", "scale", "dropout_p",
        "training", "device", "dtype", "b", "hq", "hkv", "sq", "skv", "dqk", "dv", "problem",
        "o_shape", "qkv_strides", "softcap", "softmax", "packing", "seqlens_q", "seqlens_kv",
        "lse_shape", "tokens_q", "tokens_kv",
    )

    def __init__(self, q, k, v, layout, mask, wl, wr, br, scale, dropout_p, training, softcap=0.0,
                 softmax=0, packing=0, seqlens_q=(), seqlens_kv=()):
        self.layout, self.mask, self.window_left, self.window_right = layout, mask, wl, wr
        self.bottom_right, self.scale, self.dropout_p, self.training = br, scale, dropout_p, training
        _check_inputs(q, k, v, layout)  # before any plan, whichever path made this call
        self.device, self.dtype = q.device, q.dtype
        (b, hq, sq, dqk), qs = _bhsd(q, layout)
        (_, hkv, skv, _), ks = _bhsd(k, layout)
        (_, _, _, dv), vs = _bhsd(v, layout)
        softcap, softmax, packing, lq, lkv = _check_features(layout, b, sq, skv, softcap, softmax, packing,
                                                             seqlens_q, seqlens_kv)
        self.softcap, self.softmax, self.packing, self.seqlens_q, self.seqlens_kv = softcap, softmax, packing, lq, lkv
        self.lse_shape = _lse_shape(q, layout)
        # Packed: the tensors hold `tokens` rows of one batch; the problem (and TE's facts) have
        # one batch entry per sequence and the longest sequence as its length.
        self.tokens_q, self.tokens_kv = (sq, skv) if packing == PACKED else (0, 0)
        if packing == PACKED:
            b, sq, skv = len(lq), max(max(lq), 1), max(max(lkv), 1)
        self.b, self.hq, self.hkv, self.sq, self.skv, self.dqk, self.dv = b, hq, hkv, sq, skv, dqk, dv
        # O is allocated contiguous in the call's layout; dQ/dK/dV take Q/K/V's strides.
        o_shape = _o_shape(q, v)
        self.o_shape = tuple(o_shape)
        self.qkv_strides = (q.stride(), k.stride(), v.stride())
        os_ = _contiguous_strides(o_shape)
        ostr = {0: (os_[0], os_[1], os_[2]), 1: (os_[0], os_[2], os_[1]), 2: (os_[1], os_[2], os_[0]),
                3: (0, os_[1], os_[0])}[layout]
        if not self.has_features:
            # (The signature of builds without the features' arguments, unchanged.)
            self.problem = _native.make_problem(
                _DTYPE_NAMES[q.dtype], (b, hq, hkv, sq, skv, dqk, dv), (qs, ks, vs, ostr),
                mask, wl, wr, br, scale, torch.are_deterministic_algorithms_enabled(),
            )
            return
        self.problem = _native.make_problem(
            _DTYPE_NAMES[q.dtype], (b, hq, hkv, sq, skv, dqk, dv), (qs, ks, vs, ostr),
            mask, wl, wr, br, scale, torch.are_deterministic_algorithms_enabled(),
            softcap if softcap else None, SOFTMAX_TYPES[softmax],
            (_PACKINGS[packing], list(lq), list(lkv)) if packing else None,
        )

    @property
    def has_features(self) -> bool:
        """Whether the call uses soft-capping, a sink or per-sequence lengths."""
        return bool(self.softcap) or self.softmax != 0 or self.packing != 0

    def features(self) -> List[str]:
        """The features the call uses, in words (for messages)."""
        out = []
        if self.softcap:
            out.append(f"logit soft-capping ({self.softcap})")
        if self.softmax:
            out.append(f"a {SOFTMAX_TYPES[self.softmax]} softmax sink")
        if self.packing:
            out.append({1: "a right-padded batch", 2: "a left-padded batch", 3: "packed THD sequences"}[self.packing])
        return out

    def config(self) -> Dict[str, Any]:
        """The call's facts by TransformerEngine's names (per-sequence lengths: the padding
        mask kinds; packed: ``thd_thd_thd``, sequences as the batch, the longest as
        ``max_seqlen_*``, the token counts as ``num_tokens_*``, no padding between them)."""
        kinds = ("padding", "padding_causal", "padding_causal_bottom_right") if self.packing else (
            "no_mask", "causal", "causal_bottom_right")
        mask = kinds[self.mask]
        window = te_window_fact(self.mask, self.window_left, self.window_right, self.sq, self.skv)
        return {
            "qkv_type": "Tensor",
            "qkv_dtype": _FACT_DTYPES[self.dtype],
            "qkv_layout": _LAYOUT_TE[ALL_LAYOUTS[self.layout]],
            "batch_size": self.b,
            "num_heads": self.hq,
            "num_gqa_groups": self.hkv,
            "max_seqlen_q": self.sq,
            "max_seqlen_kv": self.skv,
            "head_dim_qk": self.dqk,
            "head_dim_v": self.dv,
            "attn_mask_type": mask,
            "window_size": window,
            "bottom_right_diagonal": bool(self.bottom_right),
            "attention_dropout": float(self.dropout_p),
            "is_training": bool(self.training),
            "softmax_scale": float(self.scale),
            "fp8": False,
            "core_attention_bias_type": "no_bias",
            "softcap": float(self.softcap),
            "softmax_type": SOFTMAX_TYPES[self.softmax],
            "num_tokens_q": self.tokens_q,
            "num_tokens_kv": self.tokens_kv,
            "pad_between_seqs": False,
        }


def _with_features(base: tuple, softcap=0.0, softmax=0, packing=0, seqlens_q=(), seqlens_kv=()) -> tuple:
    """A call's arguments for the decision cache: the 11 options, and the features only where
    the call has any (so a call without them has the key it always had)."""
    if not softcap and not softmax and not packing and not seqlens_q and not seqlens_kv:
        return base
    return base + (float(softcap), int(softmax), int(packing), tuple(seqlens_q), tuple(seqlens_kv))


def _lengths(name: str, lens: Any) -> Tuple[int, ...]:
    try:
        out = tuple(operator.index(x) for x in lens)
    except TypeError:
        raise InvalidInput(f"{name} must be a sequence of ints; found {lens!r}") from None
    neg = [x for x in out if x < 0]
    if neg:
        raise InvalidInput(f"{name} has a negative length ({neg[0]}): {list(out)}")
    return out


def _check_features(layout: int, b: int, sq: int, skv: int, softcap, softmax, packing, seqlens_q,
                    seqlens_kv) -> Tuple[float, int, int, Tuple[int, ...], Tuple[int, ...]]:
    """The features normalised, or ``InvalidInput``: a finite soft-cap >= 0 (0: none), a
    softmax and a packing index, and lengths that fit the tensors (padded: ``b`` of them, each
    within ``0..s``; packed: one per sequence, summing to the tensors' tokens), so no executor
    reads past a tensor for a length it was told."""
    try:
        softcap = float(softcap)
    except (TypeError, ValueError):
        raise InvalidInput(f"softcap must be a float; found {softcap!r}") from None
    if not (math.isfinite(softcap) and softcap >= 0.0):
        raise InvalidInput(f"softcap must be finite and positive (None: no soft-capping); found {softcap}")
    if softmax not in (0, 1, 2):
        raise InvalidInput(f"softmax {softmax!r}: 0 (vanilla), 1 (off-by-one) or 2 (learnable)")
    if packing not in (0, 1, 2, 3):
        raise InvalidInput(f"packing {packing!r}: 0 (none), 1 (padded right), 2 (padded left) or 3 (packed)")
    lq, lkv = _lengths("seqlens_q", seqlens_q), _lengths("seqlens_kv", seqlens_kv)
    if (layout == THD) != (packing == PACKED):
        raise InvalidInput("the thd layout takes packed sequences (cu_seqlens_q / cu_seqlens_kv), and packed "
                           "sequences take the thd layout")
    if packing == 0:
        if lq or lkv:
            raise InvalidInput("sequence lengths given without a packing")
        return softcap, softmax, packing, lq, lkv
    if packing == PACKED:
        if not lq or len(lq) != len(lkv):
            raise InvalidInput(f"packed sequences need one query and one key length per sequence; found "
                               f"{len(lq)} and {len(lkv)}")
        for name, lens, t in (("q", lq, sq), ("kv", lkv, skv)):
            if sum(lens) != t:
                raise InvalidInput(f"cu_seqlens_{name} ends at {sum(lens)}, but the tensors hold {t} tokens "
                                   f"(it must end at t)")
        return softcap, softmax, packing, lq, lkv
    for name, lens, s in (("seqlens_q", lq, sq), ("seqlens_kv", lkv, skv)):
        if len(lens) != b:
            raise InvalidInput(f"{name} has {len(lens)} entries for a batch of {b}")
        over = [x for x in lens if x > s]
        if over:
            raise InvalidInput(f"{name} has a sequence of {over[0]} tokens, longer than the tensors' {s}")
    return softcap, softmax, packing, lq, lkv


def te_window_fact(mask: int, left: int, right: int, sq: int, skv: int) -> Optional[List[int]]:
    """The ``window_size`` fact of a call (mask 0 no mask, 1 causal, 2 causal bottom-right; -1:
    unbounded side). TransformerEngine takes a window without causality only with both sides
    bounded ((-1, -1) or both >= 0, its check_set_window_size), so an unbounded side of such a
    window is stated as ``sq + skv``: it admits every key under either diagonal (the same
    problem: the executors receive the -1), and the decision is made on facts TE accepts."""
    if mask != 0:
        return [left, 0] if left >= 0 else None
    if left < 0 and right < 0:
        return None
    unbounded = sq + skv
    return [left if left >= 0 else unbounded, right if right >= 0 else unbounded]


def _window_size(window: Any, x: Any) -> int:
    """One side of ``window``: None (unbounded, -1) or an int that fits the op's int64. A float
    or a bool is refused, not truncated (``2.5`` is no window size)."""
    if x is None:
        return -1
    if isinstance(x, bool) or isinstance(x, torch.Tensor):
        x = None  # refused below: a bool is not a size; a tensor's value lives on its device
    try:
        n = operator.index(x)
    except TypeError:
        raise InvalidInput(f"window must be None, an int or a (left, right) pair of ints or None "
                           f"(-1 or None: unbounded); found {window!r}") from None
    if not -(2**63) <= n < 2**63:
        raise InvalidInput(f"window {window!r}: a size must fit a 64-bit integer (-1 or None: unbounded)")
    return n


def _window_args(window, is_causal: bool) -> Tuple[int, int]:
    if window is None:
        return -1, (0 if is_causal else -1)
    if not isinstance(window, (tuple, list)):
        return _window_size(window, window), (0 if is_causal else -1)
    if len(window) != 2:
        raise InvalidInput(f"window must be None, an int or a (left, right) pair; found {len(window)} "
                           f"values {window!r}")
    left, right = _window_size(window, window[0]), _window_size(window, window[1])
    if is_causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def _flag(name: str, x: Any) -> bool:
    """A bool option (``is_causal``, ``no_substitute``, ``return_decision``): True, False, 1 or
    0. Anything else is refused rather than read by its truth value (``is_causal="no"`` is
    truthy; a tensor's truth value is read from its device)."""
    if x is True or x is False:
        return x
    if type(x) is int and x in (0, 1) or type(x).__module__ == "numpy" and type(x).__name__ in ("bool_", "bool"):
        return bool(x)
    raise InvalidInput(f"{name} must be True or False; found {type(x).__name__} {x!r}")


def _real(name: str, x: Any, what: str) -> float:
    """A float option (``scale``, ``dropout_p``, ``softcap``) as a float. A str or a bool is
    refused, not converted (``float("0.1")`` would read it)."""
    if not isinstance(x, (str, bytes, bool)):
        try:
            return float(x)
        except (TypeError, ValueError):
            pass
    raise InvalidInput(f"{name} must be {what}; found {type(x).__name__} {x!r}")


def _layout_index(layout: Any) -> int:
    if layout not in ALL_LAYOUTS:
        raise PolicyError(f"layout must be one of {', '.join(ALL_LAYOUTS)}, found {layout!r}")
    return ALL_LAYOUTS.index(layout)
