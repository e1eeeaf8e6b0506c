"""T5 (Raffel et al. 2020; Hugging Face's `t5`, `mt5`, which has the same tensors, and `umt5`, whose every layer
has a bias table of its own): a pre-norm encoder-decoder with

- relative position bias instead of positions (resid.components.relative): a table of [bucket head] in the
  first layer of each stack, shared by all its layers (umT5: one per layer), bidirectional buckets in the
  encoder and causal ones in the decoder; cross-attention has none;
- no 1/sqrt(d_head) scaling of the scores (the initialisation absorbs it);
- RMSNorm without mean or bias, computed in float32 (T5LayerNorm), before every sublayer and at the end of
  both stacks (the encoder's final norm gives the memory every cross-attention reads);
- no biases anywhere; a ReLU MLP (T5 v1.0: `wi`, `wo`) or a gated GELU (v1.1, Flan-T5, mT5: `gelu_new(wi_0 x)
  * wi_1 x`);
- one embedding shared by both stacks. v1.0 ties the LM head to it and multiplies the decoder's output by
  d_model^-0.5 first (resid folds that constant into the final norm's gain: config.final_norm_multiplier);
  v1.1 has its own `lm_head.weight` and no rescaling (its config.json says tie_word_embeddings=false).

transformers >= 5 writes `scale_decoder_outputs` for the rescaling and always ties the head; resid reads that
field when present and otherwise decides from tie_word_embeddings as the original checkpoints mean it.
Loaded as a resid.EncoderDecoder.
"""

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.load.families import Family, activation
from resid.load.weights import Key, per_layer


def _mlp_kind(hf: dict) -> tuple[str, bool]:
    """(activation, gated) from feed_forward_proj ("relu", "gated-gelu", ...)."""
    proj = str(hf.get("feed_forward_proj", "relu"))
    parts = proj.split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise ResidError(f"config.json's feed_forward_proj {proj!r} is not 'ACT' or 'gated-ACT' (e.g. 'relu', "
                         "'gated-gelu'); fix that field.")
    gated = len(parts) == 2
    act = "gelu_new" if proj == "gated-gelu" else parts[-1]  # transformers' T5Config maps gated-gelu to gelu_new
    return activation(act), gated


def _tied(hf: dict) -> bool:
    return hf.get("tie_word_embeddings", True) is not False


def _scaled(hf: dict) -> bool:
    """Whether the decoder's output is rescaled by d_model^-0.5 before the head (T5 v1.0)."""
    if hf.get("scale_decoder_outputs") is not None:
        return bool(hf["scale_decoder_outputs"])
    return _tied(hf)


def _half(hf: dict, side: str) -> ModelConfig:
    decoder = side == "decoder"
    act, gated = _mlp_kind(hf)
    n_layers = hf["num_layers"] if not decoder else (hf.get("num_decoder_layers") or hf["num_layers"])
    d_model = hf["d_model"]
    return ModelConfig(
        architecture=str(hf.get("model_type", "t5")),
        d_model=d_model,
        n_layers=n_layers,
        n_heads=hf["num_heads"],
        n_kv_heads=hf["num_heads"],
        d_head=hf["d_kv"],
        d_mlp=hf["d_ff"],
        d_vocab=hf["vocab_size"],
        n_ctx=hf.get("n_positions") or 512,  # the trained length; relative positions read any
        norm="rmsnorm",
        norm_eps=hf.get("layer_norm_epsilon", 1e-6),
        positions="relative",
        relative_buckets=hf.get("relative_attention_num_buckets", 32),
        relative_max_distance=hf.get("relative_attention_max_distance", 128),
        relative_bias_per_layer=hf.get("model_type") == "umt5",  # umT5: every layer has its own table
        attn_scale=1.0,
        causal=decoder,
        cross_attention=decoder,
        head="lm" if decoder else "none",
        act=act,
        gated_mlp=gated,
        tie_embeddings=decoder and _tied(hf),
        final_norm_multiplier=d_model**-0.5 if decoder and _scaled(hf) else 1.0,
    )


