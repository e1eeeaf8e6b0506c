"""Gemma (Gemma Team 2024): Llama's layout and tensor names, with three differences expressed as config:

- RMSNorm gains are stored as w and applied as (1 + w) (norm_gain_offset=1.0), computed in float32;
- the token embedding is multiplied by sqrt(d_model), rounded to the model dtype first as Hugging Face does
  (55.4256 becomes 55.5 in bfloat16 for d_model=3072), which embed_scale reproduces;
- the MLP is GeGLU with the tanh approximation of gelu. Hugging Face maps a legacy `hidden_act: "gelu"` in
  a Gemma config.json to "gelu_pytorch_tanh" (the released weights were trained with it); so does resid.

head_dim is its own field (256 for Gemma-7B with 16 heads of d_model=3072), and embeddings are tied.
Gemma 2 and 3 (soft-capping, sandwich norms, local/global layers) are other model_types, not read here.
"""

from resid.config import ModelConfig
from resid.load.families import ROPE_CONFIG_FIELDS, Family, activation, hf_get, llama, rope_base


def config_from_hf(hf: dict) -> ModelConfig:
    d_model, n_heads = hf["hidden_size"], hf["num_attention_heads"]
    act = hf_get(hf, "hidden_act", "hidden_activation", default="gelu_pytorch_tanh")
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        architecture="gemma",
        d_model=d_model,
        n_layers=hf["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=hf_get(hf, "num_key_value_heads", default=n_heads),
        d_head=hf_get(hf, "head_dim", default=d_model // n_heads),
        d_mlp=hf["intermediate_size"],
        d_vocab=hf["vocab_size"],
        n_ctx=hf["max_position_embeddings"],
        norm="rmsnorm",
        norm_eps=hf_get(hf, "rms_norm_eps", default=1e-6),
        norm_gain_offset=1.0,
        positions="rotary",
        rotary_base=rope_base(hf),
        attn_qkv_bias=bias,
        attn_out_bias=bias,
        act="gelu_new" if act == "gelu" else activation(act),
        gated_mlp=True,
        mlp_bias=False,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        embed_scale=d_model**0.5,
    )


FAMILY = Family(
    model_types=("gemma",),
    config=config_from_hf,
    keys=llama.keys,  # same tensor names and layouts as Llama
    prepend_bos=True,
    fields=ROPE_CONFIG_FIELDS | {
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
        "intermediate_size", "vocab_size", "rms_norm_eps", "attention_bias", "hidden_act", "hidden_activation",
        "tie_word_embeddings",
    },
)
