"""The result model, no torch: :class:`Decision` (a policy's decision for a config: the
``explain/v1`` document), and :class:`Explanation`, the one account of a call that the package
returns (``attn_policy.torch.attention``, ``attn_policy.context_parallel.cp_attention`` and
``attn_policy.sdpa.explain_sdpa``): a thin class over the native call object
(``_native.NativeCall``), whose ``to_dict()`` is the ``attn-policy/call/v1`` document that
``attn-policy run --json`` prints, built in Rust. Its chain entries are
:class:`ExecutorAttempt`. The names of the classes it replaces (``CallDecision``,
``ChainEntry``, ``CPDecision``, ``SdpaDecision``) stay importable for one release, deprecated
(:func:`deprecated_alias`). Re-exported by :mod:`attn_policy`."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

from . import _native
from ._native import PolicyError


@dataclass(frozen=True)
class Decline:
    """One rule that declined a backend."""

    id: str
    reason: str
    location: str
    values: Dict[str, Any]
    layer: str
    kind: str = "decline"

    @classmethod
    def _from(cls, j: Mapping[str, Any]) -> "Decline":
        return cls(
            id=j["id"],
            reason=j["reason"],
            location=j["location"],
            values=dict(j.get("values") or {}),
            layer=j["layer"],
            kind=j.get("kind", "decline"),
        )


@dataclass(frozen=True)
class BackendStatus:
    """A backend's status in a decision, with every rule that declined it."""

    name: str
    status: str
    variant: Optional[Dict[str, Any]]
    declined_by: List[Decline]
    pending: List[Decline]

    def __getitem__(self, key: str) -> Any:  # dict-style access, as in to_dict()
        return getattr(self, key)


class Decision:
    """The outcome of ``Policy.select``: ``.selected``, ``.backends``, ``.explain()``,
    ``.to_dict()`` (the CLI's ``explain --json``), ``.te_tuple()``."""

    __slots__ = ("_d", "_dict")

    def __init__(self, native: "_native.NativeDecision"):
        self._d = native
        self._dict: Optional[Dict[str, Any]] = None

    @property
    def selected(self) -> Optional[str]:
        """The selected backend, or None when no backend can serve the call."""
        return self._d.selected

    @property
    def provisional(self) -> bool:
        """An earlier backend in the preference order awaits a probe answer."""
        return self._d.provisional

    @property
    def backends(self) -> List[BackendStatus]:
        """Every backend of the pack with its status and declining rules."""
        return [
            BackendStatus(
                name=b["name"],
                status=b["status"],
                variant=b.get("variant"),
                declined_by=[Decline._from(r) for r in b.get("declined_by", [])],
                pending=[Decline._from(r) for r in b.get("pending", [])],
            )
            for b in self.to_dict()["backends"]
        ]

    @property
    def provenance(self) -> Dict[str, str]:
        """For TE drop-in decisions: where each environment fact came from
        (object, argument, set_environment, probe, os.environ, default)."""
        return dict(self._d.provenance)

    def status(self, backend: str) -> Optional[str]:
        """``backend``'s status in this decision (``"selected"``, ``"eligible"``,
        ``"declined"``, ``"undecided"``, ...), or None for a name the pack does not have."""
        return self._d.status_of(backend)

    def explain(self, color: bool = False) -> str:
        """The CLI's human text (``attn-policy explain``)."""
        return self._d.explain(color)

    def to_dict(self) -> Dict[str, Any]:
        """The ``attn-policy/explain/v1`` document (``attn-policy explain --json``)."""
        if self._dict is None:
            self._dict = self._d.to_dict()
        return self._dict

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON text (the CLI's ``explain --json``)."""
        return self._d.to_json()

    def te_tuple(self, frost: bool = False) -> tuple:
        """TransformerEngine's return tuple (6 values; 7 with ``use_frost_attention``)."""
        return self._d.te_tuple(frost)

    def __repr__(self) -> str:
        return repr(self._d)

    def __str__(self) -> str:
        return self.explain()


# ---------------------------------------------------------------------------------------------
# The account of one call.


#: The ``torch`` pack's backends in torch.nn.attention.SDPBackend terms (``attn_policy.sdpa.BACKENDS``).
SDPA_BACKENDS = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
}


