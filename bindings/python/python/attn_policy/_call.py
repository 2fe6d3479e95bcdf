"""One call's parameters: the option values (layouts, diagonals), the native check of a call's
tensors before anything is decided or planned, the call's facts by TransformerEngine's names,
and :class:`_Call` (the parameters read from the tensors, with the executors' problem)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from . import PolicyError, _native
from ._decision import InvalidInput
from ._tensors import _bhsd, _contiguous_strides, _o_shape


LAYOUTS = ("bhsd", "bshd", "sbhd")
DIAGONALS = ("top_left", "bottom_right")
_ON_DECLINE = ("raise", "fallback")


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


_LAYOUT_TE = {"bhsd": "bhsd_bhsd_bhsd", "bshd": "bshd_bshd_bshd", "sbhd": "sbhd_sbhd_sbhd"}
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
        "o_shape", "qkv_strides",
    )

    def __init__(self, q, k, v, layout, mask, wl, wr, br, scale, dropout_p, training):
        self.layout, self.mask, self.window_left, self.window_right = layout, mask, wl, wr
        self.bottom_right, self.scale, self.dropout_p, self.training = br, scale, dropout_p, training
        _check_inputs(q, k, v, layout)  # before any plan, whichever path made this call
        self.device, self.dtype = q.device, q.dtype
        (b, hq, sq, dqk), qs = _bhsd(q, layout)
        (_, hkv, skv, _), ks = _bhsd(k, layout)
        (_, _, _, dv), vs = _bhsd(v, layout)
        self.b, self.hq, self.hkv, self.sq, self.skv, self.dqk, self.dv = b, hq, hkv, sq, skv, dqk, dv
        # O is allocated contiguous in the call's layout; dQ/dK/dV take Q/K/V's strides.
        o_shape = _o_shape(q, v)
        self.o_shape = tuple(o_shape)
        self.qkv_strides = (q.stride(), k.stride(), v.stride())
        os_ = _contiguous_strides(o_shape)
        ostr = {0: (os_[0], os_[1], os_[2]), 1: (os_[0], os_[2], os_[1]), 2: (os_[1], os_[2], os_[0])}[layout]
        self.problem = _native.make_problem(
            _DTYPE_NAMES[q.dtype], (b, hq, hkv, sq, skv, dqk, dv), (qs, ks, vs, ostr),
            mask, wl, wr, br, scale, torch.are_deterministic_algorithms_enabled(),
        )

    def config(self) -> Dict[str, Any]:
        """The call's facts by TransformerEngine's names."""
        mask = ("no_mask", "causal", "causal_bottom_right")[self.mask]
        window = te_window_fact(self.mask, self.window_left, self.window_right, self.sq, self.skv)
        return {
            "qkv_type": "Tensor",
            "qkv_dtype": _FACT_DTYPES[self.dtype],
            "qkv_layout": _LAYOUT_TE[LAYOUTS[self.layout]],
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
        }


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


def _window_args(window, is_causal: bool) -> Tuple[int, int]:
    if window is None:
        return -1, (0 if is_causal else -1)
    if isinstance(window, int):
        return int(window), (0 if is_causal else -1)
    left, right = window
    left = -1 if left is None else int(left)
    right = -1 if right is None else int(right)
    if is_causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def _layout_index(layout: Any) -> int:
    if layout not in LAYOUTS:
        raise PolicyError(f"layout must be one of {', '.join(LAYOUTS)}, found {layout!r}")
    return LAYOUTS.index(layout)
