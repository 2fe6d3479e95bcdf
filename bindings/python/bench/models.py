"""Model families end to end through ``attn_implementation="attn_policy"`` (issue 33).

Each family is transformers' own model class from a reduced config with random weights (no
download), bf16 on the GPU, keeping the family's attention features:

=========== ===================================================================================
llama3      Llama 3: GQA (8 query heads per 2 KV heads), head_dim 128
qwen3       Qwen 3: GQA, head_dim 128, q/k RMS norm
mistral     Mistral: GQA, sliding window on every layer
gemma2      Gemma 2: attn_logit_softcapping 50.0, alternating sliding/global layers, head_dim 256
gemma3      Gemma 3: head_dim 256, 5:1 sliding/global layers
gemma4      Gemma 4: sliding layers head_dim 256, global layer head_dim 512 (as gemma4_train.py)
gpt-oss     gpt-oss: learnable attention sinks, alternating sliding/global layers, MoE
deepseek-v3 DeepSeek V3: MLA, qk head dim 192 (nope 128 + rope 64), v head dim 128, MoE
=========== ===================================================================================

The two MoE families route every token to all 4 of their experts (top-4 of 4). With top-2 of
4, a difference in the last bit of the attention output flips some token's expert choice, and
the generated logits then differ by several ulps between any two implementations: on the H100
(2026-12-06) the two SDPA references of DeepSeek-V3 differed by 0.62 and those of gpt-oss by
2.3, against 0.125 (one bf16 ulp) in the dense families, so the logit bound measured the
router, not the attention. Top-4 of 4 keeps the routers, the experts and their weighting, and
makes the output a continuous function of the attention again.

``--tiny`` keeps every feature at small sizes (head dims 16..32, 2-3 layers, sequence 48) so
that ``--tiny --device cpu`` runs all families in a few minutes on two cores (CI:
bindings/test.sh). The CPU runs float32 by default (``--dtype``): in bf16 the CPU's SDPA
kernels (flash, math) and transformers' eager all keep float32 intermediates, so two CPU
references share their roundings and their gap understates the step-to-step noise that
attn_policy's float64 reference executor shows (measured: 1-3x the gap, family by family and
learning rate by learning rate, no systematic direction); in float32 any difference of meaning
(a mask, a cap, a sink) stands far above the rounding.

Per family, three training runs of the same initial weights on the same right-padded batches
of mixed lengths (labels -100 on the padding), AdamW with warm-up and clipping, a few fixed
batches cycled (so the runs memorise them): ``attn_policy`` and two references, two
transformers implementations that compute the same model (``--refs``):

- ``sdpa`` under two SDPA backends (``torch.nn.attention.sdpa_kernel``): the memory-efficient
  one on CUDA (flash on the CPU) and math, where the first can run every layer alone;
- else ``eager`` and ``eager_fp32`` (soft-capping: gemma2; sinks: gpt-oss; MLA's 192/128 head
  dims on the CPU, where flash needs equal ones). ``eager`` is transformers' own eager
  function of the model (Gemma 2's takes the softmax in float32, gpt-oss's in the model dtype);
  ``eager_fp32`` is that same function on float32 copies of q, k, v and the mask, its output
  cast back (registered under that name, _e2e.eager_fp32_attention): scores, soft-capping,
  sinks, softmax and weighted sum all in float32. In float32 models the two are one.

Checks (a failed one fails the family; the script exits 1 when any family fails):
1. loss, at every step i, on shared weights: attn_policy trains, and before each of its steps
   both references compute the loss of attn_policy's weights of that step on that step's batch
   (training mode, no gradient). ``|loss_ap - loss_ref2| <= 1.5 x max(G_i, floor_i)`` with
   ``G_i`` the largest gap ``|loss_ref1 - loss_ref2|`` within ``--gap-window`` steps of i
   (default 5) and ``floor_i = --loss-floor x max(1, |loss_ref2|)`` (default 5e-4). The anchor
   is the second reference because it is the float32 one (SDPA's math backend upcasts bf16 on
   CUDA; ``eager_fp32``): attn_policy's deviation from it and the bf16 first reference's are
   the same kind of rounding error, as in the FlashAttention criterion. Why shared weights:
   three free-running trainings diverge chaotically after a few steps (Adam turns rounding
   differences into different updates), so a per-step comparison of free runs measures the
   chaos, not the attention: on the H100 (stop 41) five families had 1-3 steps of 100 past
   1.5x that way, with the second reference just as far from the first at other steps. The
   free-running ratio is still reported (``free_running_max_ratio``), not checked. Why the
   window: the gap at one step is one sample of a spread (``--gap-window 0``: that step's own
   gap). Why the floor: at the first steps, and in float32, the references can agree exactly;
2. no decline and no SDPA fallback: declines raise (``on_decline="raise"``), a logged fallback
   fails; an executor-chain substitute (logged) is allowed and reported;
3. greedy ``generate()`` with a KV cache of a LEFT-padded batch of 4 prompts (prefixes of the
   longest training rows, of different lengths) with the weights attn_policy trained
   (memorised, so the continuation has clear margins) gives the first reference's tokens, and
   its logits at the generated steps differ from the second (float32) reference's by at most
   1.5 x the first reference's difference (floor ``--logit-floor`` x max(1, largest logit): 1e-2 in
   bf16, 1e-4 in float32). The tokens alone passed with the padding mask dropped from
   attn_policy's calls (a memorised model outvotes the pads; right padding under a causal mask
   hides them in training); the logits caught it (1400x the bound). On ``--tiny --device
   cpu``, the shared-weights loss check (1) catches a sliding window one key wider (mistral,
   133x the bound), a dropped soft-cap (gemma2 with the tiny cap of 1, 21x: a cap of 50 never
   bites a tiny random model) and a dropped sink (gpt-oss, 79x); the logits check catches each
   too (925-3658x).
Reported: per-layer decisions of the first step (``attn_policy.transformers.register(
log_decisions=True)``), median step time and peak memory of attn_policy against the first
reference, and how many generated tokens equal the training continuation.

    python bindings/python/bench/models.py [--family llama3 --family gemma2] [--budget-s 480]
        [--json out.json] [--pack te] [--tiny] [--device cpu|cuda] [--steps 100]

``--budget-s``: families that would start past the budget (wall seconds since the start) are
reported ``skipped``, as is a family whose first reference run shows that its other two
would end past it. ``--unpadded`` is a diagnostic (no padding anywhere), not the check.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import _e2e  # noqa: E402

FAMILIES = ["llama3", "qwen3", "mistral", "gemma2", "gemma3", "gemma4", "gpt-oss", "deepseek-v3"]
VOCAB = {False: 8192, True: 128}


def alternate(n, first="sliding_attention"):
    other = "full_attention" if first == "sliding_attention" else "sliding_attention"
    return [first if i % 2 == 0 else other for i in range(n)]


def family(name, tiny):
    """(model class, config, features, reference kind) of a family; ``tiny``: the CPU sizes."""
    V = VOCAB[tiny]
    common = dict(vocab_size=V, attention_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=None,
                  max_position_embeddings=4096, tie_word_embeddings=False)
    h, inter, heads, kv, hd = (64, 128, 4, 2, 16) if tiny else (1024, 2048, 8, 2, 128)
    win = 12 if tiny else 256
    if name == "llama3":
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(hidden_size=h, intermediate_size=inter, num_hidden_layers=2 if tiny else 4,
                          num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd,
                          rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, **common)
        return LlamaForCausalLM, cfg, f"GQA {heads}:{kv}, head_dim {hd}", "sdpa"
    if name == "qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM
        cfg = Qwen3Config(hidden_size=h, intermediate_size=inter, num_hidden_layers=2 if tiny else 4,
                          num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd, **common)
        return Qwen3ForCausalLM, cfg, f"GQA {heads}:{kv}, head_dim {hd}, q/k norm", "sdpa"
    if name == "mistral":
        from transformers import MistralConfig, MistralForCausalLM
        cfg = MistralConfig(hidden_size=h, intermediate_size=inter, num_hidden_layers=2 if tiny else 4,
                            num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd,
                            sliding_window=win, **common)
        return MistralForCausalLM, cfg, f"GQA {heads}:{kv}, head_dim {hd}, window {win}", "sdpa"
    if name == "gemma2":
        from transformers import Gemma2Config, Gemma2ForCausalLM
        hd2 = 32 if tiny else 256
        n = 2 if tiny else 4
        # Gemma 2's cap, 50, leaves the scores of a tiny random model (|s| < 1) as they are
        # (dropping the cap passed unnoticed): the tiny one caps at 1 so that capping shows.
        cap = 1.0 if tiny else 50.0
        cfg = Gemma2Config(hidden_size=h, intermediate_size=inter, num_hidden_layers=n,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=hd2, query_pre_attn_scalar=hd2,
                           sliding_window=win, layer_types=alternate(n), attn_logit_softcapping=cap,
                           final_logit_softcapping=30.0, **common)
        return Gemma2ForCausalLM, cfg, f"softcap {cap}, head_dim {hd2}, window {win} on alternate layers", "eager"
    if name == "gemma3":
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig
        hd3 = 32 if tiny else 256
        layers = ["sliding_attention"] * (2 if tiny else 5) + ["full_attention"]
        cfg = Gemma3TextConfig(hidden_size=h, intermediate_size=inter, num_hidden_layers=len(layers),
                               num_attention_heads=4, num_key_value_heads=1, head_dim=hd3, query_pre_attn_scalar=hd3,
                               sliding_window=win, layer_types=layers, **common)
        return Gemma3ForCausalLM, cfg, f"head_dim {hd3}, window {win}, {len(layers) - 1}:1 sliding/global", "sdpa"
    if name == "gemma4":
        from transformers.models.gemma4 import Gemma4ForCausalLM, Gemma4TextConfig
        layers = ["sliding_attention"] * (2 if tiny else 5) + ["full_attention"]
        hd4, ghd = (16, 32) if tiny else (256, 512)
        cfg = Gemma4TextConfig(hidden_size=h if tiny else 1024, intermediate_size=inter if tiny else 4096,
                               num_hidden_layers=len(layers), num_attention_heads=4 if tiny else 8,
                               num_key_value_heads=1, head_dim=hd4, global_head_dim=ghd, sliding_window=win,
                               layer_types=layers, hidden_size_per_layer_input=8 if tiny else 64,
                               vocab_size_per_layer_input=V, **common)
        return Gemma4ForCausalLM, cfg, f"head_dim {hd4} sliding (window {win}) / {ghd} global", "sdpa"
    if name == "gpt-oss":
        from transformers import GptOssConfig, GptOssForCausalLM
        hdo = 16 if tiny else 64
        n = 2 if tiny else 4
        cfg = GptOssConfig(hidden_size=h, intermediate_size=inter // 2, num_hidden_layers=n,
                           num_attention_heads=heads, num_key_value_heads=kv, head_dim=hdo, sliding_window=win,
                           layer_types=alternate(n), num_local_experts=4, num_experts_per_tok=4,
                           router_aux_loss_coef=0.0, **common)
        return GptOssForCausalLM, cfg, f"learnable sinks, GQA {heads}:{kv}, head_dim {hdo}, window {win} on alternate layers, MoE (top-4 of 4)", "eager"
    if name == "deepseek-v3":
        from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
        nope, rope, v = (16, 8, 16) if tiny else (128, 64, 128)
        cfg = DeepseekV3Config(hidden_size=h, intermediate_size=inter, moe_intermediate_size=inter // 4,
                               num_hidden_layers=2 if tiny else 3, num_attention_heads=heads, num_key_value_heads=heads,
                               n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=4, n_group=1, topk_group=1,
                               first_k_dense_replace=1, kv_lora_rank=32 if tiny else 256,
                               q_lora_rank=48 if tiny else 384, qk_nope_head_dim=nope, qk_rope_head_dim=rope,
                               v_head_dim=v, rope_interleave=True, **common)
        return DeepseekV3ForCausalLM, cfg, f"MLA: qk {nope + rope} = {nope} + {rope} rope, v {v}, MoE (top-4 of 4)", "sdpa"
    raise SystemExit(f"unknown family {name!r} (families: {', '.join(FAMILIES)})")


def make_batches(vocab, n_batches, batch, seq, device, seed, unpadded=False):
    """Right-padded batches of mixed lengths (one row full length, the others 1/2..full);
    tokens 2.. (0 pads, 1 is bos), labels -100 on the padding. ``unpadded``: every row full
    length, and no attention mask."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        lens = [seq] + torch.randint(seq // 2, seq + 1, (batch - 1,), generator=g).tolist()
        if unpadded:
            lens = [seq] * batch
        ids = torch.zeros(batch, seq, dtype=torch.long)
        mask = torch.zeros(batch, seq, dtype=torch.long)
        for r, n in enumerate(lens):
            ids[r, :n] = torch.randint(2, vocab, (n,), generator=g)
            mask[r, :n] = 1
        labels = ids.masked_fill(mask == 0, -100)
        b = {"input_ids": ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device), "lens": lens}
        if unpadded:
            del b["attention_mask"]
        out.append(b)
    return out


