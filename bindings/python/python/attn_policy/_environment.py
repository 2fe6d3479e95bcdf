"""The environment facts of this process, shared by the TE drop-in (:mod:`attn_policy.te`, which
re-exports the public functions) and the torch op's live facts (:mod:`attn_policy._facts`):
facts given to :func:`set_environment`, live probes of torch and the installed packages (run
once per process, :func:`reprobe`), and the policy the drop-in decides with
(:func:`set_policy`, :func:`get_policy`). No torch needed: a probe without it stays unknown.

The default policy is the pack of the installed TransformerEngine release (``te@auto``,
docs/packs/releases.md): :func:`installed_te_version` reads ``transformer_engine.__version__``
(imported lazily), the Rust resolver chooses the pack, a release without its own pack decides
with the nearest older one and one ``warnings.warn`` per process, and one older than every
pack raises ``PolicyError``. Without TransformerEngine the default is the ``te`` pack."""

from __future__ import annotations

import threading
import warnings
from typing import Any, Dict, Optional, Set, Tuple

from . import Policy
from ._release import installed_te_version


#: Facts that describe the machine rather than the call.
ENVIRONMENT_FACTS = (
    "device_compute_capability",
    "cudnn_version",
    "flash_attn_versions",
    "cudnn_frontend_version",
    "cutlass_dsl_version",
    "env",
    "te_version",
)

_lock = threading.Lock()
_policy: Optional[Policy] = None
# Whether _policy is the default (chosen for the installed release), not set_policy's.
_policy_is_default = False
# The te@auto warnings already given (once per process each).
_warned_releases: Set[str] = set()
_set_env: Dict[str, Any] = {}
_probed: Optional[Dict[str, Tuple[Any, str]]] = None
# The resolved (value, source) per environment fact without call arguments; rebuilt when
# set_environment / reprobe change it.
_resolved: Optional[Dict[str, Tuple[Any, str]]] = None


def set_policy(policy: Optional[Policy]) -> None:
    """Uses ``policy`` for the drop-in; ``None`` goes back to the default: the pack of the
    installed TransformerEngine release (``te@auto``), or ``te`` without TransformerEngine."""
    global _policy, _policy_is_default
    with _lock:
        _policy = policy
        _policy_is_default = False


def _default_policy() -> Policy:
    """The pack of the installed TransformerEngine release (``te@auto``), with its warning
    once per process; ``te`` without TransformerEngine. Raises ``PolicyError`` for a release
    older than every pack, or one that is not a version."""
    te_version = _te_version_fact()
    if te_version is None:
        return Policy.load("te")
    policy = Policy.load("te@auto", te_version=te_version)
    warning = (policy.pack_from or {}).get("warning")
    if warning and warning not in _warned_releases:
        _warned_releases.add(warning)
        warnings.warn(f"attn_policy: {warning}", UserWarning, stacklevel=4)
    return policy


def _te_version_fact() -> Optional[str]:
    """The ``te_version`` fact: :func:`set_environment`'s, else the installed release."""
    given = _set_env.get("te_version")
    return str(given) if given is not None else installed_te_version()


def get_policy() -> Policy:
    """The drop-in's policy: :func:`set_policy`'s, else the default (see
    :func:`set_policy`)."""
    global _policy, _policy_is_default
    p = _policy
    if p is None:
        with _lock:
            if _policy is None:
                _policy = _default_policy()
                _policy_is_default = True
            p = _policy
    return p

def set_environment(**facts: Any) -> None:
    """Sets environment facts for every later call (``device_compute_capability=(9, 0)``,
    ``cudnn_version=(9, 12, 0)``, ``flash_attn_versions={"v2": "2.8.3"}``,
    ``env={"NVTE_FLASH_ATTN": "0"}``, ...). ``None`` removes a fact set earlier.
    ``te_version="2.19.0"`` stands for the installed TransformerEngine release: the default
    policy becomes that release's pack (``te@auto``; see :func:`get_policy`)."""
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
        if "te_version" in facts:
            _forget_default_policy()


def _forget_default_policy() -> None:
    """The default policy is chosen again on next use (the release may have changed); a
    policy given to :func:`set_policy` stays. Called with ``_lock`` held."""
    global _policy, _policy_is_default
    if _policy_is_default:
        _policy = None
        _policy_is_default = False


def clear_environment() -> None:
    """Forgets every fact given to :func:`set_environment`."""
    global _resolved
    with _lock:
        _set_env.clear()
        _resolved = None
        _forget_default_policy()


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
    # Chooses the drop-in's pack (te@auto); no rule reads it.
    te_version = installed_te_version()
    out["te_version"] = (te_version, "probe") if te_version is not None else (None, "default")
    return out


def reprobe() -> None:
    """Runs the live probes again on the next call (after installing a package, say); forgets
    the drop-in's cached decisions, whose probe answers were measured before."""
    global _probed, _resolved
    with _lock:
        _probed = None
        _resolved = None
        p = _policy
        _forget_default_policy()
    if p is not None:
        p.cache_clear()


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
