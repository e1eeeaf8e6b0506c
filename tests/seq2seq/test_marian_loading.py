"""Reading Marian folders: the config allow-list (the fields transformers writes, and an opus-mt-style config),
refused variants, and what loads (an EncoderDecoder whose halves have their own depths and head counts)."""

import json
from pathlib import Path

import pytest
from seq2seq_models import marian_config

import resid

OPUS_STYLE = {  # the fields of an opus-mt config.json (Helsinki-NLP), at their published kinds of values
    "activation_dropout": 0.0, "activation_function": "swish", "add_bias_logits": False, "add_final_layer_norm": False,
    "architectures": ["MarianMTModel"], "attention_dropout": 0.0, "bad_words_ids": [[58100]], "bos_token_id": 0,
    "classif_dropout": 0.0, "classifier_dropout": 0.0, "d_model": 512, "decoder_attention_heads": 8,
    "decoder_ffn_dim": 2048, "decoder_layerdrop": 0.0, "decoder_layers": 6, "decoder_start_token_id": 58100,
    "decoder_vocab_size": 58101, "dropout": 0.1, "encoder_attention_heads": 8, "encoder_ffn_dim": 2048,
    "encoder_layerdrop": 0.0, "encoder_layers": 6, "eos_token_id": 0, "forced_eos_token_id": 0,
    "gradient_checkpointing": False, "id2label": {"0": "LABEL_0"}, "init_std": 0.02, "is_encoder_decoder": True,
    "label2id": {"LABEL_0": 0}, "max_length": 512, "max_position_embeddings": 512, "model_type": "marian",
    "normalize_before": False, "normalize_embedding": False, "num_beams": 4, "num_hidden_layers": 6,
    "pad_token_id": 58100, "scale_embedding": True, "share_encoder_decoder_embeddings": True,
    "static_position_embeddings": True, "transformers_version": "4.22.0.dev0", "use_cache": True,
    "vocab_size": 58101,
}


def _folder(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_transformers_marian_config_is_known(tmp_path: Path):
    marian_config().save_pretrained(tmp_path)
    with pytest.raises(resid.ResidError, match="no model.safetensors"):  # the config itself was accepted
        resid.load(tmp_path)


def test_opus_style_config_is_known(tmp_path: Path):
    with pytest.raises(resid.ResidError, match="no model.safetensors"):
        resid.load(_folder(tmp_path, OPUS_STYLE))


@pytest.mark.parametrize("change, message", [
    ({"normalize_before": True}, "normalize_before=true"),
    ({"add_bias_logits": True}, "add_bias_logits=true"),
    ({"static_position_embeddings": False}, "learned positions"),
    ({"layernorm_embedding": True}, "layernorm_embedding=True"),
])
def test_variants_resid_does_not_compute_are_refused(tmp_path: Path, change: dict, message: str):
    with pytest.raises(resid.ResidError, match=message):
        resid.load(_folder(tmp_path, {**OPUS_STYLE, **change}))


def test_a_marian_folder_loads_as_an_encoder_decoder(tiny_marian):
    model = tiny_marian.model
    assert isinstance(model, resid.EncoderDecoder)
    encoder, decoder = model.encoder.config, model.decoder.config
    assert (encoder.n_layers, encoder.n_heads, encoder.causal, encoder.head) == (2, 4, False, "none")
    assert (decoder.n_layers, decoder.n_heads, decoder.cross_attention, decoder.head) == (3, 2, True, "lm")
    assert decoder.sinusoid_layout == "halves" and decoder.act == "silu" and decoder.embed_scale == 32**0.5
