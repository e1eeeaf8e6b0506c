"""The embedded default reproduces transformers' fp32 eager outputs on the same dequantized GGUF weights."""

import pytest
import torch


def _prompts(reference):
    return [pytest.param(p, id=p["text"][:30]) for p in reference["prompts"]]


def test_reference_prompts(smollm2, smollm2_reference):
    assert len(smollm2_reference["prompts"]) == 4
    for prompt in smollm2_reference["prompts"]:
        assert smollm2.to_tokens(prompt["text"]).ids[0].tolist() == prompt["input_ids"]
        run = smollm2.run(torch.tensor(prompt["input_ids"]))
        logits = run.logits[0]
        assert logits.argmax(-1).tolist() == prompt["argmax_per_position"]
        ref_ids = torch.tensor([i for i, _ in prompt["last_top20"]])
        ref_values = torch.tensor([v for _, v in prompt["last_top20"]])
        top = logits[-1].topk(20)
        assert top.indices.tolist() == ref_ids.tolist()
        torch.testing.assert_close(top.values, ref_values, atol=1e-3, rtol=0)
        assert abs(logits[-1].logsumexp(-1).item() - prompt["last_logsumexp"]) < 1e-3
        norms = torch.stack([run.stream.resid_pre(l)[0, -1].norm() for l in range(smollm2.config.n_layers)])
        ref_norms = torch.tensor(prompt["resid_pre_norm_last_pos"])
        assert ((norms / ref_norms) - 1).abs().max() < 1e-3


def test_known_predictions(smollm2):
    for text, token, prob in [
        ("The Eiffel Tower is located in the city of", " Paris", 0.70),
        ("When Mary and John went to the store, John gave a drink to", " Mary", 0.92),
    ]:
        run = smollm2.run(text)
        probs = run.logits[0, -1].softmax(-1)
        assert smollm2.tokenizer.decode(int(probs.argmax())) == token
        assert abs(probs.max().item() - prob) < 0.01


def test_config_matches_reference_config(smollm2):
    cfg = smollm2.config
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_mlp, cfg.d_vocab) == (
        30, 576, 9, 3, 64, 1536, 49152,
    )
    assert cfg.rotary_base == 1e5 and cfg.tie_embeddings and cfg.norm == "rmsnorm"
    assert smollm2.unembed.W_U.data_ptr() == smollm2.embed.W_E.data_ptr()
    assert smollm2.tokenizer.prepend_bos is False and smollm2.tokenizer.bos_token_id == 1