def prompts_left_padded(batches, prompt, device, unpadded=False):
    """4 prompts: prefixes (lengths prompt, prompt-3, prompt-5, prompt-2) of the 4 longest
    training rows, left-padded; returns (input_ids, attention_mask, lengths, the training
    continuations). ``unpadded``: all of length ``prompt`` (and the mask is None)."""
    rows = sorted(((b, r) for b in range(len(batches)) for r in range(len(batches[b]["lens"]))),
                  key=lambda br: -batches[br[0]]["lens"][br[1]])[:4]
    lens = [prompt] * 4 if unpadded else [prompt, prompt - 3, prompt - 5, prompt - 2]
    ids = torch.zeros(4, prompt, dtype=torch.long)
    mask = torch.zeros(4, prompt, dtype=torch.long)
    conts = []
    for i, ((b, r), n) in enumerate(zip(rows, lens)):
        row = batches[b]["input_ids"][r].cpu()
        ids[i, prompt - n:] = row[:n]
        mask[i, prompt - n:] = 1
        conts.append(row[n: batches[b]["lens"][r]].tolist())
    return ids.to(device), None if unpadded else mask.to(device), lens, conts


class LogWatch(logging.Handler):
    """Collects attn_policy's warnings: SDPA fallbacks (a failure) and substitutions."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.fallbacks, self.substitutes = [], []

    def emit(self, record):
        msg = record.getMessage()
        if "falling back" in msg or "fallback" in msg.lower():
            self.fallbacks.append(msg)
        elif "substitut" in msg.lower():
            self.substitutes.append(msg.removeprefix("attn_policy: "))


def layer_summary(records):
    """Per-layer decisions as 'layers 0,2: Backend/executor' groups (plus substitutes)."""
    per = {}
    for r in records:
        ex = r["executor"] + (" (substitute)" if r.get("substitute") else "")
        per.setdefault(r["layer"], set()).add(f"{r['backend']}/{ex}")
    groups = {}
    for layer in sorted(per, key=lambda x: (x is None, x)):
        groups.setdefault("; ".join(sorted(per[layer])), []).append(str(layer))
    return " | ".join(f"L{','.join(ls)}: {d}" for d, ls in groups.items()) or "-"


def median_ms(times):
    return statistics.median(times[2:] or times) * 1e3


def run_family(name, a, device, dtype, policy, watch, deadline):
    import attn_policy.transformers as aptf

    cls, cfg, features, kind = family(name, a.tiny)
    res = {"family": name, "features": features, "reference_kind": kind, "verdict": "FAIL", "problems": []}
    print(f"\n## {name}: {cls.__name__} ({features})", flush=True)
    torch.manual_seed(0)
    init = _e2e.make_model(cls, cfg, "sdpa" if kind == "sdpa" else "eager", dtype, device)
    state = _e2e.clone_state(init)
    del init
    batches = make_batches(cfg.vocab_size, a.batches, a.batch, a.seq, device, seed=1, unpadded=a.unpadded)
    fwd = [{k: v for k, v in b.items() if k != "lens"} for b in batches]

    # The references (impl, SDPA backend set).
    if a.refs == "eager":
        kind = res["reference_kind"] = "eager"
    if kind == "sdpa":
        first = "efficient" if device.type == "cuda" else "flash"
        probe = _e2e.make_model(cls, cfg, "sdpa", dtype, device, state)
        try:
            with warnings.catch_warnings(), _e2e.sdpa_backend(first)():
                warnings.simplefilter("ignore")
                probe(**fwd[0]).loss.backward()
            refs = [("sdpa", first), ("sdpa", "math")]
        except RuntimeError as e:
            # Math on those layers in both runs would make the references one implementation
            # there: the two eager ones differ everywhere.
            print(f"# SDPA {first} cannot run every layer ({str(e).splitlines()[0][:120]}): references eager, "
                  "eager_fp32 instead")
            kind = res["reference_kind"] = "eager"
        del probe
    if kind == "eager":
        refs = [("eager", None), (_e2e.EAGER_FP32, None)]
    keys = [impl if b is None else f"{impl}[{b}]" for impl, b in refs]
    res["references"] = keys

    runs = {}
    steps = a.steps
    for i, ((impl, backend), key) in enumerate(zip(refs, keys)):
        m = _e2e.make_model(cls, cfg, impl, dtype, device, state)
        t0 = time.perf_counter()
        r = _e2e.train(m, fwd, steps, device, lr=a.lr, clip=a.clip, warmup=a.warmup,
                       ctx=_e2e.sdpa_backend(backend), name=f"{name} {key}")
        del m
        runs[key] = r
        dt = time.perf_counter() - t0
        print(f"# {key}: {steps} steps in {dt:.1f} s, final loss {r['losses'][-1]:.4f}", flush=True)
        if i == 0 and time.perf_counter() + 2.2 * dt > deadline:
            res.update(verdict="skipped", problems=[f"the references' first run took {dt:.0f} s: the family "
                                                    "would not finish within --budget-s"],
                       step_ms={key: median_ms(r["times"])}, peak_bytes={key: r["peak"]})
            return res

    # attn_policy: declines raise; the first step's decisions are logged per layer.
    aptf.register(policy=policy, log_decisions=False, on_decline="raise")
    first_step = []

    # The weights before each of attn_policy's steps (on the host: they must not count in its
    # peak memory), for the shared-weights loss check below.
    snaps = []

    def on_step(step, phase):
        if phase == "before":
            snaps.append({k: v.detach().to("cpu", copy=True) for k, v in m.state_dict().items()})
        if step != 0:
            return
        if phase == "before":
            aptf.register(policy=policy, log_decisions=True, on_decline="raise")
            aptf.decision_log.clear()
        else:
            first_step.extend(dict(r) for r in aptf.decision_log)
            aptf.register(policy=policy, log_decisions=False, on_decline="raise")

    watch.fallbacks.clear()
    watch.substitutes.clear()
    m = _e2e.make_model(cls, cfg, "attn_policy", dtype, device, state)
    t0 = time.perf_counter()
    try:
        ours = _e2e.train(m, fwd, steps, device, lr=a.lr, clip=a.clip, warmup=a.warmup, on_step=on_step,
                          name=f"{name} attn_policy")
    except Exception as e:  # a decline, a refused substitution, an executor error
        msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        print(f"# attn_policy: FAILED at training: {msg}")
        if a.verbose:
            traceback.print_exc()
        res["problems"].append(f"attn_policy training: {msg}")
        aptf.register(policy=policy, log_decisions=False, on_decline="raise")
        res["decisions"] = layer_summary(aptf.decision_log)
        res["step_ms"] = {k: median_ms(r["times"]) for k, r in runs.items()}
        res["peak_bytes"] = {k: r["peak"] for k, r in runs.items()}
        res["losses"] = {k: r["losses"] for k, r in runs.items()}
        return res
    ap_state = _e2e.clone_state(m)
    del m
    print(f"# attn_policy: {steps} steps in {time.perf_counter() - t0:.1f} s, final loss {ours['losses'][-1]:.4f}",
          flush=True)
    runs["attn_policy"] = ours
    # The loss check (see the module docstring): both references on attn_policy's own weights
    # before each step, on that step's batch, in training mode, no gradient.
    shared = {k: [] for k in keys}
    for (impl, backend), key in zip(refs, keys):
        sm = _e2e.make_model(cls, cfg, impl, dtype, device, state)
        sm.train()
        sm.config.use_cache = False
        for step, snap in enumerate(snaps):
            sm.load_state_dict(snap)
            with torch.no_grad(), _e2e.sdpa_backend(backend)():
                shared[key].append(sm(**fwd[step % len(fwd)]).loss.item())
        del sm
    del snaps
    w = a.gap_window
    chk = _e2e.loss_check(ours["losses"], shared[keys[1]], shared[keys[0]], window=w, floor=a.loss_floor)
    ratio, worst, loss_ok = chk["ratio"], chk["worst"], chk["ok"]
    dev, ref_gap, envelope, floors = chk["dev"], chk["ref_gap"], chk["envelope"], chk["floors"]
    if not loss_ok:
        bad = sum(x > 1.5 for x in ratio)
        res["problems"].append(f"loss: {bad} of {steps} steps past 1.5 x the reference gap (worst step {worst}: "
                               f"|ap - {keys[1]}| {dev[worst]:.3g}, |{keys[0]} - {keys[1]}| {ref_gap[worst]:.3g}, "
                               f"within {w} steps {envelope[worst]:.3g}, floor {floors[worst]:.3g})")
    # For information (not a check): the free-running trajectories, which diverge chaotically.
    r1, r2 = runs[keys[0]]["losses"], runs[keys[1]]["losses"]
    free_gap = [abs(y - x) for x, y in zip(r1, r2)]
    free_env = [max(free_gap[max(0, i - w): i + w + 1]) for i in range(steps)]
    free_ratio = max(abs(o - x) / max(g, f) for o, x, g, f in zip(ours["losses"], r1, free_env, floors))

    # Greedy generation with a KV cache of a left-padded batch, attn_policy's trained weights
    # under attn_policy and under both references (the second: for the logits' bound).
    ids, mask, plens, conts = prompts_left_padded(batches, a.prompt, device, a.unpadded)
    gen, scores = {}, {}
    aptf.register(policy=policy, log_decisions=True, on_decline="raise")
    aptf.decision_log.clear()
    for impl, backend, key in [("attn_policy", None, "attn_policy")] + [(i, b, k) for (i, b), k in zip(refs, keys)]:
        gm = _e2e.make_model(cls, cfg, impl, dtype, device, ap_state).eval()
        gm.generation_config.eos_token_id = None
        gm.generation_config.pad_token_id = 0
        try:
            with torch.no_grad(), _e2e.sdpa_backend(backend)():
                out = gm.generate(input_ids=ids, attention_mask=mask, max_new_tokens=a.new_tokens, do_sample=False,
                                  use_cache=True, output_scores=True, return_dict_in_generate=True)
            gen[key] = out.sequences[:, a.prompt:].tolist()
            scores[key] = torch.stack(out.scores).float()
        except Exception as e:
            msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            print(f"# generate under {key}: FAILED: {msg}")
            if a.verbose:
                traceback.print_exc()
            res["problems"].append(f"generate ({key}): {msg}")
            gen[key] = None
        del gm
    gen_records = [dict(r) for r in aptf.decision_log]
    aptf.register(policy=policy, log_decisions=False, on_decline="raise")
    ga, gb = gen.get("attn_policy"), gen.get(keys[0])
    gen_ok = ga is not None and ga == gb
    if ga is not None and gb is not None and not gen_ok:
        diffs = [next((i for i, (x, y) in enumerate(zip(p, q)) if x != y), None) for p, q in zip(ga, gb)]
        res["problems"].append(f"generate: tokens differ from {keys[0]} (first difference per prompt {diffs})")
    # The generated steps' logits (same tokens fed back, so comparable): attn_policy's largest
    # difference from the second (float32) reference within 1.5 x the first's (floor: --logit-floor
    # x max(1, the largest logit)). Tokens alone miss defects a memorised model outvotes (a
    # padding mask ignored in the left-padded prompts: tested).
    logit = None
    if gen_ok and gen.get(keys[1]) is not None:
        # Up to the first step where the second reference chose another token (inclusive: that
        # step's logits came from the same tokens).
        g2 = gen[keys[1]]
        n = next((t for t in range(len(gb[0])) if any(r1[t] != r2[t] for r1, r2 in zip(gb, g2))), len(gb[0]) - 1) + 1
        s2 = scores[keys[1]][:n]
        d_ap = (scores["attn_policy"][:n] - s2).abs().max().item()
        d_ref = (scores[keys[0]][:n] - s2).abs().max().item()
        floor = a.logit_floor * max(1.0, s2.abs().max().item())
        logit = {"ap": d_ap, "refs": d_ref, "floor": floor, "ratio": d_ap / max(d_ref, floor)}
        if logit["ratio"] > 1.5:
            res["problems"].append(f"generate: logits differ from {keys[1]} by {d_ap:.3g}, past 1.5 x the references' "
                                   f"{d_ref:.3g} (floor {floor:.3g})")
        logit["steps"] = n
    memorised = ([sum(int(x == y) for x, y in zip(g, c)) for g, c in zip(ga, conts)] if ga is not None else None)

    if watch.fallbacks:
        res["problems"].append(f"SDPA fallback logged: {watch.fallbacks[0]}")
    # Substitutes (allowed, reported): the decisions' own one-line summaries.
    subs = sorted({r["summary"] for r in first_step + gen_records if r.get("substitute")} | set(watch.substitutes))

    ref1 = runs[keys[0]]
    res.update(
        steps=steps, losses={k: r["losses"] for k, r in runs.items()}, shared_weight_losses=shared,
        ref_gap=ref_gap, ref_gap_envelope=envelope, deviation=dev, floors=floors, max_ratio=ratio[worst],
        worst_step=worst, loss_ok=loss_ok, free_running_max_ratio=free_ratio,
        generate={"attn_policy": ga, keys[0]: gb, "prompt_lengths": plens, "memorised_tokens": memorised},
        generate_ok=gen_ok, generate_logits=logit, decisions=layer_summary(first_step), decisions_generate=layer_summary(gen_records),
        per_layer=first_step, substitutes=subs,
        step_ms={k: median_ms(r["times"]) for k, r in runs.items()},
        peak_bytes={k: r["peak"] for k, r in runs.items()},
        step_ratio=median_ms(ours["times"]) / median_ms(ref1["times"]),
        peak_ratio=(ours["peak"] / ref1["peak"]) if ref1["peak"] else None,
    )
    res["verdict"] = "PASS" if not res["problems"] else "FAIL"
    print(f"# loss: worst |ap - {keys[1]}| / max(|{keys[0]} - {keys[1]}|, floor) = {ratio[worst]:.2f} at step {worst} "
          f"(free-running trajectories, not a check: {free_ratio:.2f}); "
          f"generate identical: {gen_ok} (tokens equal to the training continuation: {memorised}), logits "
          + (f"{logit['ap']:.3g} vs the references' {logit['refs']:.3g} (floor {logit['floor']:.3g}); " if logit else "-; ")
          + f"decisions: {res['decisions']}; verdict {res['verdict']}", flush=True)
    return res


def fmt_table(results):
    lines = ["| family | steps | max loss dev / ref gap (shared weights; free-running) | generate == ref1 (logit dev / ref gap) | decisions per layer (first step) | "
             "step ms ap / ref1 | peak MiB ap / ref1 | verdict |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r["verdict"] == "skipped" or "max_ratio" not in r:
            sm = r.get("step_ms", {})
            ref1 = f"{next(iter(sm.values())):.1f}" if sm else "-"
            lines.append(f"| {r['family']} | {r.get('steps', '-')} | - | - | {r.get('decisions', '-')} | "
                         f"- / {ref1} | - | {r['verdict']}"
                         + (f": {'; '.join(r['problems'])}" if r["problems"] else "") + " |")
            continue
        ref1 = r["references"][0]
        sm, pk = r["step_ms"], r["peak_bytes"]
        peak = (f"{pk['attn_policy'] / 2**20:.0f} / {pk[ref1] / 2**20:.0f} ({r['peak_ratio']:.2f}x)"
                if r["peak_ratio"] else "n/a (CPU)")
        # The why of each substitute is in the JSON (and the log): one line each.
        subs = f" ({len(r['substitutes'])} substitute reason(s))" if r["substitutes"] else ""
        lines.append(
            f"| {r['family']} | {r['steps']} | {r['max_ratio']:.2f} (step {r['worst_step']}); "
            f"{r['free_running_max_ratio']:.2f} | "
            f"{'yes' if r['generate_ok'] else 'NO'}"
            + (f" (logits {r['generate_logits']['ratio']:.2f}x)" if r.get("generate_logits") else "")
            + f" | {r['decisions']}{subs} | "
            f"{sm['attn_policy']:.1f} / {sm[ref1]:.1f} ({r['step_ratio']:.2f}x) | {peak} | {r['verdict']}"
            + (f": {'; '.join(r['problems'])}" if r["problems"] else "") + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", action="append", default=[], choices=FAMILIES, help="repeatable; default all")
    ap.add_argument("--budget-s", type=float, default=480.0, help="wall budget; families past it are skipped")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--pack", default="te", help="the attn_policy pack (a name or a folder)")
    ap.add_argument("--tiny", action="store_true", help="small configs keeping every feature (CPU, CI)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default=None,
                    help="model dtype (default bf16 on CUDA, fp32 on the CPU: see the module docstring)")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default 100, 40 with --tiny)")
    ap.add_argument("--seq", type=int, default=None, help="padded sequence length (default 1024, 48 with --tiny)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--batches", type=int, default=2, help="distinct fixed batches, cycled (memorised)")
    ap.add_argument("--lr", type=float, default=None, help="AdamW learning rate (default 1e-3, 5e-3 with --tiny)")
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--loss-floor", type=float, default=5e-4,
                    help="the reference gap's floor, relative to max(1, |loss_ref1|)")
    ap.add_argument("--refs", choices=["auto", "sdpa", "eager"], default="auto",
                    help="the reference pair: sdpa (two SDPA backends, where SDPA computes the model) or eager "
                    "(eager, eager_fp32); auto: sdpa where SDPA computes the model, else eager")
    ap.add_argument("--gap-window", type=int, default=5,
                    help="the reference gap of step i is the largest within i-W..i+W (0: that step's own)")
    ap.add_argument("--logit-floor", type=float, default=None,
                    help="the generate logits' bound floor, relative to max(1, |largest logit|) "
                    "(default 1e-2 in bf16, 1e-4 in fp32)")
    ap.add_argument("--prompt", type=int, default=None, help="prompt length (default 64, 16 with --tiny)")
    ap.add_argument("--new-tokens", type=int, default=None, help="generated tokens (default 32, 12 with --tiny)")
    ap.add_argument("--chain", action="append", default=[], metavar="BACKEND=EXEC,...",
                    help="replace a te backend's executor chain for the attn_policy runs")
    ap.add_argument("--unpadded", action="store_true",
                    help="diagnostic: full-length rows and equal-length prompts, no padding mask anywhere "
                    "(for attn_policy builds without per-sequence lengths); not the issue-33 check")
    ap.add_argument("--verbose", action="store_true", help="tracebacks of failures")
    a = ap.parse_args(argv)
    a.steps = a.steps or (40 if a.tiny else 100)
    a.seq = a.seq or (48 if a.tiny else 1024)
    a.lr = a.lr or (5e-3 if a.tiny else 1e-3)
    a.prompt = a.prompt or (16 if a.tiny else 64)
    a.new_tokens = a.new_tokens or (12 if a.tiny else 32)
    families = a.family or FAMILIES
    device = torch.device(a.device)
    a.dtype = a.dtype or ("bf16" if device.type == "cuda" else "fp32")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    a.logit_floor = a.logit_floor or (1e-2 if a.dtype == "bf16" else 1e-4)
    if device.type == "cpu" and a.tiny:
        # Tiny models are bound by per-op overhead: more threads only contend (5x slower on a
        # loaded 2-core machine).
        torch.set_num_threads(1)

    import attn_policy
    import attn_policy.transformers as aptf

    if a.chain:
        if a.pack != "te":
            raise SystemExit("--chain edits the te pack: leave --pack at te")
        policy, _ = _e2e.te_with_chains(a.chain, script=__file__)
    else:
        policy = attn_policy.Policy.load(a.pack)
    aptf.register(policy=policy, on_decline="raise")
    _e2e.register_eager_fp32()
    watch = LogWatch()
    logging.getLogger("attn_policy").addHandler(watch)  # its modules' loggers propagate to it
    import transformers

    print(f"# model families through attn_policy (pack {a.pack}): torch {torch.__version__}, transformers "
          f"{transformers.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
          + f", {dtype}, {a.steps} steps, batch {a.batch} x seq {a.seq} (right-padded, mixed lengths), "
          f"{a.batches} batches cycled, AdamW lr {a.lr}, loss floor {a.loss_floor}"
          + (" [--unpadded: no padding masks, a diagnostic run]" if a.unpadded else ""))
    t_start = time.perf_counter()
    deadline = t_start + a.budget_s
    results = []
    for name in families:
        if time.perf_counter() > deadline:
            results.append({"family": name, "verdict": "skipped", "problems": ["past --budget-s"]})
            print(f"\n## {name}: skipped (past --budget-s {a.budget_s:.0f})")
            continue
        t0 = time.perf_counter()
        try:
            r = run_family(name, a, device, dtype, policy, watch, deadline)
        except Exception as e:  # a reference or harness failure: reported, the others still run
            traceback.print_exc()
            r = {"family": name, "verdict": "FAIL", "problems": [f"{type(e).__name__}: {e}"]}
        r["wall_s"] = time.perf_counter() - t0
        results.append(r)
        if device.type == "cuda":
            torch.cuda.empty_cache()

    print(f"\n## model families: attn_policy vs the first reference ({time.perf_counter() - t_start:.0f} s)")
    print(fmt_table(results))
    failed = [r["family"] for r in results if r["verdict"] == "FAIL"]
    skipped = [r["family"] for r in results if r["verdict"] == "skipped"]
    print(f"\npassed {sum(r['verdict'] == 'PASS' for r in results)}, failed {len(failed)} {failed or ''}, "
          f"skipped {len(skipped)} {skipped or ''}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "torch": torch.__version__, "device": str(device),
                       "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                       "results": results}, f, indent=1, default=str)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
