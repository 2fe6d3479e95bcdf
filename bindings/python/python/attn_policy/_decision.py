"""The exceptions a call of :func:`attn_policy.torch.attention` raises
(:class:`AttentionDeclined`, :class:`SubstitutionRefused`, :class:`InvalidInput`,
:class:`ShapeMismatch`); the first two hold the call's :class:`attn_policy.Explanation`. No
torch. Re-exported by :mod:`attn_policy.torch`."""

from __future__ import annotations

from typing import Any

from . import PolicyError, _native
from ._model import Explanation, deprecated_alias


class AttentionDeclined(PolicyError):
    """No executor can run this call (the policy selected no backend, or every entry of the
    chain refused or is unavailable). ``.decision`` holds the call's :class:`Explanation`."""

    def __init__(self, message: str, decision: Explanation):
        super().__init__(message)
        self.decision = decision
        self.diagnostics: list = []


class SubstitutionRefused(PolicyError):
    """``no_substitute=True`` and the backend's first executor could not run."""

    def __init__(self, message: str, decision: Explanation):
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


def __getattr__(name: str) -> Any:
    # CallDecision and ChainEntry, deprecated: attn_policy.Explanation, attn_policy.ExecutorAttempt.
    return deprecated_alias(__name__, name, ("CallDecision", "ChainEntry"))
