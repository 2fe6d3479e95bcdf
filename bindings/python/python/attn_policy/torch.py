"""Attention as a PyTorch op whose backend a policy chooses and whose executor says what ran.

    import attn_policy.torch as apt
    o = apt.attention(q, k, v, layout="bshd", is_causal=True)          # O, like SDPA
    o, d = apt.attention(q, k, v, return_decision=True)                # and the decision

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
   pack.yaml, :func:`executor_chain`), is walked: the first entry that is available and
   accepts the problem runs; every entry's outcome (``ran``, ``refused`` with the executor's
   reason, ``unavailable`` with why) is recorded in the decision. Running any entry but the
   first is a substitution, logged and reported, never silent; ``no_substitute=True`` makes
   it an error.
3. CPU tensors run the float64 reference on their memory (fp16, bf16, fp32, fp64). CUDA
   tensors run the GPU executors on ``torch.cuda.current_stream()`` with outputs and
   workspace from torch's allocator: no synchronisation, no host round trip, so a warmed-up
   call can be captured in a ``torch.cuda.CUDAGraph``.

A call no executor serves (dropout today) is declined with the reasons:
``on_decline="raise"`` raises :class:`AttentionDeclined`; ``"fallback"`` runs
``torch.nn.functional.scaled_dot_product_attention`` instead and logs why.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

from . import Decision, Policy, PolicyError, _native, eager_node
# PyTorch's own SDPA choice explained by the `torch` pack (attn_policy/sdpa.py).
from .sdpa import SdpaDecision, SdpaError, explain_sdpa, log_sdpa_decisions

__all__ = [
    "attention",
    "DotProductAttention",
    "AttentionDeclined",
    "SubstitutionRefused",
    "InvalidInput",
    "ShapeMismatch",
    "CallDecision",
    "ChainEntry",
    "executor_chain",
    "executors",
    "live_facts",
    "cache_info",
    "clear_cache",
    "explain_sdpa",
    "log_sdpa_decisions",
    "SdpaDecision",
    "SdpaError",
    "lse_dtype",
    "cp_attention",
    "shard_sequence",
    "unshard_sequence",
    "ContextParallelDeclined",
    "ShardMismatch",
    "CPDecision",
]

logger = logging.getLogger("attn_policy.torch")

LAYOUTS = ("bhsd", "bshd", "sbhd")
DIAGONALS = ("top_left", "bottom_right")
_ON_DECLINE = ("raise", "fallback")


class AttentionDeclined(PolicyError):
    """No executor can run this call (the policy selected no backend, or every entry of the
    chain refused or is unavailable). ``.decision`` holds the :class:`CallDecision`."""

    def __init__(self, message: str, decision: "CallDecision"):
        super().__init__(message)
        self.decision = decision
        self.diagnostics: list = []


class SubstitutionRefused(PolicyError):
    """``no_substitute=True`` and the backend's first executor could not run."""

    def __init__(self, message: str, decision: "CallDecision"):
        super().__init__(message)
        self.decision = decision
        self.diagnostics: list = []


# The tensors do not describe one attention call: refused before anything is decided or planned
# (a PolicyError, so a ValueError). The plans raise it too, for a pointer or strides that reach
# past their tensor's storage.
InvalidInput = _native.InvalidInput
# Two tensors disagree on a size they share, or dO / O / LSE do not have the call's shape: no
# broadcasting; the message names both shapes. An InvalidInput.
ShapeMismatch = _native.ShapeMismatch


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
# Executor chains: the pack's data (`executors:` in pack.yaml).

_packs: Dict[str, Policy] = {}


def executor_chain(policy: Union[Policy, str, None], backend: str, variant: Optional[str] = None) -> Tuple[str, ...]:
    """The ordered executors that may run ``backend`` of ``policy`` (a :class:`Policy`, the
    name of an embedded pack, or None for the ``te`` pack), as the pack declares them
    (``executors:`` in its pack.yaml; a ``variant``'s own chain wins where it has one). First
    = the backend's own executor; the rest are substitutes. Empty: nothing can run it."""
    if policy is None:
        from . import te as _te

        policy = _te.get_policy()
    elif isinstance(policy, str):
        p = _packs.get(policy)
        if p is None:
            p = _packs.setdefault(policy, Policy.load(policy))
        policy = p
    return tuple(policy._p.executor_chain(backend, variant))


# ---------------------------------------------------------------------------------------------
# The decision of one call.


@dataclass(frozen=True)
class ChainEntry:
    """One executor of the chain and what happened to it: ``ran``, ``refused`` (the executor
    does not do this problem), ``unavailable`` (it cannot run in this process) or
    ``not_tried`` (an earlier entry ran)."""

    executor: str
    outcome: str
    reason: str = ""


@dataclass
class CallDecision:
    """What :func:`attention` decided for one input signature."""

    pack: str
    backend: Optional[str]
    executor: Optional[str]
    chain: List[ChainEntry]
    decision: Optional[Decision]
    substitute: bool = False
    fallback: Optional[str] = None
    provenance: Dict[str, str] = field(default_factory=dict)
    problem: str = ""

    def summary(self) -> str:
        """``selected FlashAttention; ran on chunked (substitute: torch_flash: ...)``."""
        if self.backend is None:
            head = f"pack {self.pack} selected no backend"
        else:
            head = f"pack {self.pack} selected {self.backend}"
        if self.executor is None:
            tail = "no executor ran"
            if self.fallback:
                tail += f"; fell back to torch SDPA ({self.fallback})"
            return f"{head}; {tail}"
        if not self.substitute:
            return f"{head}; ran on {self.executor}"
        why = "; ".join(f"{e.executor}: {e.reason}" for e in self.chain if e.outcome in ("refused", "unavailable"))
        return f"{head}; ran on {self.executor} (substitute: {why})"

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {
            "pack": self.pack,
            "backend": self.backend,
            "executor": self.executor,
            "substitute": self.substitute,
            "executor_chain": [{"executor": e.executor, "outcome": e.outcome, "reason": e.reason} for e in self.chain],
            "provenance": dict(self.provenance),
        }
        if self.fallback:
            d["fallback"] = self.fallback
        if self.decision is not None:
            d["decision"] = self.decision.to_dict()
        return d

    def __str__(self) -> str:
        return self.summary()


