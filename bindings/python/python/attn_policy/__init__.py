"""attn-policy: declarative, explainable attention-backend selection, in-process.

    >>> import attn_policy
    >>> policy = attn_policy.Policy.load("te")
    >>> d = policy.select({"head_dim_qk": 128, "head_dim_v": 128, "device_compute_capability": [9, 0]})
    >>> d.selected, d.provisional   # FusedAttention is preferred, pending its cuDNN probe
    ('UnfusedDotProductAttention', True)
    >>> policy.select({"head_dim_qk": 128, "head_dim_v": 128, "device_compute_capability": [9, 0],
    ...                "probe": {"fused_attn_graph": True}}).selected
    'FusedAttention'

Decisions are cached per policy, keyed by the complete fact set (see ``Policy.cache_stats``).
``policy.check(config, backend)`` checks a backend a framework chose itself; see ``CheckMode``.
The TransformerEngine drop-in is :mod:`attn_policy.te`.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _native
from ._model import BackendStatus, Decision, Decline, ExecutorAttempt, Explanation  # noqa: F401 (BackendStatus: re-exported)
from ._native import PolicyError
from ._release import installed_te_version

__all__ = [
    "Policy",
    "Decision",
    "Explanation",
    "ExecutorAttempt",
    "Verdict",
    "PolicyError",
    "PolicyViolation",
    "CheckMode",
    "embedded_packs",
    "resolve_te_release",
]

logger = logging.getLogger("attn_policy")

# The result model lives in attn_policy._model; its classes are attn_policy's, as they were.
for _cls in (BackendStatus, Decision, Decline, ExecutorAttempt, Explanation):
    _cls.__module__ = __name__
del _cls


class PolicyViolation(PolicyError):
    """Raised by ``check`` in ``enforce`` mode: the backend is not allowed here.
    ``.verdict`` holds the verdict; the message is the explanation."""

    def __init__(self, message: str, verdict: "Verdict"):
        super().__init__(message)
        self.verdict = verdict
        self.diagnostics: list = []


class CheckMode:
    """How ``Policy.check`` reacts to a backend the policy declines."""

    ENFORCE = "enforce"  # raise PolicyViolation with the explanation
    WARN = "warn"  # log a warning once per (call site, backend, rule)
    AUDIT = "audit"  # count per rule; Policy.report() summarises
    ALL = (ENFORCE, WARN, AUDIT)


def embedded_packs() -> List[str]:
    """Names of the packs compiled into the module (``te``, ...)."""
    return list(_native.embedded_packs())


def resolve_te_release(te_version: str) -> Tuple[str, Optional[str]]:
    """The pack that decides for TransformerEngine release ``te_version``, as ``te@auto``
    resolves it (the same Rust code as ``attn-policy --pack te@auto --te-version X``):
    ``(pack, warning)``, e.g. ``("te@2.19.0", None)`` for ``"2.19.0"`` and ``("te@2.19.0",
    "TransformerEngine 2.19.5 has no pack; deciding with te@2.19.0, ...")`` for ``"2.19.5"``.
    Raises ``PolicyError`` naming the releases that have packs for a release older than
    every pack (before 2.18.0) or text that is not a version. docs/packs/releases.md."""
    pack, warning = _native.resolve_release(str(te_version), "te")
    return pack, warning


def _path_arg(name: str, x: Any) -> str:
    """A pack or overlay path/name as text; anything else is a ``TypeError`` naming ``name``."""
    if isinstance(x, bytes) or not isinstance(x, (str, os.PathLike)):
        raise TypeError(f"Policy.load: {name} must be a str or os.PathLike; found {type(x).__name__} {x!r}")
    return os.fspath(x)


def _str_arg(name: str, x: Any) -> str:
    if not isinstance(x, str):
        raise TypeError(f"Policy.load: {name} must hold str; found {type(x).__name__} {x!r}")
    return x


def _list_arg(name: str, xs: Any) -> list:
    """A sequence argument as a list. A lone str or path is refused: iterated, it would be read
    one character at a time (``overlays="site.yaml"`` as overlays ``s``, ``i``, ...)."""
    if isinstance(xs, (str, bytes, os.PathLike)):
        raise TypeError(f"Policy.load: {name} must be a list; found {type(xs).__name__} {xs!r} "
                        f"(write {name}=[{xs!r}])")
    try:
        return list(xs)
    except TypeError:
        raise TypeError(f"Policy.load: {name} must be a list; found {type(xs).__name__} {xs!r}") from None


@dataclass(frozen=True)
class Verdict:
    """Outcome of ``Policy.check``: whether ``backend`` may run this call."""

    backend: str
    allowed: bool
    status: str
    selected: Optional[str]
    declined_by: List[Decline] = field(default_factory=list)
    decision: Optional[Decision] = field(default=None, compare=False, repr=False)

    def __bool__(self) -> bool:
        return self.allowed

    def explain(self) -> str:
        """The verdict in words: allowed, or every rule (or unavailable variant) that declined
        the backend, with the values it read and where the rule is."""
        if self.allowed:
            return f"{self.backend} is allowed ({self.status})"
        lines = [f"{self.backend} is not allowed here ({self.status}); the policy selects {self.selected or 'no backend'}"]
        for r in self.declined_by:
            vals = ", ".join(f"{k} = {v}" for k, v in r.values.items())
            lines.append(f"  {r.id} [{r.layer}] {r.reason}")
            lines.append(f"      {vals}  at {r.location}" if r.location else f"      {vals}")
        return "\n".join(lines)


def _unavailable_variants(nd: "_native.NativeDecision", backend: str) -> List[Decline]:
    """A backend declined by no rule but because none of its variants applies (FlashAttention
    without a flash-attn install): each variant's condition as a decline, so the verdict and
    ``report()`` say why (they said "<declined>: FlashAttention is declined")."""
    for b in nd.to_dict().get("backends", []):
        if b.get("name") == backend:
            return [
                Decline(f"{backend}:{v['name']}", f"{v['name']} not available: `{v['applicable']}` is false", "",
                        dict(v.get("values") or {}), "variant", "unavailable_variant")
                for v in b.get("unavailable_variants") or []
            ]
    return []


class _Audit:
    """Per-rule counters for ``audit`` mode (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0
        self.declined = 0
        # (backend, rule id) -> [count, reason, {fallback: count}]
        self.rules: Dict[Tuple[str, str], List[Any]] = {}
        self.warned: set = set()

    def reset(self) -> None:
        with self.lock:
            self.calls = 0
            self.declined = 0
            self.rules.clear()
            self.warned.clear()


class Policy:
    """A loaded rule pack with its decision cache. Thread-safe; share one per process."""

    def __init__(self, native: "_native.NativePolicy", check_mode: str = CheckMode.AUDIT):
        if check_mode not in CheckMode.ALL:
            raise PolicyError(f"unknown check mode `{check_mode}`; modes: {', '.join(CheckMode.ALL)}")
        self._p = native
        self.check_mode = check_mode
        self._audit = _Audit()

    @classmethod
    def load(
        cls,
        pack: Union[str, "os.PathLike[str]"] = "te",
        *,
        overlays: Sequence[Union[str, "os.PathLike[str]"]] = (),
        parity: bool = False,
        layers_off: Sequence[str] = (),
        cache_size: int = 4096,
        check_mode: str = CheckMode.AUDIT,
        te_version: Optional[str] = None,
    ) -> "Policy":
        """Loads an embedded pack by name (``"te"``, ``"te@2.19.0"``) or a folder holding
        ``pack.yaml``.

        ``overlays``: site-policy overlay files. ``parity``: switch off the ``guard`` layer
        (pure TE parity, like ``--parity``). ``"te@auto"``: the pack of the TransformerEngine
        release ``te_version`` (default: the installed ``transformer_engine.__version__``),
        or the nearest older pack (see :func:`resolve_te_release`; ``policy.pack_from`` says
        which). ``layers_off``: layer names to switch off (``["guard"]``). ``cache_size``: the
        decision cache's bound in entries. Raises ``PolicyError`` with every diagnostic
        (``.diagnostics``) when the pack does not load (an unknown pack or layer names the
        known ones), for a ``te@auto`` release older than every pack, and for a negative
        ``cache_size``; ``TypeError`` naming the argument for an argument of the wrong type
        (``overlays="site.yaml"``: a list is needed, ``overlays=["site.yaml"]``).
        """
        pack = _path_arg("pack", pack)
        overlays = [_path_arg("overlays", o) for o in _list_arg("overlays", overlays)]
        layers_off = [_str_arg("layers_off", x) for x in _list_arg("layers_off", layers_off)]
        if type(parity) is not bool:
            raise TypeError(f"Policy.load: parity must be True or False; found {parity!r}")
        if isinstance(cache_size, bool) or not isinstance(cache_size, int):
            raise TypeError(f"Policy.load: cache_size must be an int (entries); found {cache_size!r}")
        if not 0 <= cache_size < 2**63:
            raise PolicyError(f"Policy.load: cache_size must be >= 0 (entries); found {cache_size}")
        if te_version is None and pack.endswith("@auto"):
            te_version = installed_te_version()
        is_dir = os.sep in pack or pack.startswith(".") or os.path.isdir(pack)
        native = _native.NativePolicy.load(
            pack=None if is_dir else pack,
            path=pack if is_dir else None,
            overlays=overlays,
            layers_off=layers_off,
            parity=parity,
            cache_size=cache_size,
            te_version=None if te_version is None else str(te_version),
        )
        return cls(native, check_mode)

    @property
    def name(self) -> str:
        """The pack's name (``"te"``, ``"te@2.19.0"``, a folder pack's ``name:``)."""
        return self._p.name

    @property
    def pack_from(self) -> Optional[Dict[str, Any]]:
        """Set when the pack was loaded as ``te@auto``: ``{"requested": "te@auto",
        "installed": "2.19.5", "warning": ...}`` (the explanation's ``pack_from``); else
        None."""
        return self._p.pack_from

    @property
    def backend_names(self) -> List[str]:
        """The pack's backends in its order (the names ``check`` and ``Decision.status`` take)."""
        return list(self._p.backend_names)

    def select(self, config: Union[Mapping[str, Any], Any]) -> Decision:
        """Decides for one attention call. ``config`` is a dict of facts by TE's names (the
        ``config`` of a conformance record), a JSON string, or an object whose attributes are
        those facts (``vars(obj)`` is read). Raises ``PolicyError`` for a bad config."""
        if type(config) is dict or isinstance(config, str):
            return Decision(self._p.select(config))
        if isinstance(config, Mapping):
            return Decision(self._p.select(dict(config)))
        if hasattr(config, "__dict__"):
            return Decision(self._p.select(dict(vars(config))))
        raise PolicyError(f"invalid config: expected a dict of facts, found {type(config).__name__}")

    def _select_native(self, config: Any) -> "_native.NativeDecision":
        if type(config) is dict:
            return self._p.select(config)
        return self.select(config)._d

    # -- check mode ------------------------------------------------------------------------

    def check(self, config: Any, backend: str, mode: Optional[str] = None) -> Verdict:
        """Checks a backend the framework chose itself. ``mode`` (default: the policy's
        ``check_mode``): ``enforce`` raises ``PolicyViolation`` with the explanation,
        ``warn`` logs once per (call site, backend, rule), ``audit`` counts per rule for
        ``report()``. Every mode returns the ``Verdict`` when it does not raise."""
        if not isinstance(backend, str):
            raise TypeError(f"check: backend must be a backend name (str); found {type(backend).__name__} {backend!r}")
        mode = mode or self.check_mode
        if mode not in CheckMode.ALL:
            raise PolicyError(f"unknown check mode `{mode}`; modes: {', '.join(CheckMode.ALL)}")
        nd = self._select_native(config)
        status = nd.status_of(backend)
        if status is None:
            raise PolicyError(
                f"unknown backend `{backend}`; backends of pack `{self.name}`: {', '.join(self.backend_names)}"
            )
        allowed = nd.eligible(backend)
        a = self._audit
        if allowed:
            with a.lock:
                a.calls += 1
            return Verdict(backend, True, status, nd.selected, [], Decision(nd))
        declined = [Decline._from(r) for r in nd.declined_by(backend)] or _unavailable_variants(nd, backend)
        verdict = Verdict(backend, False, status, nd.selected, declined, Decision(nd))
        fallback = nd.selected or "no backend"
        with a.lock:
            a.calls += 1
            a.declined += 1
            for r in declined or [Decline(f"<{status}>", f"{backend} is {status}", "", {}, "")]:
                entry = a.rules.setdefault((backend, r.id), [0, r.reason, {}])
                entry[0] += 1
                entry[2][fallback] = entry[2].get(fallback, 0) + 1
        if mode == CheckMode.ENFORCE:
            raise PolicyViolation(verdict.explain() + "\n\n" + nd.explain(False), verdict)
        if mode == CheckMode.WARN:
            frame = sys._getframe(1)
            site = (frame.f_code.co_filename, frame.f_lineno)
            for r in declined:
                key = (site, backend, r.id)
                with a.lock:
                    if key in a.warned:
                        continue
                    a.warned.add(key)
                logger.warning(
                    "attn-policy: %s declined by %s at %s:%d: %s (falls back to %s)",
                    backend, r.id, site[0], site[1], r.reason, fallback,
                )
        return verdict

    def report(self) -> str:
        """Summary of ``check`` calls: for every rule that declined a checked backend, the
        share of calls it affected and where they fell back to."""
        a = self._audit
        with a.lock:
            calls, declined = a.calls, a.declined
            rules = sorted(a.rules.items(), key=lambda kv: -kv[1][0])
        if calls == 0:
            return "no calls checked"
        lines = [f"{calls} calls checked; {declined} ({100.0 * declined / calls:.0f}%) were declined by the policy"]
        for (backend, rid), (count, reason, fallbacks) in rules:
            top = max(fallbacks.items(), key=lambda kv: kv[1])[0]
            lines.append(
                f"{100.0 * count / calls:.0f}% of calls ({count}) fell back from {backend} to {top} because of {rid}: {reason}"
            )
        return "\n".join(lines)

    def report_dict(self) -> Dict[str, Any]:
        """The ``report()`` data: calls, declined, and per (backend, rule) counts and fallbacks."""
        a = self._audit
        with a.lock:
            return {
                "calls": a.calls,
                "declined": a.declined,
                "rules": [
                    {"backend": b, "rule": r, "count": c, "reason": reason, "fallbacks": dict(fb)}
                    for (b, r), (c, reason, fb) in a.rules.items()
                ],
            }

    def reset_report(self) -> None:
        """Zeroes the ``check`` counters that ``report()`` summarises."""
        self._audit.reset()

    # -- cache -----------------------------------------------------------------------------

    def cache_stats(self) -> Dict[str, int]:
        """Decision cache counters: hits, misses, inserts, evictions, len, capacity."""
        return dict(self._p.cache_stats())

    def cache_clear(self) -> None:
        """Empties the decision cache and zeroes its counters (``cache_stats``)."""
        self._p.cache_clear()

    def __repr__(self) -> str:
        return f"<attn_policy.Policy {self.name!r} backends={self.backend_names}>"
