"""Which backend PyTorch's ``scaled_dot_product_attention`` picks on CUDA, and why.

    >>> from attn_policy.sdpa import explain_sdpa      # re-exported as attn_policy.torch.explain_sdpa
    >>> d = explain_sdpa(q, k, v, is_causal=True)      # live CUDA tensors; no kernel runs
    >>> d.selected                                     # what torch._fused_sdp_choice returns
    'flash'
    >>> print(d.explain())                             # every backend, every rule that declined it

The decision comes from the ``torch`` rule pack (PyTorch 2.11's checks in ``sdp_utils.cpp``,
see docs/packs/torch.md). ``explain_sdpa`` reads the tensors (dtype, shape, strides,
requires_grad, nesting), the mask, the arguments and the process state that PyTorch reads:
``torch.backends.cuda.*_sdp_enabled()``, deterministic algorithms, grad mode, the two
``TORCH_CUDNN_SDPA_*`` environment variables, the device's compute capability and cuDNN's
version. Tensors on the CPU (or anywhere) can be explained *as if* on a GPU by passing ``sm``
and ``cudnn`` explicitly; other facts can be overridden by keyword (``flash_sdp_enabled=False``).

Logging the decision of every SDPA call of a model
--------------------------------------------------

``log_sdpa_decisions()`` wraps ``torch.nn.functional.scaled_dot_product_attention`` for the
duration of a ``with`` block; each call is explained first (no kernel runs for the
explanation), then runs unchanged::

    import logging
    from attn_policy.sdpa import log_sdpa_decisions

    logging.basicConfig(level=logging.INFO)
    with log_sdpa_decisions() as calls:          # logger "attn_policy.sdpa", level INFO
        model(inputs)
    for call in calls:                           # an Explanation per call, in call order
        print(call.selected, call.first_reasons())

Modules that bound the function before the block (``from torch.nn.functional import
scaled_dot_product_attention``) keep the original; patch their attribute too
(``log_sdpa_decisions(modules=[my_module])``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence

from . import Decision, Policy, PolicyError
from ._model import SDPA_BACKENDS, Explanation, SdpaError, deprecated_alias
from ._native import NativeCall

__all__ = [
    "explain_sdpa",
    "sdpa_facts",
    "SdpaError",
    "log_sdpa_decisions",
    "BACKENDS",
]

logger = logging.getLogger("attn_policy.sdpa")

#: The pack's backends in torch.nn.attention.SDPBackend terms.
BACKENDS = SDPA_BACKENDS

# torch._fused_sdp_choice's integers (at::SDPBackend).
_CHOICE = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}

_DTYPES = {
    "float16": "fp16",
    "bfloat16": "bf16",
    "float32": "fp32",
    "float64": "fp64",
    "float8_e4m3fn": "fp8_e4m3fn",
    "float8_e5m2": "fp8_e5m2",
    "bool": "bool",
}

_ENV = ("TORCH_CUDNN_SDPA_DEPRIORITIZED", "TORCH_CUDNN_SDPA_NESTED_TENSOR_ENABLED")


_POLICY: Optional[Policy] = None


def _policy() -> Policy:
    global _POLICY
    if _POLICY is None:
        _POLICY = Policy.load("torch")
    return _POLICY


def _torch() -> Any:
    try:
        import torch  # noqa: PLC0415 (optional dependency)
    except ImportError as e:  # pragma: no cover - exercised only without torch
        raise SdpaError("explain_sdpa needs PyTorch (import torch failed)") from e
    return torch


def _dtype(t: Any) -> str:
    name = str(t.dtype).replace("torch.", "")
    return _DTYPES.get(name, "other")


def _size(t: Any, dim: int) -> int:
    return int(t.size(dim))


def _nested_facts(torch: Any, q: Any, k: Any, v: Any) -> Dict[str, Any]:
    """Facts of nested (strided-layout) inputs, from each tensor's per-sequence sizes."""
    facts: Dict[str, Any] = {"nested": True}
    mins: List[int] = []
    heads: Dict[str, int] = {}
    ragged_heads = False
    for name, t in (("q", q), ("k", k), ("v", v)):
        sizes = t._nested_tensor_size().tolist()  # per sequence: [heads, seqlen, head_dim]
        if not sizes:
            raise SdpaError(f"nested {name} has no sequences")
        if any(len(s) != 3 for s in sizes):
            raise SdpaError(f"nested {name} is not [batch, heads, seqlen, head_dim]")
        hs = {s[0] for s in sizes}
        ragged_heads |= len(hs) > 1
        heads[name] = sizes[0][0]
        lens = [s[1] for s in sizes]
        mins.append(min(lens))
        if name in ("k", "v"):
            facts[f"nested_seqlen_{name}_ragged"] = len(set(lens)) > 1
    facts["nested_min_seqlen"] = min(mins)
    facts["nested_ragged_heads"] = ragged_heads
    facts["heads_q"], facts["heads_kv"], facts["heads_v"] = heads["q"], heads["k"], heads["v"]
    # sequence lengths are ragged: only nested-aware checks read lengths, and they read the
    # facts above; give the dense length facts a neutral value
    facts["seqlen_q"] = facts["seqlen_kv"] = max(1, facts["nested_min_seqlen"])
    return facts