# ---------------------------------------------------------------------------------------------
# Live facts.

_facts_lock = threading.Lock()
_device_facts: Dict[Tuple[str, int], Dict[str, Tuple[Any, str]]] = {}


def live_facts(device: Union[str, torch.device, None] = None) -> Dict[str, Tuple[Any, str]]:
    """``fact -> (value, source)`` read from this process for ``device`` (default: the current
    CUDA device, else the CPU): the compute capability of that device, the cuDNN version torch
    loaded, installed flash-attn / cuDNN-frontend / CuTe-DSL versions (the TE drop-in's probes),
    and whether deterministic algorithms are requested. What cannot be answered is ``(None,
    "default")``; ``NVTE_*`` switches are read per decision from ``os.environ``."""
    from . import te as _te

    dev = torch.device(device) if device is not None else (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    )
    key = (dev.type, dev.index or 0)
    with _facts_lock:
        cached = _device_facts.get(key)
    if cached is None:
        base = dict(_te._base())
        if dev.type == "cuda":
            try:
                base["device_compute_capability"] = (list(torch.cuda.get_device_capability(dev)), "probe")
            except Exception:  # pragma: no cover - a broken driver
                base["device_compute_capability"] = (None, "default")
        else:
            # The call runs on the host: no GPU architecture applies to it.
            base["device_compute_capability"] = (None, "default")
        cached = base
        with _facts_lock:
            _device_facts[key] = cached
    out = dict(cached)
    out["deterministic"] = (torch.are_deterministic_algorithms_enabled(), "probe")
    return out


# ---------------------------------------------------------------------------------------------
# Executors provided by torch (registered with the native registry as the Python host's).


def _aten(name: str) -> Optional[Any]:
    return getattr(torch.ops.aten, name, None)


class _TorchExecutor:
    """An executor torch provides. ``check`` returns the reason it refuses a call, or None."""

    name = ""
    description = ""

    def available(self, device: torch.device) -> Tuple[bool, str]:
        raise NotImplementedError

    def check(self, call: "_Call") -> Optional[str]:
        return call.problem.refusal_by_manifest(self.name)

    def runner(self, call: "_Call") -> "_Runner":
        raise NotImplementedError


class _TorchFlash(_TorchExecutor):
    """``aten::_flash_attention_forward/backward``: FlashAttention-2 built into PyTorch, on
    ``bshd`` views (zero-copy for every layout: only the logical order changes), with the
    kernel's own log-sum-exp."""

    name = "torch_flash"
    description = "PyTorch's FlashAttention-2 kernel"

    def available(self, device: torch.device) -> Tuple[bool, str]:
        if device.type != "cuda":
            return False, "runs on a CUDA device; the tensors are on the CPU"
        if _aten("_flash_attention_forward") is None:
            return False, "this torch has no aten::_flash_attention_forward"
        if not torch.backends.cuda.is_flash_attention_available():
            return False, "this torch build has no FlashAttention kernels"
        cc = torch.cuda.get_device_capability(device)
        if cc < (8, 0):
            return False, f"compute capability {cc[0]}.{cc[1]} < 8.0"
        return True, f"torch {torch.__version__}, sm_{cc[0]}{cc[1]}"

    def check(self, call: "_Call") -> Optional[str]:
        r = super().check(call)
        if r:
            return r
        if call.dropout_p > 0.0:
            return "dropout is not wired into this executor"
        # FlashAttention's diagonal is bottom-right: top-left only coincides when s_q == s_kv.
        if not call.bottom_right and call.sq != call.skv and (call.mask != 0 or call.window_left >= 0 or call.window_right >= 0):
            return "FlashAttention aligns masks bottom-right; a top-left mask with s_q != s_kv differs"
        if call.mask != 0 and call.window_right > 0:
            return "causal with a right window > 0"
        return None

    def runner(self, call: "_Call") -> "_Runner":
        return _FlashRunner(call)


class _TorchMath(_TorchExecutor):
    """Attention from torch tensor ops: float32 arithmetic for fp16/bf16 inputs, float64 for
    fp32 and fp64 (an fp32 computation of fp32 inputs is itself the naive same-dtype attention,
    which the FlashAttention criterion asks to beat within 2x: it missed that on ~3% of small
    random problems)."""

    name = "torch_math"
    description = "attention from torch tensor ops"

    def available(self, device: torch.device) -> Tuple[bool, str]:
        return True, f"torch {torch.__version__}"

    def check(self, call: "_Call") -> Optional[str]:
        r = super().check(call)
        if r:
            return r
        if call.dropout_p > 0.0:
            return "dropout is not wired into this executor"
        return None

    def runner(self, call: "_Call") -> "_Runner":
        return _MathRunner(call)


