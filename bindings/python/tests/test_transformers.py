"""attn_implementation="attn_policy" in transformers' own models (reduced configs, random
weights, CPU): logits and greedy generation match "sdpa". Skipped without torch/transformers."""

import logging

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

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


def test_padding_is_declined_or_falls_back_with_a_log(caplog):
    pytest.importorskip("transformers.models.gemma4")
    aptf.register()
    model = tiny_gemma4("attn_policy")
    ids = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0
    with torch.no_grad(), pytest.raises(Exception, match="padd"):
        model(ids, attention_mask=mask)
    aptf.register(on_decline="fallback")
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="attn_policy.transformers"):
        out = model(ids, attention_mask=mask).logits
    assert torch.isfinite(out).all()
    assert any("falling back to torch SDPA" in r.message for r in caplog.records)
    aptf.register()
