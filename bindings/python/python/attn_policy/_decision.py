"""What :func:`attn_policy.torch.attention` decided for one call, and its errors: the chain's
entries (:class:`ChainEntry`), the decision (:class:`CallDecision`), and the exceptions a call
raises (:class:`AttentionDeclined`, :class:`SubstitutionRefused`, :class:`InvalidInput`,
:class:`ShapeMismatch`). No torch: plain data. Re-exported by :mod:`attn_policy.torch`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from . import Decision, PolicyError, _native


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
# The decision of one call.


@dataclass(frozen=True)
class ChainEntry:
    """One executor of the chain and what happened to it: ``ran``, ``refused`` (the executor
    does not do this problem), ``unavailable`` (it cannot run in this process), ``failed`` (its
    check or plan step raised an error: the next entry runs as a substitute) or ``not_tried``
    (an earlier entry ran, or ``no_substitute`` ended the walk)."""

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
    # no_substitute=True and the chain's first entry could not run: nothing was tried after it.
    substitution_refused: bool = False

    def summary(self) -> str:
        """``selected FlashAttention; ran on chunked (substitute: torch_flash: ...)``."""
        if self.backend is None:
            head = f"pack {self.pack} selected no backend"
        else:
            head = f"pack {self.pack} selected {self.backend}"
        if self.executor is None:
            tail = "no executor ran"
            if self.substitution_refused:
                tail += " (no_substitute=True: only the chain's first entry may run)"
            if self.fallback:
                tail += f"; fell back to torch SDPA ({self.fallback})"
            return f"{head}; {tail}"
        if not self.substitute:
            return f"{head}; ran on {self.executor}"
        why = "; ".join(f"{e.executor}: {e.reason}" for e in self.chain if e.outcome in ("refused", "unavailable", "failed"))
        return f"{head}; ran on {self.executor} (substitute: {why})"

    def to_dict(self) -> Dict[str, Any]:
        """The call document (``attn-policy/call/v1``, docs/schema/call-v1.json), built by the
        Rust explanation model: the shape ``attn-policy run --json`` prints. ``decision`` is the
        ``explain/v1`` document with this call's ``executor_chain`` and ``provenance``."""
        if self.decision is None:
            raise ValueError("this CallDecision has no decision to describe")
        return self.decision._d.call_dict(
            [(e.executor, e.outcome, e.reason) for e in self.chain],
            list(self.provenance.items()),
            self.fallback,
        )

    def __str__(self) -> str:
        return self.summary()
