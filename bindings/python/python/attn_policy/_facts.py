"""Live facts: what this process and device are (:func:`live_facts`), and the live answers to
the te family's probe facts (:func:`_live_probes`), shared by :func:`attn_policy.torch.attention`
and the TE drop-in (:mod:`attn_policy.te`)."""

from __future__ import annotations

import threading
from typing import Any, Dict, Optional, Tuple, Union

import torch

from . import _environment, _native


_facts_lock = threading.Lock()
_device_facts: Dict[Tuple[str, int], Dict[str, Tuple[Any, str]]] = {}


def live_facts(device: Union[str, torch.device, None] = None) -> Dict[str, Tuple[Any, str]]:
    """``fact -> (value, source)`` read from this process for ``device`` (default: the current
    CUDA device, else the CPU): the compute capability of that device, the cuDNN version torch
    loaded, installed flash-attn / cuDNN-frontend / CuTe-DSL versions (the TE drop-in's probes),
    and whether deterministic algorithms are requested. What cannot be answered is ``(None,
    "default")``; ``NVTE_*`` switches are read per decision from ``os.environ``."""
    dev = torch.device(device) if device is not None else (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    )
    key = (dev.type, dev.index or 0)
    with _facts_lock:
        cached = _device_facts.get(key)
    if cached is None:
        base = dict(_environment._base())
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