def sdpa_facts(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
    *,
    sm: Optional[Any] = None,
    cudnn: Optional[Any] = None,
    **overrides: Any,
) -> tuple:
    """The ``torch`` pack's facts of one SDPA call, and the assumptions made reading them.

    ``sm`` (e.g. ``90`` or ``(9, 0)``) and ``cudnn`` (e.g. ``91900`` or ``"9.19.0"``; ``None``
    reads ``torch.backends.cudnn.version()``) describe the GPU; without ``sm`` the query must be
    a CUDA tensor. ``overrides`` set any other fact of the family by name."""
    torch = _torch()
    assumptions: Dict[str, str] = {}
    q, k, v = query, key, value
    # As SDPA refuses them (a TypeError there): read on, a list failed with "'list' object has
    # no attribute 'dim'" and a str is_causal was taken by its truth value.
    for name, t in (("query", q), ("key", k), ("value", v)):
        if not callable(getattr(t, "dim", None)):  # (duck-typed: the tests' stand-in torch has no Tensor)
            raise SdpaError(f"{name} must be a torch.Tensor; found {type(t).__name__}")
    for name, x in (("is_causal", is_causal), ("enable_gqa", enable_gqa)):
        if not (isinstance(x, bool) or type(x) is int and x in (0, 1)):
            raise SdpaError(f"{name} must be True or False; found {type(x).__name__} {x!r}")
    if isinstance(dropout_p, (str, bytes, bool)) or not isinstance(dropout_p, (int, float)):
        raise SdpaError(f"dropout_p must be a float; found {type(dropout_p).__name__} {dropout_p!r}")
    facts: Dict[str, Any] = {}
    nested = [bool(getattr(t, "is_nested", False)) for t in (q, k, v)]
    if any(nested):
        if not all(nested):
            raise SdpaError("mixed nested and dense query/key/value are not modelled")
        if any(getattr(t, "layout", None) is not torch.strided for t in (q, k, v)):
            raise SdpaError(
                "jagged nested tensors (layout=torch.jagged) are dispatched by "
                "torch/nested/_internal/sdpa.py, which the torch pack does not model"
            )
        facts.update(_nested_facts(torch, q, k, v))
    for name, t in (("q", q), ("k", k), ("v", v)):
        facts[f"dim_{name}"] = int(t.dim())
        if t.dim() < 2 and not nested[0]:
            raise SdpaError(f"{name} has {t.dim()} dimensions; SDPA needs at least 2")
    facts["dtype"], facts["dtype_k"], facts["dtype_v"] = _dtype(q), _dtype(k), _dtype(v)
    facts["batch"], facts["batch_k"], facts["batch_v"] = (_size(t, 0) for t in (q, k, v))
    if not nested[0]:
        facts["seqlen_q"], facts["seqlen_kv"] = _size(q, -2), _size(k, -2)
        if q.dim() >= 3 and k.dim() >= 3 and v.dim() >= 3:
            facts["heads_q"], facts["heads_kv"], facts["heads_v"] = (_size(t, -3) for t in (q, k, v))
        for name, t in (("q", q), ("k", k), ("v", v)):
            facts[f"stride_last_{name}"] = int(t.stride(-1))
    facts["head_dim_qk"], facts["head_dim_k"], facts["head_dim_v"] = (_size(t, -1) for t in (q, k, v))
    facts["requires_grad"] = bool(q.requires_grad or k.requires_grad or v.requires_grad)
    facts["grad_enabled"] = bool(torch.is_grad_enabled())
    if attn_mask is None:
        facts["attn_mask"] = None
    else:
        if not hasattr(attn_mask, "dtype"):
            raise SdpaError(
                f"attn_mask of type {type(attn_mask).__name__} (a CausalBias?) takes its own "
                "dispatch in torch.nn.attention.bias, which the torch pack does not model"
            )
        shape = [int(s) for s in attn_mask.shape]
        if len(shape) < 2:
            raise SdpaError(f"attn_mask has {len(shape)} dimensions; PyTorch reads size(-2)")
        facts["attn_mask"] = {
            "dtype": _dtype(attn_mask),
            "shape": shape,
            "stride_last": int(attn_mask.stride(-1)),
            "requires_grad": bool(attn_mask.requires_grad),
        }
    facts["dropout_p"] = float(dropout_p)
    facts["is_causal"] = bool(is_causal)
    facts["enable_gqa"] = bool(enable_gqa)
    facts["scale"] = None if scale is None else float(scale)
    cuda = torch.backends.cuda
    facts["flash_sdp_enabled"] = bool(cuda.flash_sdp_enabled())
    facts["mem_efficient_sdp_enabled"] = bool(cuda.mem_efficient_sdp_enabled())
    facts["math_sdp_enabled"] = bool(cuda.math_sdp_enabled())
    facts["cudnn_sdp_enabled"] = bool(cuda.cudnn_sdp_enabled())
    fa3 = getattr(torch._C, "_get_fa3_sdp_enabled", None)
    if callable(fa3):
        facts["fa3_sdp_enabled"] = bool(fa3())
    else:
        facts["fa3_sdp_enabled"] = False
        assumptions["fa3_sdp_enabled"] = (
            "no getter in this PyTorch; assumed False (only "
            "torch.nn.attention's FA3 registration sets it; it matters for fp8 on sm90+)"
        )
    facts["deterministic"] = bool(torch.are_deterministic_algorithms_enabled())
    facts["deterministic_warn_only"] = bool(torch.is_deterministic_algorithms_warn_only_enabled())
    facts["env"] = {name: os.environ.get(name) for name in _ENV}
    if sm is None:
        device = getattr(q, "device", None)
        if getattr(device, "type", None) != "cuda":
            raise SdpaError(
                f"the query is on {device}, not a CUDA device: PyTorch's CUDA choice does not "
                "apply; pass sm= (and cudnn=) to explain the call as on that GPU"
            )
        major, minor = torch.cuda.get_device_capability(device)
        facts["sm"] = major * 10 + minor
    else:
        facts["sm"] = list(sm) if isinstance(sm, (tuple, list)) else sm
    if cudnn is None:
        version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        facts["cudnn_version"] = version
    else:
        facts["cudnn_version"] = cudnn
    facts["torch_version"] = str(torch.__version__)
    facts.update(overrides)
    return facts, assumptions


