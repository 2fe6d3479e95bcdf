"""A drop-in for TransformerEngine's attention-backend selector.

    from attn_policy import te
    (use_flash, flash_backend, use_fused, fused_backend, use_unfused, available) = \\
        te.get_attention_backend(attention_params)

``attention_params`` is TE's ``AttentionParams`` (duck-typed: its attributes are read, and may
be TE's own objects: torch dtypes, tensor classes, ``torch.Size``, recipe objects in
``fp8_meta``, an ``InferenceParams`` object) or a conformance record's plain ``config`` (a dict,
or a ``SimpleNamespace`` built from it).

Environment facts the object lacks (``device_compute_capability``, ``cudnn_version``,
``flash_attn_versions``, ``cudnn_frontend_version``, ``cutlass_dsl_version``, ``env``
switches) come from, in order: keyword arguments of the call, :func:`set_environment`, live
probes (torch, installed packages; run once per process and cached, see :func:`reprobe`), and
the schema defaults. ``NVTE_*`` switches are read from the process environment on every call.
``decision.provenance`` / ``explain()`` / ``to_dict()["provenance"]`` say where each came from.

Probe facts (``probe.cuda_device``, ``probe.fused_attn_graph``, ``probe.frost_plan``: "would
cuDNN build this graph here") are answered live, by the same code as
:func:`attn_policy.torch.attention`: ``cuda_device`` is whether torch sees a CUDA device, and
``fused_attn_graph`` is whether the ``cudnn`` executor builds the graph the call's facts describe
(forward, and backward when ``is_training``) on the current CUDA device with the libcudnn this
process loaded. A probe that cannot be answered (no torch, no GPU, facts the executors do not
express such as FP8, THD or a bias, ``frost_plan`` always) stays unknown, never "supported"; the
decision's provenance says which were measured (``probe``) and which stayed unknown
(``default``). Answers are cached with the decision per input (:func:`reprobe` forgets them).
``probe={...}`` (a keyword of :func:`select` / :func:`get_attention_backend`, or a ``probe``
attribute of the params object) gives them instead, e.g. ``probe={"cuda_device": True,
"fused_attn_graph": True, "frost_plan": True}`` for a conformance run that replays TE's answers.
(Before this, unanswered probes were answered "supported".)
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, Optional, Tuple

from . import Decision, Policy

__all__ = [
    "get_attention_backend",
    "select",
    "set_environment",
    "clear_environment",
    "probe_environment",
    "reprobe",
    "set_policy",
    "get_policy",
    "ENVIRONMENT_FACTS",
]

#: Facts that describe the machine rather than the call.
ENVIRONMENT_FACTS = (
    "device_compute_capability",
    "cudnn_version",
    "flash_attn_versions",
    "cudnn_frontend_version",
    "cutlass_dsl_version",
    "env",
)

_lock = threading.Lock()
_policy: Optional[Policy] = None
_set_env: Dict[str, Any] = {}
_probed: Optional[Dict[str, Tuple[Any, str]]] = None
# The resolved (value, source) per environment fact without call arguments; rebuilt when
# set_environment / reprobe change it.
_resolved: Optional[Dict[str, Tuple[Any, str]]] = None
_frost: Optional[bool] = None


def set_policy(policy: Optional[Policy]) -> None:
    """Uses ``policy`` for the drop-in (default: the embedded ``te`` pack)."""
    global _policy
    with _lock:
        _policy = policy


def get_policy() -> Policy:
    global _policy
    p = _policy
    if p is None:
        with _lock:
            if _policy is None:
                _policy = Policy.load("te")
            p = _policy
    return p


def set_environment(**facts: Any) -> None:
    """Sets environment facts for every later call (``device_compute_capability=(9, 0)``,
    ``cudnn_version=(9, 12, 0)``, ``flash_attn_versions={"v2": "2.8.3"}``,
    ``env={"NVTE_FLASH_ATTN": "0"}``, ...). ``None`` removes a fact set earlier."""
    global _resolved
    unknown = [k for k in facts if k not in ENVIRONMENT_FACTS]
    if unknown:
        from . import PolicyError

        raise PolicyError(
            f"set_environment: unknown environment fact(s) {', '.join(unknown)}; known: {', '.join(ENVIRONMENT_FACTS)}"
        )
    with _lock:
        for k, v in facts.items():
            if v is None:
                _set_env.pop(k, None)
            else:
                _set_env[k] = v
        _resolved = None


def clear_environment() -> None:
    """Forgets every fact given to :func:`set_environment`."""
    global _resolved
    with _lock:
        _set_env.clear()
        _resolved = None


def _version_of(dist: str) -> Optional[str]:
    try:
        from importlib import metadata
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    try:
        return metadata.version(dist)
    except Exception:
        return None


def probe_environment() -> Dict[str, Tuple[Any, str]]:
    """Live probes: ``(value, "probe")`` for what could be measured here, ``(value,
    "default")`` where it could not (no torch, no GPU). Does not read ``NVTE_*`` switches
    (those are read per call)."""
    out: Dict[str, Tuple[Any, str]] = {}
    torch = None
    try:
        import torch  # type: ignore
    except Exception:
        torch = None
    cc = None
    cudnn = None
    if torch is not None:
        try:
            if torch.cuda.is_available():
                cc = list(torch.cuda.get_device_capability())
        except Exception:
            cc = None
        try:
            v = torch.backends.cudnn.version()
            if v:
                # 91200 -> (9, 12, 0) (cuDNN >= 9 encodes major*10000 + minor*100 + patch)
                cudnn = [v // 10000, (v % 10000) // 100, v % 100] if v >= 10000 else [v // 1000, (v % 1000) // 100, v % 100]
        except Exception:
            cudnn = None
    if cc is not None:
        out["device_compute_capability"] = (cc, "probe")
    else:
        out["device_compute_capability"] = (None, "default")
    if cudnn is not None:
        out["cudnn_version"] = (cudnn, "probe")
    else:
        out["cudnn_version"] = (None, "default")
    fa = {
        "v2": _version_of("flash-attn"),
        "v3": _version_of("flash-attn-3") or _version_of("flash_attn_3"),
        "v4": _version_of("flash-attn-4") or _version_of("flash_attn_4"),
    }
    out["flash_attn_versions"] = (fa, "probe")
    out["cudnn_frontend_version"] = (_version_of("nvidia-cudnn-frontend"), "probe")
    out["cutlass_dsl_version"] = (_version_of("nvidia-cutlass-dsl"), "probe")
    return out


def reprobe() -> None:
    """Runs the live probes again on the next call (after installing a package, say); forgets
    the drop-in's cached decisions, whose probe answers were measured before."""
    global _probed, _resolved
    with _lock:
        _probed = None
        _resolved = None
        p = _policy
    if p is not None:
        p.cache_clear()


