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

The pack decides as the installed TransformerEngine release does: :func:`get_policy` is the
pack of ``transformer_engine.__version__`` (``te@auto``; ``set_environment(te_version=...)``
overrides the installed one): ``te@2.19.0`` for 2.19.0, the nearest older pack for a release
between two (one ``UserWarning`` per process naming both), ``PolicyError`` for a release older
than 2.18.0 (naming the releases that have packs), and ``te`` without TransformerEngine.
:func:`set_policy` wins over it. A decision's ``explain()`` says which pack decided (``pack:
te@2.19.0 (from te@auto, TransformerEngine 2.19.5)``), ``to_dict()["pack_from"]`` too, and
``provenance["te_version"]`` where the release came from (docs/packs/releases.md).
"""


from __future__ import annotations

from typing import Any, Dict, Optional

from . import Decision, Policy, _environment  # noqa: F401
# The environment facts and the drop-in's policy live in attn_policy._environment (the torch op's
# live facts read them too); the public functions are this module's, as before.
from ._environment import (  # noqa: F401
    ENVIRONMENT_FACTS, _base, _lock, _set_env, _version_of, clear_environment, get_policy,
    installed_te_version, probe_environment, reprobe, set_environment, set_policy,
)


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


_frost: Optional[bool] = None


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
    from ._facts import _live_probes

    answers, _ = _live_probes(problem, torch.cuda.current_device(), training, None)
    return answers


def _te_has_frost() -> bool:
    global _frost
    if _frost is None:
        try:
            from transformer_engine.pytorch.attention.dot_product_attention import backends  # type: ignore

            _frost = hasattr(backends, "FrostAttention")
        except Exception:
            _frost = False
    return _frost


# Call arguments: the environment facts, and `probe` (answers to the probe facts); not
# `te_version`, which chooses the pack (set_environment or the installed release).
_ENVIRONMENT_KEYS = frozenset(ENVIRONMENT_FACTS + ("probe",)) - {"te_version"}


def _check_arguments(environment: Dict[str, Any]) -> None:
    if not _ENVIRONMENT_KEYS.issuperset(environment):
        import difflib

        from . import PolicyError

        unknown = [k for k in environment if k not in _ENVIRONMENT_KEYS]
        near = [m for k in unknown for m in difflib.get_close_matches(k, sorted(_ENVIRONMENT_KEYS), n=1)]
        hint = f" (did you mean {', '.join(f'`{m}`' for m in near)}?)" if near else ""
        raise PolicyError(
            f"unknown environment fact(s) {', '.join(unknown)}{hint}; known: {', '.join(ENVIRONMENT_FACTS)} "
            "(and probe)"
        )


# Values that are no AttentionParams: read through attributes, they have none of its fields, so
# every fact would silently take its default (te.select(None) decided for the defaults).
_NOT_PARAMS = (str, bytes, int, float, list, tuple, set)


def _check_params(attention_params: Any) -> None:
    if attention_params is None or isinstance(attention_params, _NOT_PARAMS):
        from . import PolicyError

        raise PolicyError(
            "attention_params must be TransformerEngine's AttentionParams (or an object with its "
            f"fields as attributes, or a dict of facts); found {type(attention_params).__name__} "
            f"{attention_params!r}"[:300]
        )


def select(attention_params: Any, **environment: Any) -> Decision:
    """The full decision for a TE ``AttentionParams`` (see the module doc for the sources of
    environment facts and probes; ``probe={...}`` gives probe answers). Raises
    ``PolicyError`` for a bad config."""
    environment.pop("frost", None)
    _check_params(attention_params)
    env = _environment._resolved
    if env is None:
        env = _base()
    if environment:
        _check_arguments(environment)
    p = _environment._policy
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
    _check_params(attention_params)
    env = _environment._resolved
    if env is None:
        env = _base()
    if environment:
        _check_arguments(environment)
    p = _environment._policy
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
    original = getattr(module, "get_attention_backend", None)
    if not callable(original):
        from . import PolicyError

        raise PolicyError(f"install: {module!r} has no get_attention_backend to replace (expected "
                          "transformer_engine.pytorch.attention.dot_product_attention.utils)")
    module.get_attention_backend = get_attention_backend
    return original
