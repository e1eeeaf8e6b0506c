"""Marian (Junczys-Dowmunt et al. 2018; Hugging Face's `marian`): the original Transformer's encoder-decoder.
Post-LN (x = LN(x + sublayer(x))), sinusoidal positions with the sines in the first half of each vector and the
cosines in the second, token embeddings times sqrt(d_model) (scale_embedding), one embedding matrix shared by
encoder, decoder and the LM head, a final_logits_bias, no embedding or final norms. The decoder's blocks have a
cross-attention (encoder_attn) between self-attention and the MLP.

Loaded as a resid.EncoderDecoder: `config` gives the decoder's ModelConfig, `encoder` the encoder's. The
tensors go straight into each projection's [out in] storage, so the two halves may have different head counts.
"""

import math

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.load.families import Family, activation
from resid.load.weights import Key, per_layer


def _half(hf: dict, side: str) -> ModelConfig:
    d_model, n_heads = hf["d_model"], hf[f"{side}_attention_heads"]
    vocab = hf["vocab_size"] if side == "encoder" else hf.get("decoder_vocab_size") or hf["vocab_size"]
    decoder = side == "decoder"
    return ModelConfig(
        architecture="marian",
        d_model=d_model,
        n_layers=hf[f"{side}_layers"],
        n_heads=n_heads,
        n_kv_heads=n_heads,
        d_head=d_model // n_heads,
        d_mlp=hf[f"{side}_ffn_dim"],
        d_vocab=vocab,
        n_ctx=hf["max_position_embeddings"],
        norm="layernorm",
        norm_eps=1e-5,
        positions="sinusoidal",
        sinusoid_layout="halves",
        attn_qkv_bias=True,
        attn_out_bias=True,
        pre_norms=False,
        post_ln=True,
        final_norm=False,
        causal=decoder,
        cross_attention=decoder,
        head="lm" if decoder else "none",
        act=activation(hf.get("activation_function", "gelu")),
        gated_mlp=False,
        mlp_bias=True,
        tie_embeddings=decoder and bool(hf.get("tie_word_embeddings", True)),
        unembed_bias=decoder,
        embed_scale=math.sqrt(d_model) if hf.get("scale_embedding") else 1.0,
    )


def decoder_config(hf: dict) -> ModelConfig:
    for flag in ("normalize_before", "add_final_layer_norm", "normalize_embedding", "add_bias_logits"):
        if hf.get(flag):
            raise ResidError(f"This Marian config.json sets {flag}=true (a pre-LN, normed-embedding or biased-logits "
                             "variant); resid reads the post-LN Marian only.")
    if hf.get("static_position_embeddings") is False:
        raise ResidError("This Marian config.json sets static_position_embeddings=false (learned positions); resid "
                         "reads Marian's sinusoidal positions only.")
    shared = hf.get("share_encoder_decoder_embeddings", True)
    if shared and hf.get("decoder_vocab_size") not in (None, hf["vocab_size"]):
        raise ResidError("config.json shares the embeddings but gives the decoder a different vocabulary size.")
    return _half(hf, "decoder")


def encoder_config(hf: dict) -> ModelConfig:
    return _half(hf, "encoder")


def _attention(target: str, source: str) -> list[Key]:
    return [Key(f"{target}._w_{x}", f"{source}.{x}_proj.weight") for x in "qkv"] + [
        Key(f"{target}._b_{x}", f"{source}.{x}_proj.bias") for x in "qkv"] + [
        Key(f"{target}._w_o", f"{source}.out_proj.weight"), Key(f"{target}.b_O", f"{source}.out_proj.bias")]


def _norm(target: str, source: str) -> list[Key]:
    return [Key(f"{target}.w", f"{source}.weight"), Key(f"{target}.b", f"{source}.bias")]


def _mlp(target: str, source: str) -> list[Key]:
    return [Key(f"{target}._w_in", f"{source}.fc1.weight"), Key(f"{target}.b_in", f"{source}.fc1.bias"),
            Key(f"{target}._w_out", f"{source}.fc2.weight"), Key(f"{target}.b_out", f"{source}.fc2.bias")]


def keys(encoder: ModelConfig, decoder: ModelConfig, hf: dict) -> list[Key]:
    shared = hf.get("share_encoder_decoder_embeddings", True)
    enc, dec = "model.encoder.layers.{layer}", "model.decoder.layers.{layer}"
    encoder_table = [
        Key("encoder.embed.W_E", "model.shared.weight" if shared else "model.encoder.embed_tokens.weight"),
        *_attention("encoder.blocks.{layer}.attn", f"{enc}.self_attn"),
        *_norm("encoder.blocks.{layer}.ln_attn_resid", f"{enc}.self_attn_layer_norm"),
        *_mlp("encoder.blocks.{layer}.mlp", enc),
        *_norm("encoder.blocks.{layer}.ln_mlp_resid", f"{enc}.final_layer_norm"),
    ]
    decoder_table = [
        Key("decoder.embed.W_E", "model.shared.weight" if shared else "model.decoder.embed_tokens.weight"),
        *_attention("decoder.blocks.{layer}.attn", f"{dec}.self_attn"),
        *_norm("decoder.blocks.{layer}.ln_attn_resid", f"{dec}.self_attn_layer_norm"),
        *_attention("decoder.blocks.{layer}.cross", f"{dec}.encoder_attn"),
        *_norm("decoder.blocks.{layer}.ln_cross_resid", f"{dec}.encoder_attn_layer_norm"),
        *_mlp("decoder.blocks.{layer}.mlp", dec),
        *_norm("decoder.blocks.{layer}.ln_mlp_resid", f"{dec}.final_layer_norm"),
        Key("decoder.unembed.b_U", "final_logits_bias", "one d_vocab -> (one d_vocab)"),
    ]
    if not decoder.tie_embeddings:
        decoder_table.append(Key("decoder.unembed.weight", "lm_head.weight"))
    return per_layer(encoder_table, encoder.n_layers) + per_layer(decoder_table, decoder.n_layers)


FAMILY = Family(
    model_types=("marian",),
    config=decoder_config,
    keys=lambda config: [],  # an encoder-decoder: `seq2seq_keys` gives the table of both halves
    prefix="",
    head_keys=(),
    # copies of the shared embedding (older checkpoints save every tied name) and the fixed sinusoids
    ignore=(r"model\.(encoder|decoder)\.embed_tokens\.weight", r"lm_head\.weight",
            r"model\.(encoder|decoder)\.embed_positions\.weight"),
    encoder=encoder_config,
    seq2seq_keys=keys,
    fields=frozenset({
        "d_model", "vocab_size", "decoder_vocab_size", "max_position_embeddings", "encoder_layers",
        "decoder_layers", "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim",
        "activation_function", "scale_embedding", "share_encoder_decoder_embeddings", "tie_word_embeddings",
        "normalize_before", "add_final_layer_norm", "normalize_embedding", "is_encoder_decoder",
        # training-only or generation settings
        "dropout", "activation_dropout", "encoder_layerdrop", "decoder_layerdrop", "init_std", "forced_eos_token_id",
        "num_hidden_layers", "bad_words_ids", "max_length", "num_beams", "static_position_embeddings",
        "classif_dropout", "add_bias_logits", "extra_pos_embeddings", "gradient_checkpointing", "num_labels",
    }),
)
