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

Padded batches: the mask function gives ``None`` or the 2-D ``[b, s_kv]`` padding mask, which
becomes per-sequence lengths and the padding side (``seqlens_q`` / ``seqlens_kv``,
``padding="right"`` or ``"left"``), never a dense mask. The key lengths are each row's valid
tokens; the query lengths are the valid tokens among the mask's last ``s_q`` columns (like
transformers' FlashAttention path: KV-cache decoding and chunked prefill, ``s_q < s_kv``). The
conversion is cached per mask object, so one forward reads the lengths to the host once (every
layer gets the same mask). A mask whose valid tokens are not one contiguous run at the same side
of every row is declined with that reason. Logit soft-capping (``softcap``, Gemma 2) and
gpt-oss's learnable sinks (``s_aux``, a ``[h_q]`` parameter, passed as ``sink``: its gradient
flows back) go to :func:`attn_policy.torch.attention` as features.

Declined, with the reason: what no executor serves (:func:`attn_policy.torch.attention`
declines it) and a padding mask of another shape. ``on_decline="fallback"`` runs torch SDPA
on a mask built from the same kinds (and the padding mask) instead, logged, where the call has
no soft-capping and no sink (SDPA computes neither: such a call is declined).

``log_decisions=True`` records, per layer and call, which backend the policy selected and
which executor ran (and why a substitute ran) in :data:`decision_log`, and logs it at INFO on
``attn_policy.transformers``.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from . import Policy, PolicyError
from . import torch as apt
from ._call import _flag

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
    the name to pass as ``attn_implementation``. ``policy``: an :class:`attn_policy.Policy`
    (default: the embedded ``te`` pack with live facts); ``on_decline`` and ``no_substitute``
    as in :func:`attn_policy.torch.attention`; ``log_decisions``: log each new decision on the
    ``attn_policy`` logger. Bad options raise ``PolicyError`` here, not at the model's first
    forward."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    if on_decline not in ("raise", "fallback"):
        raise PolicyError(f"on_decline must be raise or fallback, found {on_decline!r}")
    if policy is not None and not isinstance(policy, Policy):
        raise PolicyError(f"register: policy must be an attn_policy.Policy or None; found "
                          f"{type(policy).__name__} {policy!r}")
    log_decisions, no_substitute = _flag("log_decisions", log_decisions), _flag("no_substitute", no_substitute)
    _options.update(policy=policy, log=log_decisions, on_decline=on_decline, no_substitute=no_substitute)
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, flash_attention_mask)
    return NAME


# The padding mask -> lengths conversion of the latest masks, by identity (a forward passes the
# same mask object to every layer of a kind): (weak reference, s_q, s_kv) -> result.
_MASK_CACHE: Dict[int, Tuple[Any, int, int, tuple]] = {}
_MASK_CACHE_CAP = 8


def _padding_of(mask: torch.Tensor, sq: int, skv: int) -> tuple:
    """``("right" | "left", seqlens_q, seqlens_kv)`` of a 2-D padding mask ``[b, s_kv]``, or
    ``(None, why)`` for one that is not a padded batch; cached per mask object."""
    hit = _MASK_CACHE.get(id(mask))
    if hit is not None and hit[0]() is mask and hit[1] == sq and hit[2] == skv:
        return hit[3]
    out = _padding_uncached(mask, sq, skv)
    if len(_MASK_CACHE) >= _MASK_CACHE_CAP:
        _MASK_CACHE.clear()
    try:
        _MASK_CACHE[id(mask)] = (weakref.ref(mask), sq, skv, out)
    except TypeError:  # not weakly referenceable: not cached
        pass
    return out


def _padding_uncached(mask: torch.Tensor, sq: int, skv: int) -> tuple:
    if mask.dim() != 2 or mask.shape[1] != skv:
        return (None, f"a padding mask of shape {tuple(mask.shape)} for {skv} keys (a 2-D [b, s_kv] mask is "
                      "taken; a static cache longer than the mask is not)")
    valid = mask.to(torch.bool)
    n = valid.sum(1)
    j = torch.arange(skv, device=mask.device)[None]
    right = (valid == (j < n[:, None])).all()
    left = (valid == (j >= (skv - n)[:, None])).all()
    nq = valid[:, skv - sq:].sum(1) if sq <= skv else n
    # One read to the host: kv lengths, query lengths, both sides' verdicts.
    host = torch.cat([n, nq, right[None].long(), left[None].long()]).tolist()
    b = valid.shape[0]
    lkv, lq, is_right, is_left = tuple(host[:b]), tuple(host[b:2 * b]), host[2 * b], host[2 * b + 1]
    if sq > skv:
        return (None, f"more queries ({sq}) than keys ({skv}) with a padding mask")
    if is_right:
        return ("right", lq, lkv)
    if is_left:
        return ("left", lq, lkv)
    return (None, "the padding mask's valid tokens are not one contiguous run at the same side (right or left) "
                  "of every sequence")


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
    s_aux = kwargs.get("s_aux")
    features: Dict[str, Any] = {}
    declined = None
    if attention_mask is not None:
        pad = _padding_of(attention_mask, query.shape[2], key.shape[2])
        if pad[0] is None:
            declined = pad[1]
        else:
            features.update(padding=pad[0], seqlens_q=pad[1], seqlens_kv=pad[2])
    if softcap:
        features["softcap"] = float(softcap)
    if s_aux is not None:
        features["sink"] = s_aux
    fallback = _options["on_decline"] == "fallback"
    # SDPA computes neither soft-capping nor a sink: such a call is never run by it.
    sdpa_ok = not softcap and s_aux is None
    if declined is not None:
        why = f"attn_policy declined: {declined}"
        if not (fallback and sdpa_ok):
            raise apt.AttentionDeclined(why, None)  # type: ignore[arg-type]
        logger.warning("attn_policy: %s; falling back to torch SDPA", declined)
        o = _sdpa_fallback(query, key, value, attention_mask, causal, window_left, scaling, dropout)
        return o.transpose(1, 2).contiguous(), None
    try:
        out = apt.attention(
            query, key, value, layout="bhsd", is_causal=causal, diagonal="bottom_right",
            window=(window_left, 0 if causal else -1) if window_left >= 0 else None,
            scale=scaling, dropout_p=dropout, policy=_options["policy"],
            # A call with features is never run by torch SDPA inside attention(): declined, and
            # the padded batch falls back here on the padding mask.
            on_decline="raise" if features else _options["on_decline"], no_substitute=_options["no_substitute"],
            return_decision=_options["log"], **features,
        )
    except apt.AttentionDeclined as e:
        if not (features and fallback and sdpa_ok):
            raise
        logger.warning("attn_policy: %s; falling back to torch SDPA", str(e).splitlines()[0])
        o = _sdpa_fallback(query, key, value, attention_mask, causal, window_left, scaling, dropout)
        return o.transpose(1, 2).contiguous(), None
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