class _TorchEfficient(_TorchExecutor):
    """``aten::_efficient_attention_forward/backward``: the memory-efficient (CUTLASS) kernel in
    PyTorch, on ``bshd`` views, with its own log-sum-exp (which it pads to a multiple of 32
    rows: the op keeps ``[b, h, s_q]`` and pads again for the backward)."""

    name = "torch_efficient"
    description = "PyTorch's memory-efficient attention kernel"

    def available(self, device: torch.device) -> Tuple[bool, str]:
        if device.type != "cuda":
            return False, "runs on a CUDA device; the tensors are on the CPU"
        if _aten("_efficient_attention_forward") is None:
            return False, "this torch has no aten::_efficient_attention_forward"
        if not torch.backends.cuda.is_flash_attention_available():
            # Built together with the flash kernels (USE_MEM_EFF_ATTENTION in PyPI's wheels).
            return False, "this torch build has no fused attention kernels"
        cc = torch.cuda.get_device_capability(device)
        return True, f"torch {torch.__version__}, sm_{cc[0]}{cc[1]}"

    def check(self, call: "_Call") -> Optional[str]:
        r = super().check(call)
        if r:
            return r
        if call.dropout_p > 0.0:
            return "dropout is not wired into this executor"
        if call.window_left >= 0 or (call.mask == 0 and call.window_right >= 0):
            return "sliding windows are not wired into this executor"
        return None

    def runner(self, call: "_Call") -> "_Runner":
        return _EfficientRunner(call)


class _TorchCudnn(_TorchExecutor):
    """``aten::_scaled_dot_product_cudnn_attention`` and its backward: PyTorch's own cuDNN
    SDPA (``bhsd`` views), with its log-sum-exp."""

    name = "torch_cudnn"
    description = "PyTorch's cuDNN attention"

    def available(self, device: torch.device) -> Tuple[bool, str]:
        if device.type != "cuda":
            return False, "runs on a CUDA device; the tensors are on the CPU"
        if _aten("_scaled_dot_product_cudnn_attention") is None:
            return False, "this torch has no aten::_scaled_dot_product_cudnn_attention"
        if not torch.backends.cudnn.is_available():
            return False, "torch has no cuDNN here"
        cc = torch.cuda.get_device_capability(device)
        return True, f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, sm_{cc[0]}{cc[1]}"

    def check(self, call: "_Call") -> Optional[str]:
        r = super().check(call)
        if r:
            return r
        if call.dropout_p > 0.0:
            return "dropout is not wired into this executor"
        return None

    def runner(self, call: "_Call") -> "_Runner":
        return _CudnnSdpaRunner(call)


_TORCH_EXECUTORS: Dict[str, _TorchExecutor] = {
    e.name: e for e in (_TorchFlash(), _TorchMath(), _TorchEfficient(), _TorchCudnn())
}


def _frost_unavailable(call: "_Call") -> str:
    """Why ``frost`` cannot run this call inside Python, precisely: the wheel has no FROST
    executor, and what else would decline it here (frontend / CuTe DSL versions, the engine
    switch, the device's compute capability and direction)."""
    from . import te as _te

    why = [
        "not in this wheel: the FROST bridge embeds CPython (feature `frost`, the attn-policy "
        "binary), which a Python extension module cannot, and attn_policy.torch has no FROST "
        "runner of its own (one would call the cuDNN frontend's Python package; it cannot be "
        "verified here: FROST plans need nvidia-cutlass-dsl, and its backward an SM100 GPU)"
    ]
    cc = None
    if call.device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(call.device)
        cc = major * 10 + minor
    else:
        why.append("runs on a CUDA device; the tensors are on the CPU")
    switch = os.environ.get("CUDNN_FRONTEND_ENABLE_FROST_ENGINES", "")
    why += _native.frost_reasons(
        call.problem, call.training, cc, _te._version_of("nvidia-cudnn-frontend"),
        _te._version_of("nvidia-cutlass-dsl"),
        # The Python-host runner would switch the engines on before importing the frontend.
        True if not switch else switch.strip().lower() in ("1", "true", "yes", "on"),
    )
    return "; ".join(why)


def _register_host_executors() -> None:
    dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    for e in _TORCH_EXECUTORS.values():
        ok, detail = e.available(dev)
        _native.set_host_availability(e.name, ok, detail)


