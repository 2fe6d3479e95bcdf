"""Hugging Face transformers integration: ``attn_implementation="attn_policy"``.

    import attn_policy.transformers
    attn_policy.transformers.register(log_decisions=True)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="attn_policy")

:func:`register` adds ``attn_policy`` to transformers' ``AttentionInterface`` (the function
below) and to its ``AttentionMaskInterface`` (transformers' FlashAttention mask function:
``None`` unless a sequence is padded), so causal and sliding-window layers reach the
executors as mask kinds (``is_causal``, ``sliding_window``), never as dense tensors. Like
transformers' FlashAttention path, the causal diagonal is bottom-right (KV-cache decoding:
``s_q < s_kv``) and a ``sliding_window`` of ``W`` keys is the window ``(W - 1, 0)``.

Declined (with the reason; ``on_decline="fallback"`` runs torch SDPA on a mask built from the
same kinds instead, logged): padded batches (a 2-D padding mask), logit soft-capping,
attention sinks, and anything :func:`attn_policy.torch.attention` declines.

``log_decisions=True`` records, per layer and call, which backend the policy selected and
which executor ran (and why a substitute ran) in :data:`decision_log`, and logs it at INFO on
``attn_policy.transformers``.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F

from . import Policy, PolicyError
from . import torch as apt

__all__ = ["register", "attention_forward", "decision_log", "NAME"]

NAME = "attn_policy"
logger = logging.getLogger("attn_policy.transformers")

#: Per-layer records of ``(layer, backend, executor, substitute, summary)`` when logging.
decision_log: List[Dict[str, Any]] = []

_options: Dict[str, Any] = {"policy": None, "log": False, "on_decline": "raise", "no_substitute": False}


def register(
    *,
    policy: Optional[Policy] = None,
    log_decisions: bool = False,
    on_decline: str = "raise",
    no_substitute: bool = False,
) -> str:
    """Registers ``attn_policy`` with transformers (attention and mask functions) and returns
    the name to pass as ``attn_implementation``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    if on_decline not in ("raise", "fallback"):
        raise PolicyError(f"on_decline must be raise or fallback, found {on_decline!r}")
    _options.update(policy=policy, log=log_decisions, on_decline=on_decline, no_substitute=no_substitute)
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, flash_attention_mask)
    return NAME


def _sdpa_fallback(query, key, value, padding, causal, window_left, scaling, dropout):
    """SDPA with a boolean mask built from the kinds (and a padding mask, when given)."""
    sq, skv = query.shape[2], key.shape[2]
    i = torch.arange(sq, device=query.device).unsqueeze(1) + (skv - sq)
    j = torch.arange(skv, device=query.device).unsqueeze(0)
    allowed = torch.ones(sq, skv, dtype=torch.bool, device=query.device)
    if causal:
        allowed &= j <= i
    if window_left >= 0:
        allowed &= j >= i - window_left
    mask = allowed[None, None]
    if padding is not None:
        mask = mask & padding[:, None, None, -skv:].to(torch.bool)
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    sliding_window: Optional[int] = None,
    softcap: Optional[float] = None,
    is_causal: Optional[bool] = None,
    **kwargs: Any,
):
    """transformers' attention-function signature: ``query``/``key``/``value`` are
    ``[b, h, s, d]`` (``h_kv`` heads for key and value), the result is ``([b, s, h, d],
    None)``."""
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    window_left = int(sliding_window) - 1 if sliding_window else -1
    declined = []
    if attention_mask is not None:
        declined.append("a padded batch (a 2-D padding mask) needs per-sequence lengths")
    if softcap:
        declined.append(f"logit soft-capping ({softcap}) is not supported by the executors")
    if kwargs.get("s_aux") is not None:
        declined.append("attention sinks (s_aux) are not supported by the executors")
    if declined:
        why = "; ".join(declined)
        if _options["on_decline"] != "fallback":
            raise apt.AttentionDeclined(f"attn_policy declined: {why}", None)  # type: ignore[arg-type]
        logger.warning("attn_policy: %s; falling back to torch SDPA", why)
        o = _sdpa_fallback(query, key, value, attention_mask, causal, window_left, scaling, dropout)
        return o.transpose(1, 2).contiguous(), None
    out = apt.attention(
        query, key, value, layout="bhsd", is_causal=causal, diagonal="bottom_right",
        window=(window_left, 0 if causal else -1) if window_left >= 0 else None,
        scale=scaling, dropout_p=dropout, policy=_options["policy"],
        on_decline=_options["on_decline"], no_substitute=_options["no_substitute"],
        return_decision=_options["log"],
    )
    if _options["log"]:
        o, d = out
        rec = {
            "layer": getattr(module, "layer_idx", None),
            "backend": d.backend,
            "executor": d.executor,
            "substitute": d.substitute,
            "summary": d.summary(),
        }
        decision_log.append(rec)
        logger.info("layer %s: %s", rec["layer"], rec["summary"])
    else:
        o = out
    return o.transpose(1, 2).contiguous(), None
