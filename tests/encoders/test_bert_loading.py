"""Reading BERT folders: the config allow-list (MiniLM's real config.json and transformers' own), the head
chosen from `architectures`, refused variants, and the sinusoidal positions of Vaswani et al. 2017."""

import json
import math
from pathlib import Path

import pytest
import torch
from encoder_models import build, hf_config

import resid
from resid.components.embed import sinusoids
from resid.config import ModelConfig

MINILM_CONFIG = {  # all-MiniLM-L6-v2's config.json as published
    "_name_or_path": "nreimers/MiniLM-L6-H384-uncased", "architectures": ["BertModel"],
    "attention_probs_dropout_prob": 0.1, "gradient_checkpointing": False, "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1, "hidden_size": 384, "initializer_range": 0.02, "intermediate_size": 1536,
    "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert", "num_attention_heads": 12,
    "num_hidden_layers": 6, "pad_token_id": 0, "position_embedding_type": "absolute",
    "transformers_version": "4.8.2", "type_vocab_size": 2, "use_cache": True, "vocab_size": 30522,
}


def _folder(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("variant", ["bert_mlm", "bert_base"])
def test_transformers_config_fields_are_known(tmp_path: Path, variant: str):
    hf_config(variant).save_pretrained(tmp_path)
    with pytest.raises(resid.ResidError, match="no model.safetensors"):  # the config itself was accepted
        resid.load(tmp_path)


def test_published_minilm_config_is_known(tmp_path: Path):
    with pytest.raises(resid.ResidError, match="no model.safetensors"):
        resid.load(_folder(tmp_path, MINILM_CONFIG))


@pytest.mark.parametrize("change, message", [
    ({"is_decoder": True}, "is_decoder"),
    ({"position_embedding_type": "relative_key"}, "relative_key"),
    ({"attention_sink": True}, "attention_sink=True"),
])
def test_variants_resid_does_not_compute_are_refused(tmp_path: Path, change: dict, message: str):
    with pytest.raises(resid.ResidError, match=message):
        resid.load(_folder(tmp_path, {**MINILM_CONFIG, **change}))


def test_an_mlm_checkpoint_read_as_an_embedding_model_drops_only_the_head(tmp_path: Path):
    """architectures picks the head: the same BertForMaskedLM weights with architectures BertModel load as the
    encoder alone, with the same hidden states."""
    build("bert_mlm", tmp_path)
    mlm = resid.load(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["BertModel"]}))
    encoder = resid.load(tmp_path)
    assert encoder.config.head == "none" and encoder.unembed is None and encoder.mlm_head is None
    text = "paris is the capital of france"
    torch.testing.assert_close(encoder.run(text).hidden, mlm.run(text).hidden, atol=0, rtol=0)


@pytest.mark.parametrize("layout", ["interleaved", "halves"])
def test_sinusoids_follow_the_2017_formula(layout: str):
    table = sinusoids(50, 16, layout)
    for pos in (0, 1, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            sin_at, cos_at = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, 8 + i)
            assert table[pos, sin_at].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, cos_at].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_a_sinusoidal_model_writes_the_table_as_pos_embed():
    config = ModelConfig(
        architecture="custom", d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_head=8, d_mlp=32, d_vocab=40,
        n_ctx=32, norm="layernorm", norm_eps=1e-5, positions="sinusoidal", pre_norms=False, post_ln=True,
        act="relu", gated_mlp=False,
    )
    model = resid.Transformer(config)
    assert "pos_embed.W_pos" not in dict(model.named_parameters())  # fixed, never read from a checkpoint
    run = model.run(torch.arange(5)[None])
    torch.testing.assert_close(run.stream.pos_embed[0], sinusoids(32, 16)[:5])
    with pytest.raises(resid.ResidError, match="post_ln blocks"):
        ModelConfig(**{**config.to_dict(), "pre_norms": True})