def executors() -> List[Dict[str, Any]]:
    """Every executor with its availability here (``available`` / ``unavailable`` and why) and
    its manifest; the torch executors answer for the current device."""
    return list(_native.executors())


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


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the log-sum-exp the op returns for inputs of ``dtype``: float64 for float64
    inputs (the CPU reference keeps them exact, so a context-parallel merge of partial results
    stays float64-accurate), float32 otherwise (every executor's convention)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _bhsd(t: torch.Tensor, layout: int) -> Tuple[Tuple[int, int, int, int], Tuple[int, int, int]]:
    """(b, h, s, d) and strides (batch, head, seq) of a tensor in layout ``layout``."""
    sz, st = t.shape, t.stride()
    if layout == 0:  # bhsd
        return (sz[0], sz[1], sz[2], sz[3]), (st[0], st[1], st[2])
    if layout == 1:  # bshd
        return (sz[0], sz[2], sz[1], sz[3]), (st[0], st[2], st[1])
    return (sz[1], sz[2], sz[0], sz[3]), (st[1], st[2], st[0])  # sbhd


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


def _o_shape(q: torch.Tensor, v: torch.Tensor) -> List[int]:
    return [*q.shape[:-1], v.shape[-1]]


def _contiguous_strides(shape: Sequence[int]) -> List[int]:
    st, acc = [0] * len(shape), 1
    for i in range(len(shape) - 1, -1, -1):
        st[i] = acc
        acc *= max(int(shape[i]), 1)
    return st


# ---------------------------------------------------------------------------------------------
# Runners: what a chosen executor does with tensors.


class _Runner:
    executor = ""
    # Whether the plan itself checks every pointer against its storage (native plans); the
    # direct eager path checks the others' storage in Python on every call.
    checks_storage = False

    def forward(self, q, k, v) -> Tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def backward(self, g, q, k, v, o, lse) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def apply(self, q, k, v) -> torch.Tensor:
        """O of an eager call that needs gradients (the Python autograd Function)."""
        return _eager_apply(q, k, v, self)

    def output(self, q, k, v) -> torch.Tensor:
        """O of an eager call that needs no gradient."""
        return self.forward(q, k, v)[0]


_empty = torch.empty
_empty_strided = torch.empty_strided
_F32 = torch.float32
_U8 = torch.uint8
# The current stream of a device as an int, without a Stream object.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _no_stream(index: int) -> int:
    return 0


def _avail(t: torch.Tensor) -> int:
    """The bytes ``t``'s storage holds from its data pointer (what a native plan may touch)."""
    return max(t.untyped_storage().nbytes() - t.storage_offset() * t.element_size(), 0)


class _NativeRunner(_Runner):
    """A built-in executor through a native plan (pointers in, nothing allocated natively).
    What the input signature fixes (shapes, strides, dtype, device, forward workspace) is read
    once here, so a call only allocates, reads pointers and enqueues."""

    def __init__(self, plan, call: _Call, host_copy: bool):
        self.plan, self.executor = plan, plan.executor
        self.host_copy = host_copy  # CUDA tensors through the CPU reference (a last resort)
        # The plan checks the pointers it is given; a host copy of a CUDA tensor is made by torch.
        self.checks_storage = not host_copy
        self.ws_fwd = plan.workspace_forward
        self.lse_shape = (call.b, call.hq, call.sq)
        self.lse_dtype = lse_dtype(call.dtype)
        self.o_shape = call.o_shape
        self.dtype, self.device = call.dtype, call.device
        self.cuda = call.device.type == "cuda" and not host_copy
        self.index = call.device.index if call.device.index is not None else 0
        self._fwd, self._bwd, self._ws_bwd = plan.forward, plan.backward, plan.workspace_backward
        self._stream = _raw_stream if self.cuda else _no_stream
        if not host_copy:
            # Eager calls through the C++ node where it builds (attn_policy.eager_node): its
            # backward runs no Python, so it takes no GIL on autograd's thread, and its forward
            # allocates in C++.
            node = eager_node.op()
            if node is not None:
                self.apply = _through_node(node.attention, plan.handle)
                self.output = _through_node(node.forward, plan.handle)

    def _no_capture(self):
        if self.host_copy and torch.cuda.is_current_stream_capturing():
            raise PolicyError(
                "the reference executor runs CUDA tensors through host copies, which a CUDA graph "
                "cannot capture (it ran as a substitute for this call: see the decision)"
            )

    def forward(self, q, k, v):
        if self.host_copy:
            return self._forward_through_host(q, k, v)
        dev = self.device
        o = _empty(self.o_shape, dtype=self.dtype, device=dev)
        lse = _empty(self.lse_shape, dtype=self.lse_dtype, device=dev)
        n = self.ws_fwd
        ws = _empty((n,), dtype=_U8, device=dev) if n else None
        self._fwd(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
            (_avail(q), _avail(k), _avail(v), _avail(o), _avail(lse)),
            ws.data_ptr() if n else 0, n, self._stream(self.index),
        )
        return o, lse

    def backward(self, g, q, k, v, o, lse):
        if self.host_copy:
            return self._backward_through_host(g, q, k, v, o, lse)
        dev, dt = self.device, self.dtype
        dq = _empty_strided(q.shape, q.stride(), dtype=dt, device=dev)
        dk = _empty_strided(k.shape, k.stride(), dtype=dt, device=dev)
        dv = _empty_strided(v.shape, v.stride(), dtype=dt, device=dev)
        # Per call: the backward plan lives on the calling thread (autograd's), built there once.
        n = self._ws_bwd() if self.cuda else 0
        ws = _empty((n,), dtype=_U8, device=dev) if n else None
        self._bwd(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), g.data_ptr(), lse.data_ptr(),
            dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
            tuple(_avail(t) for t in (q, k, v, o, g, lse, dq, dk, dv)), ws.data_ptr() if n else 0, n,
            self._stream(self.index),
        )
        return dq, dk, dv

    def _forward_through_host(self, q, k, v):
        self._no_capture()
        dev = q.device
        q, k, v = q.cpu(), k.cpu(), v.cpu()
        o = torch.empty(_o_shape(q, v), dtype=q.dtype)
        lse = torch.empty(self.lse_shape, dtype=self.lse_dtype)
        self._fwd(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                  tuple(_avail(t) for t in (q, k, v, o, lse)))
        return o.to(dev), lse.to(dev)

    def _backward_through_host(self, g, q, k, v, o, lse):
        self._no_capture()
        dev = q.device
        g, q, k, v, o, lse = (t.cpu() for t in (g, q, k, v, o, lse))
        dq, dk, dv = _like(q), _like(k), _like(v)
        self._bwd(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), g.data_ptr(), lse.data_ptr(),
            dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
            tuple(_avail(t) for t in (q, k, v, o, g, lse, dq, dk, dv)),
        )
        return dq.to(dev), dk.to(dev), dv.to(dev)


_NODE_ERRORS = {
    "ExecutorRefused": _native.ExecutorRefused,
    "ExecutorUnavailable": _native.ExecutorUnavailable,
    "InvalidInput": InvalidInput,
    "ExecutorFailed": _native.ExecutorFailed,
}


def _retyped(e: RuntimeError) -> Exception:
    """The typed exception of an error the C++ node raised (``attn_policy[Kind]: message``)."""
    msg = str(e)
    if msg.startswith("attn_policy[") and "]: " in msg:
        kind, _, rest = msg[len("attn_policy["):].partition("]: ")
        cls = _NODE_ERRORS.get(kind)
        if cls is not None:
            return cls(rest)
    return e


def _through_node(node_op, handle: int):
    """An eager call's O through an op of the C++ node, for the plan at ``handle``."""
    def call(q, k, v):
        try:
            return node_op(q, k, v, handle)
        except RuntimeError as e:
            typed = _retyped(e)
            if typed is e:
                raise
            raise typed from None
    return call


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


