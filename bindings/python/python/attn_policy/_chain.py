"""The chain walk and the per-signature cache. A call is decided once per input signature: the
policy selects a backend with the call's and the process's facts, the pack's executor chain for
it is walked (the first entry that is available and accepts the problem runs; every entry's
outcome is recorded), and the runner and the call's :class:`Explanation` are cached. Also the pack chains
(:func:`executor_chain`), policies by id (the op takes an int) and the cache's counters."""

from __future__ import annotations

import logging
import threading
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from . import Decision, Policy, _environment, _native, eager_node
from ._call import _Call
from ._decision import AttentionDeclined, SubstitutionRefused
from ._executors import _TORCH_EXECUTORS, _frost_unavailable
from ._facts import _cudnn_fact, _device_facts, _live_probes, live_facts
from ._model import Explanation
from ._runners import _NativeRunner, _Runner, _SdpaFallback

# The decisions' log records keep the name of the public module.
logger = logging.getLogger("attn_policy.torch")


# ---------------------------------------------------------------------------------------------
# Executor chains: the pack's data (`executors:` in pack.yaml).


_packs: Dict[str, Policy] = {}


def executor_chain(policy: Union[Policy, str, None], backend: str, variant: Optional[str] = None) -> Tuple[str, ...]:
    """The ordered executors that may run ``backend`` of ``policy`` (a :class:`Policy`, the
    name of an embedded pack, or None for the ``te`` pack), as the pack declares them
    (``executors:`` in its pack.yaml; a ``variant``'s own chain wins where it has one),
    ``if_admitted:`` entries included: a decision's ``executor_chain`` leaves those out where
    the executor's manifest does not admit the call. Of the chain a decision runs, the first
    entry is the backend's own executor and the rest are substitutes. Empty: nothing can run
    it."""
    if policy is None:
        policy = _environment.get_policy()
    elif isinstance(policy, str):
        p = _packs.get(policy)
        if p is None:
            p = _packs.setdefault(policy, Policy.load(policy))
        policy = p
    elif not isinstance(policy, Policy):
        raise TypeError(f"executor_chain: policy must be an attn_policy.Policy, a pack name or None; found "
                        f"{type(policy).__name__}")
    return tuple(policy._p.executor_chain(backend, variant))


# ---------------------------------------------------------------------------------------------
# Policies by id (the op takes an int), the per-signature cache.

_policies: List[Policy] = []
_policy_ids: Dict[int, int] = {}
_policies_lock = threading.Lock()


def _policy_id(policy: Optional[Policy]) -> int:
    if policy is None:
        return 0
    key = id(policy)
    pid = _policy_ids.get(key)
    if pid is None:
        with _policies_lock:
            if key not in _policy_ids:
                _policies.append(policy)
                _policy_ids[key] = len(_policies)
            pid = _policy_ids[key]
    return pid


def _policy_of(pid: int) -> Policy:
    if pid == 0:
        return _environment.get_policy()
    return _policies[pid - 1]


class _Entry:
    __slots__ = ("runner", "decision", "note")

    def __init__(self, runner: Optional[_Runner], decision: Explanation, note: Optional[str] = None):
        # note: why a declined call was not run otherwise either (added to the error's message).
        self.runner, self.decision, self.note = runner, decision, note


_cache: Dict[tuple, _Entry] = {}
_cache_lock = threading.Lock()
_CACHE_CAP = 4096
_stats = {"hits": 0, "misses": 0}


# Eager calls by everything that decides them (tensor signatures, the grad and deterministic
# flags, the options) -> (runner, decision, whether Q/K/V need a contiguous copy first).
_fast: Dict[tuple, Tuple[_Runner, Explanation, bool]] = {}


def cache_info() -> Dict[str, int]:
    """Per-signature cache counters (hits, misses, entries)."""
    return {"hits": _stats["hits"], "misses": _stats["misses"], "entries": len(_cache)}


def clear_cache() -> None:
    """Forgets every cached decision and plan (after changing ``NVTE_*`` or installing a
    package, say) and the eager node's choice (``ATTN_POLICY_EAGER_NODE`` is read again)."""
    with _cache_lock:
        _cache.clear()
        _fast.clear()
        _device_facts.clear()
        _stats["hits"] = _stats["misses"] = 0
    eager_node.reset()
    _environment.reprobe()


def _key(q, k, v, args) -> tuple:
    # Every tensor's dtype and device: a plan reads its inputs' memory as the problem says.
    return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
            q.device, k.device, v.device, torch.are_deterministic_algorithms_enabled(), args)


def _entry(q, k, v, args) -> _Entry:
    key = _key(q, k, v, args)
    e = _cache.get(key)
    if e is not None:
        _stats["hits"] += 1
        return e
    e = _decide(q, k, v, *args)
    with _cache_lock:
        if len(_cache) >= _CACHE_CAP:
            _cache.clear()
        _cache[key] = e
        _stats["misses"] += 1
    return e