def decoder_config(hf: dict) -> ModelConfig:
    if hf.get("is_encoder_decoder") is False:
        raise ResidError("This T5 config.json sets is_encoder_decoder=false (an encoder-only T5EncoderModel); "
                         "resid reads T5 as an encoder-decoder.")
    return _half(hf, "decoder")


def encoder_config(hf: dict) -> ModelConfig:
    return _half(hf, "encoder")


def _stack(side: str, config: ModelConfig) -> list[Key]:
    layer = f"{side}.block.{{layer}}.layer"
    attn = f"{layer}.0.SelfAttention"
    mlp_at = 2 if config.cross_attention else 1  # decoder blocks: self-attention, cross-attention, MLP
    target = f"{side}.blocks.{{layer}}"
    keys = [
        Key(f"{side}.embed.W_E", "shared.weight"),
        Key(f"{side}.relative.tables.{{layer}}" if config.relative_bias_per_layer else f"{side}.relative.tables.0",
            f"{attn}.relative_attention_bias.weight" if config.relative_bias_per_layer else
            f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
        *[Key(f"{target}.attn._w_{x}", f"{attn}.{x}.weight") for x in "qkvo"],
        Key(f"{target}.ln_attn.w", f"{layer}.0.layer_norm.weight"),
        Key(f"{target}.ln_mlp.w", f"{layer}.{mlp_at}.layer_norm.weight"),
        Key(f"{target}.mlp._w_out", f"{layer}.{mlp_at}.DenseReluDense.wo.weight"),
        Key(f"{side}.ln_final.w", f"{side}.final_layer_norm.weight"),
    ]
    dense = f"{layer}.{mlp_at}.DenseReluDense"
    if config.gated_mlp:  # act(wi_0 x) * wi_1 x: wi_0 is the gate
        keys += [Key(f"{target}.mlp._w_gate", f"{dense}.wi_0.weight"),
                 Key(f"{target}.mlp._w_in", f"{dense}.wi_1.weight")]
    else:
        keys.append(Key(f"{target}.mlp._w_in", f"{dense}.wi.weight"))
    if config.cross_attention:
        cross = f"{layer}.1.EncDecAttention"
        keys += [Key(f"{target}.cross._w_{x}", f"{cross}.{x}.weight") for x in "qkvo"]
        keys.append(Key(f"{target}.ln_cross.w", f"{layer}.1.layer_norm.weight"))
    return keys


def keys(encoder: ModelConfig, decoder: ModelConfig, hf: dict) -> list[Key]:
    table = per_layer(_stack("encoder", encoder), encoder.n_layers) + per_layer(_stack("decoder", decoder),
                                                                               decoder.n_layers)
    if not decoder.tie_embeddings:
        table.append(Key("decoder.unembed.weight", "lm_head.weight"))
    return table


FAMILY = Family(
    model_types=("t5", "mt5", "umt5"),
    config=decoder_config,
    keys=lambda config: [],  # an encoder-decoder: `seq2seq_keys` gives the table of both halves
    prefix="",
    head_keys=("lm_head.weight",),  # v1.1's own head (a copy of the embedding in tied checkpoints: ignored)
    # copies of the shared embedding (every tied name may be saved), and the table transformers keeps (unused)
    # in the first cross-attention of some checkpoints
    ignore=(r"(encoder|decoder)\.embed_tokens\.weight", r"decoder\.block\.0\.layer\.1\.EncDecAttention\."
            r"relative_attention_bias\.weight"),
    template=True,  # the tokenizer's template appends </s>
    encoder=encoder_config,
    seq2seq_keys=keys,
    fields=frozenset({
        "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers", "num_heads", "vocab_size", "n_positions",
        "relative_attention_num_buckets", "relative_attention_max_distance", "layer_norm_epsilon",
        "feed_forward_proj", "dense_act_fn", "is_gated_act", "tie_word_embeddings", "scale_decoder_outputs",
        "is_encoder_decoder",
        # training-only or generation settings
        "dropout_rate", "initializer_factor", "gradient_checkpointing", "classifier_dropout", "output_past",
    }),
)