class _FlashRunner(_Runner):
    executor = "torch_flash"

    def __init__(self, call: _Call):
        self.layout, self.scale = call.layout, call.scale
        causal = call.mask != 0
        wl, wr = call.window_left, call.window_right
        if causal:
            wr = 0
        self.causal = causal and wl < 0
        # FlashAttention takes a window around the bottom-right diagonal; -1 = unbounded.
        self.wl, self.wr = (wl, wr) if (wl >= 0 or (not causal and wr >= 0)) else (-1, -1)
        self.sq, self.skv, self.o_shape = call.sq, call.skv, call.o_shape

    def _win(self):
        if self.wl < 0 and self.wr < 0:
            return {}
        return {"window_size_left": self.wl, "window_size_right": self.wr}

    def forward(self, q, k, v):
        qb, kb, vb = (_to_bshd(t, self.layout) for t in (q, k, v))
        out = torch.ops.aten._flash_attention_forward(
            qb, kb, vb, None, None, self.sq, self.skv, 0.0, self.causal, False, scale=self.scale, **self._win()
        )
        return _into_layout(out[0], self.o_shape, self.layout, q), out[1].contiguous()

    def backward(self, g, q, k, v, o, lse):
        qb, kb, vb, ob, gb = (_to_bshd(t, self.layout) for t in (q, k, v, o, g))
        # No dropout: the RNG state is unused (uint64, as the forward returns it).
        seed = torch.zeros(2, dtype=torch.uint64, device=q.device)
        off = torch.zeros((), dtype=torch.uint64, device=q.device)
        dqb, dkb, dvb = torch.ops.aten._flash_attention_backward(
            gb, qb, kb, vb, ob, lse, None, None, self.sq, self.skv, 0.0, self.causal, seed, off,
            scale=self.scale, **self._win()
        )
        return _restrided_bshd((dqb, dkb, dvb), (q, k, v), self.layout)


def _into_layout(o_bshd: torch.Tensor, call_o_shape, layout: int, like: torch.Tensor) -> torch.Tensor:
    """O computed as a ``bshd`` tensor, as the op returns it: contiguous in the call's layout
    (the same tensor when it already is)."""
    o = o_bshd if layout == 1 else _from_bshd(o_bshd, layout)
    if o.is_contiguous():
        return o
    out = torch.empty(call_o_shape, dtype=like.dtype, device=like.device)
    _to_bshd(out, layout).copy_(o_bshd)
    return out


class _EfficientRunner(_Runner):
    """``torch_efficient``: ``aten::_efficient_attention_forward/backward`` on ``bshd`` views.
    ``custom_mask_type`` 0 / 1 / 2 = no mask / causal top-left / causal bottom-right."""

    executor = "torch_efficient"

    def __init__(self, call: _Call):
        self.layout, self.scale = call.layout, call.scale
        self.mask_type = 0 if call.mask == 0 else (2 if call.bottom_right else 1)
        self.sq, self.skv, self.o_shape = call.sq, call.skv, call.o_shape
        # The kernel's LSE has ceil(s_q / 32) * 32 rows.
        self.lse_rows = -(-call.sq // 32) * 32
        # The RNG state the forward returns (not read without dropout), as the backward gets it.
        self.rng: Optional[Tuple[torch.Tensor, torch.Tensor]] = None

    def forward(self, q, k, v):
        qb, kb, vb = (_to_bshd(t, self.layout) for t in (q, k, v))
        out = torch.ops.aten._efficient_attention_forward(
            qb, kb, vb, None, None, None, None, None, 0.0, self.mask_type, True, scale=self.scale
        )
        self.rng = (out[2], out[3])
        o = _into_layout(out[0], self.o_shape, self.layout, q)
        return o, out[1][:, :, : self.sq].contiguous()

    def backward(self, g, q, k, v, o, lse):
        qb, kb, vb, ob, gb = (_to_bshd(t, self.layout) for t in (q, k, v, o, g))
        lse_k = F.pad(lse, (0, self.lse_rows - self.sq)) if self.lse_rows != self.sq else lse
        seed, offset = self.rng or (torch.zeros((), dtype=torch.int64), torch.zeros((), dtype=torch.int64))
        dqb, dkb, dvb, _ = torch.ops.aten._efficient_attention_backward(
            gb, qb, kb, vb, None, ob, None, None, self.sq, self.skv, lse_k, 0.0, seed, offset,
            self.mask_type, False, scale=self.scale,
        )
        return _restrided_bshd((dqb, dkb, dvb), (q, k, v), self.layout)


class _CudnnSdpaRunner(_Runner):
    """``torch_cudnn``: ``aten::_scaled_dot_product_cudnn_attention`` and its backward on
    ``bhsd`` views. The LSE the forward returns is kept as ``[b, h, s_q]``; the backward gets
    it back in the shape the forward gave (so the pair stays consistent across versions)."""

    executor = "torch_cudnn"

    def __init__(self, call: _Call):
        self.layout, self.scale = call.layout, call.scale
        self.causal = call.mask != 0
        self.sq, self.skv, self.o_shape = call.sq, call.skv, call.o_shape
        self.lse_shape: Optional[Tuple[int, ...]] = None
        # The RNG state the forward returns (not read without dropout), as the backward gets it.
        self.rng: Optional[Tuple[Any, Any]] = None

    def forward(self, q, k, v):
        qh, kh, vh = (_to_bhsd(t, self.layout) for t in (q, k, v))
        out = torch.ops.aten._scaled_dot_product_cudnn_attention(
            qh, kh, vh, None, True, 0.0, self.causal, False, scale=self.scale
        )
        o_bhsd, lse = out[0], out[1]
        self.lse_shape = tuple(lse.shape)
        self.rng = (out[6], out[7])
        o = _from_bhsd(o_bhsd, self.layout)
        if not o.is_contiguous():
            o = o.contiguous()
        return o, lse.reshape(lse.shape[0], lse.shape[1], self.sq).contiguous()

    def backward(self, g, q, k, v, o, lse):
        qh, kh, vh, oh, gh = (_to_bhsd(t, self.layout) for t in (q, k, v, o, g))
        lse_k = lse.reshape(self.lse_shape) if self.lse_shape is not None else lse
        seed, offset = self.rng or (torch.zeros((), dtype=torch.int64), torch.zeros((), dtype=torch.int64))
        dq, dk, dv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            gh, qh, kh, vh, oh, lse_k, seed, offset, None, None, None, self.sq, self.skv, 0.0,
            self.causal, scale=self.scale,
        )
        grads = tuple(_from_bhsd(t, self.layout) for t in (dq, dk, dv))
        return _restrided(grads, (q, k, v))