def _check_priority(torch: Any, d: Decision) -> None:
    """The pack orders backends as PyTorch does by default (cuDNN first where
    check_prefer_cudnn_attention holds). A priority order set with
    ``sdpa_kernel(..., set_priority=True)`` is not modelled: refuse it."""
    getter = getattr(torch._C, "_get_sdp_priority_order", None)
    if not callable(getter):
        return
    order = [_CHOICE.get(int(b), str(b)) for b in getter()][:4]
    default = ["flash", "efficient", "math", "cudnn"]
    cudnn_first = ["cudnn", "flash", "efficient", "math"]
    pref = (d.to_dict().get("preference") or {}).get("id")
    # Before the first SDPA call PyTorch still shows the default order; it moves cuDNN to the
    # front on that call where the pack's `cudnn-first` applies.
    if order == default or (order == cudnn_first and pref == "cudnn-first"):
        return
    raise SdpaError(
        f"the process's SDPA priority order is {order} (set with sdpa_kernel(..., "
        f"set_priority=True)?); the torch pack models PyTorch's default order ({pref})"
    )


def explain_sdpa(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
    *,
    sm: Optional[Any] = None,
    cudnn: Optional[Any] = None,
    policy: Optional[Policy] = None,
    **overrides: Any,
) -> Explanation:
    """Which backend ``F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
    is_causal, scale, enable_gqa=enable_gqa)`` would use here, and every backend's reasons.
    Same arguments as SDPA; nothing runs on the GPU. See :func:`sdpa_facts` for ``sm``,
    ``cudnn`` and ``overrides``; ``policy`` is a loaded ``torch``-family pack (default: the
    embedded ``torch`` pack). Returns the call's :class:`attn_policy.Explanation` (kind ``sdpa``:
    ``selected``, ``sdp_backend``, ``facts``, ``assumptions``, ``reasons()``, ``explain()``;
    ``to_dict()`` is the call document with those in its ``extra``). Raises
    :class:`SdpaError` for inputs the pack does not model."""
    torch = _torch()
    facts, assumptions = sdpa_facts(
        query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
        sm=sm, cudnn=cudnn, **overrides,
    )
    decision = (policy or _policy()).select(facts)
    if sm is None:
        _check_priority(torch, decision)
    selected = decision.selected
    extra = {"sdp_backend": BACKENDS.get(selected) if selected else None, "assumptions": dict(assumptions)}
    return Explanation(NativeCall(decision._d, [], None, kind="sdpa", extra=extra), decision)


