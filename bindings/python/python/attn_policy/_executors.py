"""Executors provided by torch (``torch_flash``, ``torch_math``, ``torch_efficient``,
``torch_cudnn``): whether each can run here and whether it accepts a call; registered with the
native registry as the Python host's on import. Also why ``frost`` cannot run inside Python,
and :func:`executors` (every executor with its availability)."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

import torch

from . import _environment, _native
from ._call import _Call
from ._kernel_runners import _CudnnSdpaRunner, _EfficientRunner, _FlashRunner
from ._runners import _MathRunner, _Runner


def _aten(name: str) -> Optional[Any]:
    return getattr(torch.ops.aten, name, None)


# torch_flash and torch_efficient serve padded and packed batches unless this variable is 0
# (read once, by the Rust manifests: adapters/src/host.rs `torch_varlen_enabled`).
VARLEN_ENV = "ATTN_POLICY_TORCH_VARLEN"
VARLEN_SWITCHABLE = ("torch_flash", "torch_efficient")


class _TorchExecutor:
    """An executor torch provides. ``check`` returns the reason it refuses a call, or None.
    The gates every one shares are here (a CUDA device and its aten op, the manifest, no
    dropout); each executor adds its own in ``_available`` / ``_check``."""

    name = ""
    description = ""
    # The aten op it calls: without it (or without CUDA tensors) it cannot run. None: torch
    # tensor ops on any device.
    aten_op: Optional[str] = None

    def available(self, device: torch.device) -> Tuple[bool, str]:
        if self.aten_op is not None:
            if device.type != "cuda":
                return False, "runs on a CUDA device; the tensors are on the CPU"
            if _aten(self.aten_op) is None:
                return False, f"this torch has no aten::{self.aten_op}"
        return self._available(device)

    def _available(self, device: torch.device) -> Tuple[bool, str]:
        raise NotImplementedError

    def check(self, call: "_Call") -> Optional[str]:
        r = call.problem.refusal_by_manifest(self.name)
        if r:
            if (call.packing and self.name in VARLEN_SWITCHABLE and "per-sequence lengths" in r
                    and os.environ.get(VARLEN_ENV) == "0"):
                r += f" (switched off by {VARLEN_ENV}=0)"
            return r
        if call.dropout_p > 0.0:
            return "dropout is not wired into this executor"
        return self._check(call)

    def _check(self, call: "_Call") -> Optional[str]:
        return None

    def runner(self, call: "_Call") -> "_Runner":
        raise NotImplementedError


class _TorchFlash(_TorchExecutor):
    """``aten::_flash_attention_forward/backward``: FlashAttention-2 built into PyTorch, on
    ``bshd`` views (zero-copy for every layout: only the logical order changes), with the
    kernel's own log-sum-exp. Padded and packed batches through its ``cum_seq_q/k``
    (attn_policy/_varlen.py)."""

    name = "torch_flash"
    description = "PyTorch's FlashAttention-2 kernel"
    aten_op = "_flash_attention_forward"

    def _available(self, device: torch.device) -> Tuple[bool, str]:
        if not torch.backends.cuda.is_flash_attention_available():
            return False, "this torch build has no FlashAttention kernels"
        cc = torch.cuda.get_device_capability(device)
        if cc < (8, 0):
            return False, f"compute capability {cc[0]}.{cc[1]} < 8.0"
        return True, f"torch {torch.__version__}, sm_{cc[0]}{cc[1]}"

    def _check(self, call: "_Call") -> Optional[str]:
        # FlashAttention's diagonal is bottom-right (in each sequence's own coordinates with
        # cu_seqlens): top-left only coincides where s_q == s_kv.
        top_left = not call.bottom_right and (call.mask != 0 or call.window_left >= 0 or call.window_right >= 0)
        if top_left and call.packing:
            # Sequences without a query or a key do not run (their rows are empty either way).
            for i, (lq, lkv) in enumerate(zip(call.seqlens_q, call.seqlens_kv)):
                if lq and lkv and lq != lkv:
                    return (f"FlashAttention aligns masks bottom-right in each sequence; a top-left mask differs "
                            f"where a sequence's query and key lengths differ (sequence {i}: {lq} and {lkv})")
        elif top_left and call.sq != call.skv:
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

    def _available(self, device: torch.device) -> Tuple[bool, str]:
        return True, f"torch {torch.__version__}"

    def runner(self, call: "_Call") -> "_Runner":
        return _MathRunner(call)


class _TorchEfficient(_TorchExecutor):
    """``aten::_efficient_attention_forward/backward``: the memory-efficient (CUTLASS) kernel in
    PyTorch, on ``bshd`` views, with its own log-sum-exp (which it pads to a multiple of 32
    rows: the op keeps ``[b, h, s_q]`` and pads again for the backward). Padded and packed
    batches through its ``cu_seqlens_q/k`` (attn_policy/_varlen.py); there a causal mask runs
    top-left in each sequence's own coordinates, and bottom-right only where every running
    sequence is square (the kernel's own bottom-right is not per sequence: the gate)."""

    name = "torch_efficient"
    description = "PyTorch's memory-efficient attention kernel"
    aten_op = "_efficient_attention_forward"

    def _available(self, device: torch.device) -> Tuple[bool, str]:
        if not torch.backends.cuda.is_flash_attention_available():
            # Built together with the flash kernels (USE_MEM_EFF_ATTENTION in PyPI's wheels).
            return False, "this torch build has no fused attention kernels"
        cc = torch.cuda.get_device_capability(device)
        return True, f"torch {torch.__version__}, sm_{cc[0]}{cc[1]}"

    def _check(self, call: "_Call") -> Optional[str]:
        if call.window_left >= 0 or (call.mask == 0 and call.window_right >= 0):
            return "sliding windows are not wired into this executor"
        if call.packing and call.mask != 0 and call.bottom_right:
            # Measured on an H100 (torch 2.11, tests/gpu/test_gpu_torch_varlen.py): with
            # cu_seqlens the kernel's bottom-right diagonal (custom_mask_type 2) is not each
            # sequence's own; O was off by O(1). Square sequences have one diagonal (top-left).
            for i, (lq, lkv) in enumerate(zip(call.seqlens_q, call.seqlens_kv)):
                if lq and lkv and lq != lkv:
                    return (f"the memory-efficient kernel's bottom-right diagonal is not per sequence with "
                            f"cu_seqlens; it differs where a sequence's query and key lengths differ "
                            f"(sequence {i}: {lq} and {lkv})")
        return None

    def runner(self, call: "_Call") -> "_Runner":
        return _EfficientRunner(call)


class _TorchCudnn(_TorchExecutor):
    """``aten::_scaled_dot_product_cudnn_attention`` and its backward: PyTorch's own cuDNN
    SDPA (``bhsd`` views), with its log-sum-exp."""

    name = "torch_cudnn"
    description = "PyTorch's cuDNN attention"
    aten_op = "_scaled_dot_product_cudnn_attention"

    def _available(self, device: torch.device) -> Tuple[bool, str]:
        if not torch.backends.cudnn.is_available():
            return False, "torch has no cuDNN here"
        cc = torch.cuda.get_device_capability(device)
        return True, f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, sm_{cc[0]}{cc[1]}"

    def runner(self, call: "_Call") -> "_Runner":
        return _CudnnSdpaRunner(call)


_TORCH_EXECUTORS: Dict[str, _TorchExecutor] = {
    e.name: e for e in (_TorchFlash(), _TorchMath(), _TorchEfficient(), _TorchCudnn())
}


def _frost_unavailable(call: "_Call") -> str:
    """Why ``frost`` cannot run this call inside Python, precisely: the wheel has no FROST
    executor, and what else would decline it here (frontend / CuTe DSL versions, the engine
    switch, the device's compute capability and direction)."""
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
        call.problem, call.training, cc, _environment._version_of("nvidia-cudnn-frontend"),
        _environment._version_of("nvidia-cutlass-dsl"),
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


# On import (of this module, so of attn_policy.torch and attn_policy.context_parallel alike): the
# host's answers for the torch executors, on the current device.
_register_host_executors()