def _restrided_bshd(grads_bshd, like, layout: int) -> Tuple[torch.Tensor, ...]:
    """Gradients computed as ``bshd`` tensors, with the strides of ``like``."""
    return _restrided(tuple(_from_bshd(g, layout) for g in grads_bshd), like)


def _mask_bool(call_like, sq: int, skv: int, device) -> Optional[torch.Tensor]:
    """Allowed (query, key) pairs, ``[s_q, s_kv]``, or None when everything is allowed."""
    mask, wl, wr, br = call_like
    off = (skv - sq) if br else 0
    if mask != 0:
        wr = 0 if wr < 0 else min(wr, 0)
    if wl < 0 and wr < 0:
        return None
    i = torch.arange(sq, device=device).unsqueeze(1) + off
    j = torch.arange(skv, device=device).unsqueeze(0)
    ok = torch.ones(sq, skv, dtype=torch.bool, device=device)
    if wl >= 0:
        ok &= j >= i - wl
    if wr >= 0:
        ok &= j <= i + wr
    return ok


def _math_forward(q, k, v, layout, mask_args, scale):
    """O and LSE from tensor ops (float32 for 16-bit inputs, float64 for fp32 and fp64); rows
    with no key: O = 0, LSE = -inf."""
    acc = torch.float64 if q.dtype in (torch.float64, torch.float32) else torch.float32
    qh, kh, vh = (_to_bhsd(t, layout).to(acc) for t in (q, k, v))
    hq, hkv = qh.shape[1], kh.shape[1]
    if hq != hkv:
        kh = kh.repeat_interleave(hq // hkv, dim=1)
        vh = vh.repeat_interleave(hq // hkv, dim=1)
    s = torch.matmul(qh, kh.transpose(-1, -2)) * scale
    allowed = _mask_bool(mask_args, qh.shape[2], kh.shape[2], q.device)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1).masked_fill(torch.isinf(lse).unsqueeze(-1), 0.0))
    p = torch.nan_to_num(p, nan=0.0)
    o = torch.matmul(p, vh)
    return _from_bhsd(o.to(q.dtype), layout), lse.to(lse_dtype(q.dtype))


class _MathRunner(_Runner):
    executor = "torch_math"

    def __init__(self, call: _Call):
        self.layout, self.scale = call.layout, call.scale
        self.mask_args = (call.mask, call.window_left, call.window_right, call.bottom_right)

    def forward(self, q, k, v):
        o, lse = _math_forward(q, k, v, self.layout, self.mask_args, self.scale)
        return o.contiguous(), lse.contiguous()

    def backward(self, g, q, k, v, o, lse):
        with torch.enable_grad():
            qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
            out, _ = _math_forward(qq, kk, vv, self.layout, self.mask_args, self.scale)
            grads = torch.autograd.grad(out, (qq, kk, vv), g)
        return _restrided(grads, (q, k, v))


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


class _SdpaFallback(_Runner):
    """``on_decline="fallback"``: torch SDPA (math-equivalent masks), recomputed for the
    backward. Its log-sum-exp is not computed (NaN)."""

    executor = "torch_sdpa_fallback"

    def __init__(self, call: _Call):
        self.layout, self.scale, self.dropout_p = call.layout, call.scale, call.dropout_p
        self.mask_args = (call.mask, call.window_left, call.window_right, call.bottom_right)
        self.lse_shape = (call.b, call.hq, call.sq)
        self.lse_dtype = lse_dtype(call.dtype)

    def _sdpa(self, q, k, v):
        qh, kh, vh = (_to_bhsd(t, self.layout) for t in (q, k, v))
        allowed = _mask_bool(self.mask_args, qh.shape[2], kh.shape[2], q.device)
        o = F.scaled_dot_product_attention(
            qh, kh, vh, attn_mask=allowed, dropout_p=self.dropout_p, scale=self.scale,
            enable_gqa=qh.shape[1] != kh.shape[1],
        )
        return _from_bhsd(o, self.layout)

    def forward(self, q, k, v):
        o = self._sdpa(q, k, v).contiguous()
        return o, torch.full(self.lse_shape, float("nan"), dtype=self.lse_dtype, device=q.device)

    def backward(self, g, q, k, v, o, lse):
        with torch.enable_grad():
            qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
            grads = torch.autograd.grad(self._sdpa(qq, kk, vv), (qq, kk, vv), g)
        return _restrided(grads, (q, k, v))


# ---------------------------------------------------------------------------------------------
# Policies by id (the op takes an int), the per-signature cache.

_policies: List[Policy] = []
_policy_ids: Dict[int, int] = {}
_policies_lock = threading.Lock()


def _policy_id(policy: Optional[Policy]) -> int:
    if policy is None:
        return 0
    key = id(policy)
    pid = _policy_ids.get(key)
    if pid is None:
        with _policies_lock:
            if key not in _policy_ids:
                _policies.append(policy)
                _policy_ids[key] = len(_policies)
            pid = _policy_ids[key]
    return pid


