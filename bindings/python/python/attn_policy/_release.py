"""The installed TransformerEngine release (``te@auto``, docs/packs/releases.md), read by
:meth:`attn_policy.Policy.load` and the TE drop-in's default policy
(:mod:`attn_policy._environment`)."""

from __future__ import annotations

import importlib.util
import sys
from typing import Optional


def installed_te_version() -> Optional[str]:
    """``transformer_engine.__version__`` of this process (TransformerEngine is imported here
    if it is installed and not yet imported), or None without TransformerEngine."""
    te = sys.modules.get("transformer_engine")
    if te is None:
        try:
            if importlib.util.find_spec("transformer_engine") is None:
                return None
            import transformer_engine as te  # type: ignore
        except Exception:
            return None
    version = getattr(te, "__version__", None)
    return None if version is None else str(version)