@contextlib.contextmanager
def log_sdpa_decisions(
    level: int = logging.INFO,
    modules: Sequence[Any] = (),
    **explain_kwargs: Any,
) -> Iterator[List[Explanation]]:
    """Within the block, explain every ``scaled_dot_product_attention`` call before it runs:
    log the selected backend and each declined backend's first reason at ``level`` on logger
    ``attn_policy.sdpa``, and collect their :class:`attn_policy.Explanation` objects in the
    yielded list.
    ``modules``: further modules whose ``scaled_dot_product_attention`` attribute to patch.
    A call the pack cannot explain is logged at WARNING and runs all the same."""
    torch = _torch()
    F = torch.nn.functional
    original = F.scaled_dot_product_attention
    calls: List[Explanation] = []

    @functools.wraps(original)
    def logged(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, **kw):
        try:
            d = explain_sdpa(
                query, key, value, attn_mask, dropout_p, is_causal, scale,
                kw.get("enable_gqa", False), **explain_kwargs,
            )
        except PolicyError as e:
            logger.warning("attn-policy: SDPA call not explained: %s", e)
        else:
            calls.append(d)
            why = ", ".join(f"{b}: {r}" for b, r in d.first_reasons().items())
            logger.log(level, "attn-policy: SDPA -> %s (declined %s)", d.selected, why or "none")
        # scale and enable_gqa are keyword-only in torch's signature
        return original(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **kw)

    targets = [F, *modules]
    saved = [(m, getattr(m, "scaled_dot_product_attention")) for m in targets]
    for m in targets:
        setattr(m, "scaled_dot_product_attention", logged)
    try:
        yield calls
    finally:
        for m, fn in saved:
            setattr(m, "scaled_dot_product_attention", fn)


def __getattr__(name: str) -> Any:
    # SdpaDecision, deprecated: attn_policy.Explanation (kind "sdpa").
    return deprecated_alias(__name__, name, ("SdpaDecision",))