def _policy_of(pid: int) -> Policy:
    if pid == 0:
        from . import te as _te

        return _te.get_policy()
    return _policies[pid - 1]


class _Entry:
    __slots__ = ("runner", "decision")

    def __init__(self, runner: Optional[_Runner], decision: CallDecision):
        self.runner, self.decision = runner, decision


_cache: Dict[tuple, _Entry] = {}
_cache_lock = threading.Lock()
_CACHE_CAP = 4096
_stats = {"hits": 0, "misses": 0}


def cache_info() -> Dict[str, int]:
    """Per-signature cache counters (hits, misses, entries)."""
    return {"hits": _stats["hits"], "misses": _stats["misses"], "entries": len(_cache)}


def clear_cache() -> None:
    """Forgets every cached decision and plan (after changing ``NVTE_*`` or installing a
    package, say) and the eager node's choice (``ATTN_POLICY_EAGER_NODE`` is read again)."""
    from . import te as _te

    with _cache_lock:
        _cache.clear()
        _fast.clear()
        _device_facts.clear()
        _stats["hits"] = _stats["misses"] = 0
    eager_node.reset()
    _te.reprobe()


def _key(q, k, v, args) -> tuple:
    # Every tensor's dtype and device: a plan reads its inputs' memory as the problem says.
    return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
            q.device, k.device, v.device, torch.are_deterministic_algorithms_enabled(), args)


def _entry(q, k, v, args) -> _Entry:
    key = _key(q, k, v, args)
    e = _cache.get(key)
    if e is not None:
        _stats["hits"] += 1
        return e
    e = _decide(q, k, v, *args)
    with _cache_lock:
        if len(_cache) >= _CACHE_CAP:
            _cache.clear()
        _cache[key] = e
        _stats["misses"] += 1
    return e


def _cudnn_fact(env: Dict[str, Tuple[Any, str]]) -> Optional[Tuple[int, int, int]]:
    v = env.get("cudnn_version", (None, ""))[0]
    if isinstance(v, (list, tuple)) and len(v) == 3:
        return (int(v[0]), int(v[1]), int(v[2]))
    return None


def _live_probes(problem: Any, device: Optional[int], training: bool, cudnn_version) -> Tuple[Dict[str, Optional[bool]], Any]:
    """Answers to the te family's probe facts for ``problem`` (a native problem, or None when
    the facts describe none the executors express) on CUDA device ``device`` (None: the
    host), and what the answer was measured with: the ``cudnn`` plan, or the error it gave.

    ``cuda_device``: whether the call runs on a GPU. ``fused_attn_graph``: whether the
    ``cudnn`` executor builds the graph (forward, and backward when ``training``) on that GPU
    with the libcudnn this process loaded; unknown without a GPU, a problem or the library.
    ``frost_plan``: unknown (no FROST executor runs inside Python). Shared by
    :func:`attention` and the TE drop-in (:mod:`attn_policy.te`)."""
    on_gpu = device is not None
    answers: Dict[str, Optional[bool]] = {"cuda_device": on_gpu, "fused_attn_graph": None, "frost_plan": None}
    cudnn: Any = None
    if on_gpu and problem is not None:
        try:
            cudnn = _native.make_plan("cudnn", device, problem, cudnn_version)
            if training:
                cudnn.workspace_backward()
            answers["fused_attn_graph"] = True
        except _native.ExecutorRefused as e:
            answers["fused_attn_graph"] = False
            cudnn = e
        except (_native.ExecutorUnavailable, _native.ExecutorFailed) as e:
            cudnn = e
    return answers, cudnn


def _decide(q, k, v, layout, mask, wl, wr, br, scale, dropout_p, training, pid, on_decline, no_substitute) -> _Entry:
    call = _Call(q, k, v, layout, mask, wl, wr, br, scale, dropout_p, training)
    policy = _policy_of(pid)
    env = live_facts(q.device)
    config = call.config()
    on_gpu = q.device.type == "cuda"
    device = q.device.index if on_gpu else None
    if on_gpu and device is None:
        device = torch.cuda.current_device()
    # The cuDNN plan answers probe.fused_attn_graph and is the `cudnn` entry's plan when the
    # chain reaches it.
    probe, cudnn = _live_probes(call.problem, device, training, _cudnn_fact(env))
    config["probe"] = probe
    nd = policy._p.te_select(config, env, None)
    decision = Decision(nd)
    backend = decision.selected
    # The pack's chain for the selected backend (and variant).
    chain = tuple(nd.executor_chain)
    outcomes: List[ChainEntry] = []
    runner: Optional[_Runner] = None
    for name in chain:
        if runner is not None:
            outcomes.append(ChainEntry(name, "not_tried", ""))
            continue
        try:
            runner = _runner_for(name, call, device, cudnn, env)
            outcomes.append(ChainEntry(name, "ran", ""))
        except _native.ExecutorRefused as e:
            outcomes.append(ChainEntry(name, "refused", str(e)))
        except _native.ExecutorUnavailable as e:
            outcomes.append(ChainEntry(name, "unavailable", str(e)))
        except _native.ExecutorFailed as e:
            outcomes.append(ChainEntry(name, "unavailable", f"failed: {e}"))
    ran = next((e.executor for e in outcomes if e.outcome == "ran"), None)
    provenance = {k: s for k, (_, s) in env.items()}
    provenance.update({f"probe.{k}": ("probe" if a is not None else "default") for k, a in probe.items()})
    if q.dtype == torch.float64:
        provenance["qkv_dtype"] = "call (float64 decided as fp32: the schema has no fp64)"
    cd = CallDecision(
        pack=policy.name,
        backend=backend,
        executor=ran,
        chain=outcomes,
        decision=decision,
        substitute=ran is not None and bool(chain) and ran != chain[0],
        provenance=provenance,
        problem=repr(call.problem),
    )
    if ran is None:
        if backend is None:
            reasons = "; ".join(
                f"{b.name}: " + ", ".join(f"{r.id} {r.reason}" for r in b.declined_by)
                for b in decision.backends
                if b.declined_by
            )
            why = f"pack {policy.name} selected no backend ({reasons})"
        elif not chain:
            why = f"pack {policy.name} selected {backend}, which has no executor chain"
        else:
            why = f"pack {policy.name} selected {backend}; no executor of its chain could run: " + "; ".join(
                f"{e.executor} {e.outcome}: {e.reason}" for e in outcomes
            )
        if on_decline == 1:
            cd.fallback = why
            logger.warning("attn_policy: %s; falling back to torch SDPA", why)
            return _Entry(_SdpaFallback(call), cd)
        return _Entry(None, cd)
    if cd.substitute:
        if no_substitute:
            return _Entry(None, cd)
        logger.info("attn_policy: %s", cd.summary())
    return _Entry(runner, cd)


