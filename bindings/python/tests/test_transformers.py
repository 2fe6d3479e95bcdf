"""attn_implementation="attn_policy" in transformers' own models (reduced configs, random
weights, CPU): logits and greedy generation match "sdpa". Skipped without torch/transformers."""

import logging

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attn_policy  # noqa: E402
import attn_policy.transformers as aptf  # noqa: E402


def tiny_gemma4(attn, sliding_window=4):
    from transformers.models.gemma4 import Gemma4ForCausalLM, Gemma4TextConfig

    cfg = Gemma4TextConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=sliding_window,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        hidden_size_per_layer_input=8, vocab_size_per_layer_input=97, max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return Gemma4ForCausalLM._from_config(cfg, attn_implementation=attn, torch_dtype=torch.float32).eval()


def test_register_returns_the_implementation_name():
    assert aptf.register() == "attn_policy"


def test_register_refuses_bad_options_at_registration():
    # policy="te" was kept and failed at the model's first forward ('str' object has no
    # attribute '_p'); log_decisions="no" logged.
    with pytest.raises(attn_policy.PolicyError, match="policy must be an attn_policy.Policy or None; found str 'te'"):
        aptf.register(policy="te")
    with pytest.raises(attn_policy.PolicyError, match="log_decisions must be True or False; found str 'no'"):
        aptf.register(log_decisions="no")
    with pytest.raises(attn_policy.PolicyError, match="no_substitute must be True or False"):
        aptf.register(no_substitute=None)
    with pytest.raises(attn_policy.PolicyError, match="on_decline must be raise or fallback"):
        aptf.register(on_decline="warn")
    assert aptf.register(policy=attn_policy.Policy.load("te")) == "attn_policy"
    aptf.register()


def test_gemma4_logits_and_greedy_generation_match_sdpa(caplog):
    pytest.importorskip("transformers.models.gemma4")
    aptf.register(log_decisions=True)
    ours, ref = tiny_gemma4("attn_policy"), tiny_gemma4("sdpa")
    ref.load_state_dict(ours.state_dict())
    ids = torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(1))
    aptf.decision_log.clear()
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="attn_policy.transformers"):
        a = ours(ids).logits
        b = ref(ids).logits
    torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)
    layers = {r["layer"] for r in aptf.decision_log}
    assert layers == {0, 1, 2}, aptf.decision_log
    assert all(r["executor"] == "reference" for r in aptf.decision_log)
    assert any("layer 0:" in r.message for r in caplog.records)
    # Greedy decoding with a KV cache: s_q = 1 against a growing cache (bottom-right diagonal).
    with torch.no_grad():
        ga = ours.generate(ids[:1], max_new_tokens=8, do_sample=False)
        gb = ref.generate(ids[:1], max_new_tokens=8, do_sample=False)
    assert ga.tolist() == gb.tolist()
    aptf.register()


def test_a_mask_that_is_not_padding_at_one_side_is_declined_or_falls_back_with_a_log(caplog):
    pytest.importorskip("transformers.models.gemma4")
    aptf.register()
    model = tiny_gemma4("attn_policy")
    ids = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, 2] = 0  # a hole: neither right- nor left-padded
    with torch.no_grad(), pytest.raises(Exception, match="contiguous run"):
        model(ids, attention_mask=mask)
    aptf.register(on_decline="fallback")
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="attn_policy.transformers"):
        out = model(ids, attention_mask=mask).logits
    assert torch.isfinite(out[1]).all()
    assert any("falling back to torch SDPA" in r.message for r in caplog.records)
    aptf.register()


# ---------------------------------------------------------------------------------------------
# Padded batches, soft-capping and sinks against transformers' eager attention (float32).


def _twins(make):
    ours, ref = make("attn_policy"), make("eager")
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def tiny_llama(attn):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                      pad_token_id=0)
    torch.manual_seed(0)
    return LlamaForCausalLM._from_config(cfg, attn_implementation=attn, torch_dtype=torch.float32).eval()