class SdpaError(PolicyError):
    """The call cannot be explained by the ``torch`` pack (an input PyTorch's CUDA choice
    does not model, or facts that cannot be read); the message says which and why."""


SdpaError.__module__ = "attn_policy.sdpa"


@dataclass(frozen=True)
class ExecutorAttempt:
    """One executor of the chain and what happened to it: ``ran``, ``refused`` (the executor
    does not do this problem), ``unavailable`` (it cannot run in this process), ``failed`` (its
    check or plan step raised an error: the next entry runs as a substitute) or ``not_tried``
    (an earlier entry ran, or ``no_substitute`` ended the walk). ``reason`` is "" where none."""

    executor: str
    outcome: str
    reason: str = ""


class Explanation:
    """What was decided, and what ran, for one call: the one result of the package.

    ``kind`` says which call: ``"call"`` (:func:`attn_policy.torch.attention`: the policy's
    decision and the executor chain as walked), ``"context_parallel"``
    (:func:`attn_policy.context_parallel.cp_attention` on one rank: the ``native`` pack's
    pre-flight, with ``comm_type``, ``cp_size``, ``cp_rank``, ``steps`` (each distinct per-step
    call's Explanation), ``work`` and ``declined``) or ``"sdpa"``
    (:func:`attn_policy.sdpa.explain_sdpa`: PyTorch's own choice, with ``sdp_backend``,
    ``facts`` and ``assumptions``; nothing runs).

    Every kind has ``pack``, ``backend``, ``executor``, ``substitute``, ``executor_chain``
    (:class:`ExecutorAttempt` entries; ``chain`` is the same list), ``fallback``,
    ``provenance``, ``decision`` (the :class:`Decision`), ``summary()`` and ``to_dict()``: the
    ``attn-policy/call/v1`` document (docs/schema/call-v1.json) that ``attn-policy run
    --json`` prints, a kind's own fields in its ``extra``. All of it is read from the native
    call object, built once per call signature."""

    __slots__ = ("_n", "_decision", "_steps", "_work")

    def __init__(self, native: "_native.NativeCall", decision: Optional[Decision] = None,
                 steps: Any = (), work: Any = ()):
        self._n = native
        # The Decision over native.decision (kept: it caches its document).
        if decision is None and native.decision is not None:
            decision = Decision(native.decision)
        self._decision = decision
        self._steps: List[Explanation] = list(steps)
        self._work: list = list(work)

    # -- every kind --------------------------------------------------------------------------

    @property
    def kind(self) -> str:
        """``call``, ``context_parallel`` or ``sdpa``."""
        return self._n.kind

    @property
    def pack(self) -> str:
        """The name of the pack that decided the call (``"te"``, ``"native"``, ...)."""
        return self._n.pack

    @property
    def backend(self) -> Optional[str]:
        """The selected backend, or None."""
        return self._n.backend

    @property
    def selected(self) -> Optional[str]:
        """The selected backend (``backend``); for SDPA ``flash``, ``efficient``, ``cudnn``,
        ``math``, or None (PyTorch raises "No available kernel")."""
        return self._n.backend

    @property
    def executor(self) -> Optional[str]:
        """The executor that ran, or None."""
        return self._n.executor

    @property
    def substitute(self) -> bool:
        """The executor that ran is not the chain's first entry."""
        return self._n.substitute

    @property
    def executor_chain(self) -> List[ExecutorAttempt]:
        """The chain as walked: every entry and its outcome."""
        return [ExecutorAttempt(e, o, r) for e, o, r in self._n.executor_chain]

    chain = executor_chain

    @property
    def decision(self) -> Optional[Decision]:
        """The policy's :class:`Decision` (for a context-parallel call, the pre-flight)."""
        return self._decision

    @property
    def provenance(self) -> Dict[str, str]:
        """Where each fact came from."""
        return dict(self._n.provenance)

    @property
    def fallback(self) -> Optional[str]:
        """Why nothing of the chain ran and torch SDPA ran instead (``on_decline="fallback"``)."""
        return self._n.fallback

    @property
    def substitution_refused(self) -> bool:
        """``no_substitute=True`` and the chain's first entry could not run."""
        return self._n.substitution_refused

    @property
    def problem(self) -> str:
        """The executor problem the call ran as, in words (shapes, mask, dtype, features)."""
        return self._n.problem

    @property
    def error(self) -> Optional[str]:
        """The document's ``error``: why nothing ran, or None."""
        return self._n.error

    @property
    def extra(self) -> Optional[Dict[str, Any]]:
        """The document's ``extra``: a kind's own fields, or None for one attention call."""
        return self._n.extra

    def _x(self, key: str, default: Any = None) -> Any:
        return self._n.fields.get(key, default)

    @property
    def facts(self) -> Dict[str, Any]:
        """The facts the decision was made on (its config: TransformerEngine's names for a
        call, the ``torch`` pack's for SDPA)."""
        d = self._decision
        config = d._d.config if d is not None else None
        return dict(config) if isinstance(config, dict) else {}

    # -- context parallelism -----------------------------------------------------------------

    @property
    def preflight(self) -> Optional[Decision]:
        """The ``native`` pack's pre-flight decision on the whole context-parallel call."""
        return self._decision if self.kind == "context_parallel" else None

    @property
    def comm_type(self) -> Optional[str]:
        """Context parallelism: the algorithm, ``cp_comm_type`` (``"p2p"``, ...); else None."""
        return self._x("comm_type")

    @property
    def cp_size(self) -> Optional[int]:
        """Context parallelism: the number of ranks the sequence is sharded over; else None."""
        return self._x("cp_size")

    @property
    def cp_rank(self) -> Optional[int]:
        """Context parallelism: this process's rank in the group; else None."""
        return self._x("cp_rank")

    @property
    def declined(self) -> str:
        """Why the context-parallel call did not run ("" when it ran)."""
        return self._x("declined") or ""

    @property
    def steps(self) -> List["Explanation"]:
        """Each distinct per-step call of a context-parallel call."""
        return list(self._steps)

    @property
    def work(self) -> list:
        """A context-parallel call's ``StepWork`` on this rank, step by step."""
        return list(self._work)

    # -- SDPA --------------------------------------------------------------------------------

    @property
    def sdp_backend(self) -> Optional[str]:
        """The selection as a ``torch.nn.attention.SDPBackend`` member name."""
        return self._x("sdp_backend")

    @property
    def assumptions(self) -> Dict[str, str]:
        """Facts that could not be read from this PyTorch and were assumed (name -> how)."""
        return dict(self._x("assumptions") or {})

    def eligible(self, backend: str) -> bool:
        """Whether ``backend`` would run if it were the only one enabled."""
        return self._decision is not None and self._decision.status(backend) in ("selected", "outranked")

    def reasons(self, backend: str) -> List[Dict[str, Any]]:
        """Every rule that declined ``backend``, in the pack's check order (for SDPA the
        first is the warning PyTorch prints when the backend is forced): id, reason, values."""
        if self._decision is not None:
            for b in self._decision.to_dict()["backends"]:
                if b["name"] == backend:
                    return list(b["declined_by"])
        error = SdpaError if self.kind == "sdpa" else PolicyError
        names = SDPA_BACKENDS if self.kind == "sdpa" else [b.name for b in (self._decision.backends if self._decision else [])]
        raise error(f"unknown backend `{backend}`; backends: {', '.join(names)}")

    def first_reasons(self) -> Dict[str, str]:
        """Per declined backend, the id of the first declining rule."""
        names = list(SDPA_BACKENDS) if self.kind == "sdpa" else [
            b.name for b in (self._decision.backends if self._decision else [])]
        out = {}
        for b in names:
            r = self.reasons(b)
            if r:
                out[b] = r[0]["id"]
        return out

    # -- text and document -------------------------------------------------------------------

    def explain(self, color: bool = False) -> str:
        """The decision's text (``attn-policy explain``), with the assumptions made."""
        text = self._decision.explain(color) if self._decision is not None else self.summary() + "\n"
        assumptions = self.assumptions
        if assumptions:
            text += "\nassumed: " + "; ".join(f"{k}: {v}" for k, v in assumptions.items()) + "\n"
        return text

    def summary(self) -> str:
        """One line: ``pack te selected FlashAttention; ran on chunked (substitute: ...)``."""
        kind = self.kind
        if kind == "context_parallel":
            return self._cp_summary()
        head = f"pack {self.pack} selected {self.backend or 'no backend'}"
        if kind == "sdpa":
            return f"{head} (torch SDPA: {self.sdp_backend or 'no available kernel'})"
        executor = self.executor
        if executor is None:
            tail = "no executor ran"
            if self.substitution_refused:
                tail += " (no_substitute=True: only the chain's first entry may run)"
            fallback = self.fallback
            if fallback:
                tail += f"; fell back to torch SDPA ({fallback})"
            return f"{head}; {tail}"
        if not self.substitute:
            return f"{head}; ran on {executor}"
        why = "; ".join(f"{e.executor}: {e.reason}" for e in self.chain
                        if e.outcome in ("refused", "unavailable", "failed"))
        return f"{head}; ran on {executor} (substitute: {why})"

    def _cp_summary(self) -> str:
        work = self._work
        calls = sum(len(s.blocks) for s in work)
        skipped = sum(s.pairs_skipped for s in work)
        ex = sorted({d.executor or "none" for d in self._steps})
        head = f"context parallel {self.comm_type}, cp_size {self.cp_size}, rank {self.cp_rank}"
        if self.declined:
            return f"{head}: declined: {self.declined}"
        pre = self._decision
        return (f"{head}: native pre-flight admitted ({pre.selected if pre else '-'}); "
                f"{len(work)} step(s), {calls} call(s), {skipped} chunk pair(s) skipped; executors {', '.join(ex)}")

    def to_dict(self) -> Dict[str, Any]:
        """The call document (``attn-policy/call/v1``, docs/schema/call-v1.json), built by the
        Rust explanation model: the shape ``attn-policy run --json`` prints. ``decision`` is
        the ``explain/v1`` document with this call's ``executor_chain`` and ``provenance``;
        ``extra`` a context-parallel call's or an SDPA explanation's own fields. Raises
        ValueError where nothing was decided (a context-parallel call refused first)."""
        return self._n.to_dict()

    def to_json(self) -> str:
        """:meth:`to_dict` as compact JSON text."""
        return self._n.to_json()

    def __str__(self) -> str:
        return self.explain() if self.kind == "sdpa" else self.summary()

    def __repr__(self) -> str:
        return f"<attn_policy.Explanation {self.kind}: {self.summary()}>"


# ---------------------------------------------------------------------------------------------
# The names of the classes Explanation replaces: importable for one release, deprecated.


DEPRECATED = {
    "CallDecision": ("Explanation", Explanation),
    "ChainEntry": ("ExecutorAttempt", ExecutorAttempt),
    "CPDecision": ("Explanation", Explanation),
    "SdpaDecision": ("Explanation", Explanation),
}
_warned: set = set()


def deprecated_alias(module: str, name: str, names: Any) -> Any:
    """``module.name``, a deprecated alias (a module's ``__getattr__`` calls this with the
    deprecated ``names`` it has): the class that replaces it, with a ``DeprecationWarning`` the
    first time the name is read from that module. AttributeError for any other name."""
    if name not in names:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    new_name, new = DEPRECATED[name]
    if (module, name) not in _warned:
        _warned.add((module, name))
        warnings.warn(
            f"{module}.{name} is deprecated and will be removed in the next release: use "
            f"attn_policy.{new_name} (the one result model: docs/torch.md)",
            DeprecationWarning, stacklevel=3,
        )
    return new