def _runner_for(name, call: _Call, device, cudnn, env) -> _Runner:
    if name == "frost":
        raise _native.ExecutorUnavailable(_frost_unavailable(call))
    te = _TORCH_EXECUTORS.get(name)
    if te is not None:
        ok, detail = te.available(call.device)
        if not ok:
            raise _native.ExecutorUnavailable(detail)
        why = te.check(call)
        if why:
            raise _native.ExecutorRefused(why)
        return te.runner(call)
    if call.dropout_p > 0.0:
        raise _native.ExecutorRefused("dropout is not supported by this executor")
    if name == "cudnn" and cudnn is not None:
        if isinstance(cudnn, Exception):
            raise cudnn
        return _NativeRunner(cudnn, call, host_copy=False)
    if name == "reference" and call.device.type == "cuda":
        plan = _native.make_plan(name, None, call.problem, None)
        return _NativeRunner(plan, call, host_copy=True)
    plan = _native.make_plan(name, device, call.problem, _cudnn_fact(env))
    if call.training and call.device.type == "cuda":
        plan.workspace_backward()
    return _NativeRunner(plan, call, host_copy=False)


def _raise_for(e: _Entry, no_substitute: bool) -> None:
    d = e.decision
    if d.executor is not None and d.substitute and no_substitute:
        raise SubstitutionRefused(f"substitution refused (no_substitute=True): {d.summary()}", d)
    if d.executor is None and d.fallback is None:
        raise AttentionDeclined(d.summary() + "\n" + "\n".join(
            f"  {c.executor}: {c.outcome}: {c.reason}" for c in d.chain
        ), d)


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
    if e.runner is None or (no_substitute and e.decision.substitute):
        _raise_for(e, no_substitute)
    return e.runner.forward(q, k, v)


def _bwd_impl(g, q, k, v, o, lse, layout, mask, wl, wr, br, scale, dropout_p, training, pid, on_decline, no_substitute):
    _check_backward(g, q, k, v, o, lse, layout)
    like = (q, k, v)
    q, k, v = _usable(q), _usable(k), _usable(v)
    args = (layout, mask, wl, wr, br, scale, dropout_p, training, pid, on_decline, no_substitute)
    e = _entry(q, k, v, args)
    if e.runner is None or (no_substitute and e.decision.substitute):
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


torch.library.register_autograd("attn_policy::attention", _backward, setup_context=_setup_context)


# ---------------------------------------------------------------------------------------------
# The Python entry points.


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
_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_deterministic = torch.are_deterministic_algorithms_enabled
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._len_torch_function_stack
_functorch_transform = torch._C._functorch.peek_interpreter_stack

# Eager calls by everything that decides them (tensor signatures, the grad and deterministic
# flags, the options) -> (runner, decision, whether Q/K/V need a contiguous copy first).
_fast: Dict[tuple, Tuple[_Runner, CallDecision, bool]] = {}


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
    defaults to ``1/sqrt(d)``. Returns O in ``layout`` (and the :class:`CallDecision` when
    ``return_decision``). Raises :class:`AttentionDeclined` when nothing can run the call
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


def _layout_index(layout: Any) -> int:
    if layout not in LAYOUTS:
        raise PolicyError(f"layout must be one of {', '.join(LAYOUTS)}, found {layout!r}")
    return LAYOUTS.index(layout)


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
    if e.runner is None or (no_substitute and e.decision.substitute):
        _raise_for(e, no_substitute)
    if key is not None:
        with _cache_lock:
            if len(_fast) >= _CACHE_CAP:
                _fast.clear()
            _fast[key] = (e.runner, e.decision, qu is not q or ku is not k or vu is not v)
    o = e.runner.apply(qu, ku, vu) if grad else e.runner.output(qu, ku, vu)
    return (o, e.decision) if return_decision else o


def _usable(t: torch.Tensor) -> torch.Tensor:
    """The tensor itself when its head dim is contiguous and no stride is zero or negative
    across more than one element; else a contiguous copy (an executor reads rows in place)."""
    st = t.stride()
    if st[-1] == 1 and all(s > 0 or n <= 1 for s, n in zip(st, t.shape)):
        return t
    return t.contiguous()


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


_register_host_executors()

# Context parallelism (the sequence sharded across a process group) on top of the op, in
# attn_policy.context_parallel (imported on first use: it imports this module).
_CP_NAMES = frozenset({"cp_attention", "shard_sequence", "unshard_sequence", "ContextParallelDeclined",
                       "ShardMismatch", "CPDecision"})


def __getattr__(name: str) -> Any:
    if name in _CP_NAMES:
        from . import context_parallel

        return getattr(context_parallel, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