def _decide(q, k, v, layout, mask, wl, wr, br, scale, dropout_p, training, pid, on_decline, no_substitute,
            softcap=0.0, softmax=0, packing=0, seqlens_q=(), seqlens_kv=()) -> _Entry:
    call = _Call(q, k, v, layout, mask, wl, wr, br, scale, dropout_p, training, softcap, softmax, packing,
                 seqlens_q, seqlens_kv)
    policy = _policy_of(pid)
    env = live_facts(q.device)
    config = call.config()
    on_gpu = q.device.type == "cuda"
    device = q.device.index if on_gpu else None
    if on_gpu and device is None:
        device = torch.cuda.current_device()
    # The cuDNN plan answers probe.fused_attn_graph and is the `cudnn` entry's plan when the
    # chain reaches it.
    probe, cudnn = _live_probes(call.problem, device, training, _cudnn_fact(env))
    config["probe"] = probe
    nd = policy._p.te_select(config, env, None)
    decision = Decision(nd)
    backend = decision.selected
    # The pack's chain for the selected backend (and variant).
    chain = tuple(nd.executor_chain)
    # The one chain walk (Rust's, as `attn-policy run` walks it): the first entry whose checks
    # and plan step pass runs; a refusal, an unavailable executor or a failed check or plan
    # moves on to the next entry, a substitute. The walk stops early with no_substitute.
    index, walked, ended, runner = _native.walk_chain(
        backend or "", list(chain), bool(no_substitute),
        lambda name: _runner_for(name, call, device, cudnn, env))
    ran = chain[index] if index is not None else None
    provenance = {k: s for k, (_, s) in env.items()}
    provenance.update({f"probe.{k}": ("probe" if a is not None else "default") for k, a in probe.items()})
    if q.dtype == torch.float64:
        provenance["qkv_dtype"] = "call (float64 decided as fp32: the schema has no fp64)"

    def account(fallback: Optional[str] = None) -> Explanation:
        # The walk's entries as Rust returned them, into the native call object.
        return Explanation(_native.NativeCall(
            nd, walked, list(provenance.items()), fallback=fallback,
            substitution_refused=ended == "substitution_refused", problem=repr(call.problem),
        ), decision)

    if ended == "substitution_refused":
        # no_substitute: the backend's own executor cannot run (raised, never a fallback).
        return _Entry(None, account())
    if ran is None:
        if backend is None:
            reasons = "; ".join(
                f"{b.name}: " + ", ".join(f"{r.id} {r.reason}" for r in b.declined_by)
                for b in decision.backends
                if b.declined_by
            )
            why = f"pack {policy.name} selected no backend ({reasons})"
        elif not chain:
            why = f"pack {policy.name} selected {backend}, which has no executor chain"
        else:
            why = f"pack {policy.name} selected {backend}; no executor of its chain could run: " + "; ".join(
                f"{n} {o}: {r}" for n, o, r in walked
            )
        if on_decline == 1 and call.has_features:
            # Torch SDPA computes none of them: declined, never run without the feature.
            return _Entry(None, account(), "the torch SDPA fallback (on_decline='fallback') does not compute "
                          + ", ".join(call.features()))
        if on_decline == 1:
            logger.warning("attn_policy: %s; falling back to torch SDPA", why)
            return _Entry(_SdpaFallback(call), account(why))
        return _Entry(None, account())
    cd = account()
    if cd.substitute:
        # Once per call signature: the decision is cached per signature.
        logger.warning("attn_policy: %s", cd.summary())
    return _Entry(runner, cd)


def _runner_for(name, call: _Call, device, cudnn, env) -> _Runner:
    if name == "frost":
        raise _native.ExecutorUnavailable(_frost_unavailable(call))
    te = _TORCH_EXECUTORS.get(name)
    if te is not None:
        ok, detail = te.available(call.device)
        if not ok:
            raise _native.ExecutorUnavailable(detail)
        why = te.check(call)
        if why:
            raise _native.ExecutorRefused(why)
        return te.runner(call)
    if call.dropout_p > 0.0:
        raise _native.ExecutorRefused("dropout is not supported by this executor")
    if name == "cudnn" and cudnn is not None:
        if isinstance(cudnn, Exception):
            raise cudnn
        return _NativeRunner(cudnn, call, host_copy=False)
    if name == "reference" and call.device.type == "cuda":
        plan = _native.make_plan(name, None, call.problem, None)
        return _NativeRunner(plan, call, host_copy=True)
    plan = _native.make_plan(name, device, call.problem, _cudnn_fact(env))
    if call.training and call.device.type == "cuda":
        plan.workspace_backward()
    return _NativeRunner(plan, call, host_copy=False)


def _raise_for(e: _Entry, no_substitute: bool) -> None:
    d = e.decision
    if no_substitute and d.substitution_refused:
        raise SubstitutionRefused(f"substitution refused (no_substitute=True): {d.summary()}\n" + "\n".join(
            f"  {c.executor}: {c.outcome}: {c.reason}" for c in d.chain
        ), d)
    if d.executor is None and d.fallback is None:
        raise AttentionDeclined(d.summary() + "\n" + "\n".join(
            f"  {c.executor}: {c.outcome}: {c.reason}" for c in d.chain
        ) + (f"\n  {e.note}" if e.note else ""), d)