def _padded(side, b=3, s=9, seed=3):
    ids = torch.randint(1, 97, (b, s), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(b, s, dtype=torch.long)
    for row, n in ((1, 3), (2, 5))[:b - 1]:
        if side == "right":
            mask[row, s - n:] = 0
        else:
            mask[row, :n] = 0
    return ids, mask


@pytest.mark.parametrize("side", ["right", "left"])
def test_llama_padded_batches_match_eager_on_the_valid_tokens(side, monkeypatch):
    aptf.register(log_decisions=True)
    ours, ref = _twins(tiny_llama)
    ids, mask = _padded(side)
    reads = []
    real = aptf._padding_uncached
    monkeypatch.setattr(aptf, "_padding_uncached", lambda *a: reads.append(1) or real(*a))
    aptf.decision_log.clear()
    with torch.no_grad():
        a = ours(ids, attention_mask=mask).logits
        b = ref(ids, attention_mask=mask).logits
    valid = mask.bool()
    torch.testing.assert_close(a[valid], b[valid], atol=2e-5, rtol=2e-5)
    # One forward, two layers, one mask: its lengths were read once.
    assert len(reads) == 1
    assert {r["layer"] for r in aptf.decision_log} == {0, 1}
    assert all(r["executor"] == "reference" for r in aptf.decision_log)
    aptf.register()


def test_llama_left_padded_greedy_generation_matches_eager():
    # KV-cache decoding with padding: s_q = 1 against a growing cache, the query lengths from
    # the mask's last column.
    aptf.register()
    ours, ref = _twins(tiny_llama)
    ids, mask = _padded("left", b=2, s=6, seed=4)
    with torch.no_grad():
        ga = ours.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
        gb = ref.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert ga.tolist() == gb.tolist()


def test_llama_right_padded_training_gradients_match_eager():
    aptf.register()
    ours, ref = _twins(tiny_llama)
    ours.train(), ref.train()
    ids, mask = _padded("right", b=2, s=7, seed=5)
    labels = ids.masked_fill(mask == 0, -100)
    ours(ids, attention_mask=mask, labels=labels).loss.backward()
    ref(ids, attention_mask=mask, labels=labels).loss.backward()
    for (name, p), (_, r) in zip(ours.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, r.grad, atol=1e-5, rtol=1e-4, msg=name)


def tiny_gemma2(attn):
    from transformers.models.gemma2 import Gemma2Config, Gemma2ForCausalLM

    cfg = Gemma2Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4,
                       attn_logit_softcapping=1.5, final_logit_softcapping=None, query_pre_attn_scalar=8,
                       max_position_embeddings=64, pad_token_id=0)
    torch.manual_seed(0)
    return Gemma2ForCausalLM._from_config(cfg, attn_implementation=attn, torch_dtype=torch.float32).eval()


def test_gemma2_softcap_matches_eager():
    pytest.importorskip("transformers.models.gemma2")
    aptf.register(log_decisions=True)
    ours, ref = _twins(tiny_gemma2)
    ids, mask = _padded("right", b=2, s=9, seed=6)
    aptf.decision_log.clear()
    with torch.no_grad():
        a = ours(ids).logits
        b = ref(ids).logits
        torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)
        a = ours(ids, attention_mask=mask).logits
        b = ref(ids, attention_mask=mask).logits
    valid = mask.bool()
    torch.testing.assert_close(a[valid], b[valid], atol=2e-5, rtol=2e-5)
    assert aptf.decision_log and all(r["executor"] == "reference" for r in aptf.decision_log)
    aptf.register()


def tiny_gpt_oss(attn):
    from transformers.models.gpt_oss import GptOssConfig, GptOssForCausalLM

    cfg = GptOssConfig(vocab_size=97, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4,
                       num_local_experts=2, num_experts_per_tok=1, max_position_embeddings=64, pad_token_id=0,
                       layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    m = GptOssForCausalLM._from_config(cfg, attn_implementation=attn, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)  # learnable sinks that matter
    return m


def test_gpt_oss_sinks_match_eager_with_their_gradient():
    pytest.importorskip("transformers.models.gpt_oss")
    aptf.register()
    ours, ref = _twins(tiny_gpt_oss)
    ids, mask = _padded("left", b=2, s=8, seed=7)
    with torch.no_grad():
        a = ours(ids, attention_mask=mask).logits
        b = ref(ids, attention_mask=mask).logits
    valid = mask.bool()
    torch.testing.assert_close(a[valid], b[valid], atol=2e-5, rtol=2e-5)
    # The sinks' gradient flows back through attn_policy (s_aux passed as `sink`).
    ours.train(), ref.train()
    labels = ids.masked_fill(mask == 0, -100)
    ours(ids, attention_mask=mask, labels=labels).loss.backward()
    ref(ids, attention_mask=mask, labels=labels).loss.backward()
    for lo, lr in zip(ours.model.layers, ref.model.layers):
        assert lo.self_attn.sinks.grad is not None and lo.self_attn.sinks.grad.abs().sum() > 0
        torch.testing.assert_close(lo.self_attn.sinks.grad, lr.self_attn.sinks.grad, atol=1e-5, rtol=1e-4)
