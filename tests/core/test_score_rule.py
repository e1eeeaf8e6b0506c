"""Attention's frozen pieces are the forward's: from a run's captured queries and keys, Attention.score_rule (scale,
soft cap, query-to-key/value head map) gives the run's own scores on every family, its inverse undoes the soft
cap, and Transformer.rotary_of gives the rotary each layer's queries and keys were turned by (Gemma 3's sliding
layers their local one)."""

import pytest
import torch
from random_models import make_random_model

from resid import Capture
from resid.components.rotary import Rotary

TEXTS = ["The quick brown fox jumps over", "Hello there"]  # left-padded: the second prompt has padding


def test_the_score_rule_recomputes_the_runs_scores(random_model):
    run = random_model.run(TEXTS, capture=Capture(attn={"q", "k", "scores"}))
    for block, record in zip(random_model.blocks, run.stream.layers, strict=True):
        rule, attn = block.attn.score_rule, record.attn
        q_h, k_h = attn.q.transpose(1, 2), attn.k.transpose(1, 2)  # [batch head pos d_head]
        keys = rule.repeat_kv(k_h, dim=1)
        for head in range(q_h.shape[1]):
            assert torch.equal(keys[:, head], k_h[:, rule.kv_head(head)])
        scores = rule.capped(rule.raw(q_h.double(), keys.double()))
        allowed = torch.isfinite(attn.scores)
        torch.testing.assert_close(scores[allowed], attn.scores[allowed].double(), atol=1e-4, rtol=1e-4)
        raw = rule.raw(q_h.double(), keys.double())[allowed]
        torch.testing.assert_close(rule.uncapped(attn.scores[allowed]), raw, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["gemma3_like", "llama_gqa", "neox_parallel"])
def test_rotary_of_turns_each_layers_queries_and_keys(kind, gpt2_tokenizer):
    """q = rotary(q_proj) with the rotary rotary_of gives for the layer's type, and not the other type's (Gemma 3's
    sliding layers turn with a base of their own); q/k norms off, so nothing else stands between them."""
    model = make_random_model(kind, gpt2_tokenizer, qk_norm="none")
    run = model.run(TEXTS, capture=Capture(attn={"q", "k", "q_proj", "k_proj"}))
    position_ids = run.tokens.position_ids
    other = {"full": "sliding", "sliding": "full"}
    for block, record in zip(model.blocks, run.stream.layers, strict=True):
        attn, kind_of = record.attn, block.attn.layer_type
        cos, sin = model.rotary_of(kind_of).cos_sin(position_ids, model.dtype)
        torch.testing.assert_close(Rotary.apply(attn.q_proj, cos, sin), attn.q, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(Rotary.apply(attn.k_proj, cos, sin), attn.k, atol=1e-5, rtol=1e-5)
        if model.rotary_of(other[kind_of]) is not model.rotary_of(kind_of):
            cos, sin = model.rotary_of(other[kind_of]).cos_sin(position_ids, model.dtype)
            assert not torch.allclose(Rotary.apply(attn.q_proj, cos, sin), attn.q, atol=1e-3)
    assert (model.rotary_of("sliding") is model.rotary_local) == (kind == "gemma3_like")


def test_a_model_without_rotary_positions_has_no_rotary():
    model = make_random_model("gpt2_like")
    assert model.rotary_of("full") is None and model.rotary_of("sliding") is None