def _probe(problem: Any, training: bool) -> Dict[str, Optional[bool]]:
    """Live answers to the probe facts for the executor problem a call's facts describe (None:
    they describe none the executors express), on the current CUDA device. The same code as
    :func:`attn_policy.torch.attention`'s probes; without torch every probe stays unknown."""
    try:
        import torch  # type: ignore

        on_gpu = bool(torch.cuda.is_available())
    except Exception:
        return {}
    if not on_gpu:
        # No GPU: whether cuDNN could build the graph on one is not measurable here.
        return {"cuda_device": False}
    from . import torch as _apt

    answers, _ = _apt._live_probes(problem, torch.cuda.current_device(), training, None)
    return answers


def _base() -> Dict[str, Tuple[Any, str]]:
    """(value, source) per environment fact from set_environment, probes and defaults."""
    global _probed, _resolved
    r = _resolved
    if r is not None:
        return r
    probed = _probed if _probed is not None else probe_environment()
    with _lock:
        _probed = probed
        res: Dict[str, Tuple[Any, str]] = {}
        for k in ENVIRONMENT_FACTS:
            if k in _set_env:
                res[k] = (_set_env[k], "set_environment")
            elif k in probed:
                res[k] = probed[k]
        _resolved = res
    return res


def _te_has_frost() -> bool:
    global _frost
    if _frost is None:
        try:
            from transformer_engine.pytorch.attention.dot_product_attention import backends  # type: ignore

            _frost = hasattr(backends, "FrostAttention")
        except Exception:
            _frost = False
    return _frost


# Call arguments: the environment facts, and `probe` (answers to the probe facts).
_ENVIRONMENT_KEYS = frozenset(ENVIRONMENT_FACTS + ("probe",))


def _check_arguments(environment: Dict[str, Any]) -> None:
    if not _ENVIRONMENT_KEYS.issuperset(environment):
        from . import PolicyError

        unknown = [k for k in environment if k not in _ENVIRONMENT_KEYS]
        raise PolicyError(
            f"unknown environment fact(s) {', '.join(unknown)}; known: {', '.join(ENVIRONMENT_FACTS)} (and probe)"
        )


def select(attention_params: Any, **environment: Any) -> Decision:
    """The full decision for a TE ``AttentionParams`` (see the module doc for the sources of
    environment facts and probes; ``probe={...}`` gives probe answers). Raises
    ``PolicyError`` for a bad config."""
    environment.pop("frost", None)
    env = _resolved
    if env is None:
        env = _base()
    if environment:
        _check_arguments(environment)
    p = _policy
    if p is None:
        p = get_policy()
    # Keyword arguments count as (value, "argument") over `env`; read in Rust. Probe facts
    # neither the object nor `probe=` gives are answered by `_probe`.
    return Decision(p._p.te_select(attention_params, env, environment, _probe))


def get_attention_backend(attention_params: Any, **environment: Any) -> tuple:
    """TE's ``get_attention_backend``: returns ``(use_flash_attention,
    flash_attention_backend, use_fused_attention, fused_attention_backend,
    use_unfused_attention, available_backends)``, plus ``use_frost_attention`` when the FROST
    backend is enabled: ``frost=True`` here, or auto-detected once from the installed TE (it
    has ``FrostAttention``). ``probe={...}`` gives probe answers (else they are measured, see
    the module doc). ``flash_attention_backend`` is the flash-attn version string
    (TE: a ``packaging.version.Version``), ``fused_attention_backend`` the sub-backend
    number (TE: ``NVTE_Fused_Attn_Backend``), or None."""
    frost = environment.pop("frost", None)
    env = _resolved
    if env is None:
        env = _base()
    if environment:
        _check_arguments(environment)
    p = _policy
    if p is None:
        p = get_policy()
    nd = p._p.te_select(attention_params, env, environment, _probe)
    if frost is None:
        frost = _frost if _frost is not None else _te_has_frost()
    return nd.te_tuple(bool(frost))


def install(module: Any = None) -> Any:
    """Replaces TE's selector with this drop-in (see docs/integrations/transformer_engine.md).
    Returns the function it replaced, so it can be restored."""
    if module is None:
        from transformer_engine.pytorch.attention.dot_product_attention import utils as module  # type: ignore
    original = module.get_attention_backend
    module.get_attention_backend = get_attention_backend
    return original

