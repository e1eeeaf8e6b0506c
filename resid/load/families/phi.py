"""Phi-1, Phi-1.5 and Phi-2 (Microsoft 2023): a parallel block whose attention and gelu MLP (fc1, fc2) read one
LayerNorm of resid_pre (input_layernorm, read into ln_attn and ln_mlp), partial rotary, biases on every projection,
a final LayerNorm (final_layernorm) and a biased LM head (b_U).

qk_layernorm (a LayerNorm of q and k) is refused: resid's q/k norms are RMSNorms.
"""

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.load.families import ROPE_CONFIG_FIELDS, Family, activation, context, hf_get, rope
from resid.load.weights import Key, per_layer


def config_from_hf(hf: dict) -> ModelConfig:
    if hf.get("qk_layernorm"):
        raise ResidError("config.json has qk_layernorm: true (a LayerNorm of the queries and keys), which resid does "
                         "not support (its q/k norms are RMSNorms). Use a model without it.")
    d_model, n_heads = hf["hidden_size"], hf["num_attention_heads"]
    rotary = rope(hf)
    d_head = d_model // n_heads
    return ModelConfig(
        architecture="phi",
        d_model=d_model,
        n_layers=hf["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=hf_get(hf, "num_key_value_heads", default=n_heads),
        d_head=d_head,
        d_mlp=hf["intermediate_size"],
        d_vocab=hf["vocab_size"],
        n_ctx=context(hf, rotary),
        norm="layernorm",
        norm_eps=hf_get(hf, "layer_norm_eps", default=1e-5),
        block="parallel",
        positions="rotary",
        rotary_dim=None if rotary.partial == 1.0 else int(d_head * rotary.partial),
        rotary_base=rotary.base,
        rope_scaling=rotary.scaling,
        attn_qkv_bias=True,
        attn_out_bias=True,
        act=activation(hf.get("hidden_act", "gelu_new")),
        gated_mlp=False,
        mlp_bias=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        unembed_bias=True,
    )


def keys(config: ModelConfig) -> list[Key]:
    layer = "model.layers.{layer}"
    attn, mlp = f"{layer}.self_attn", f"{layer}.mlp"
    table = [
        Key("embed.W_E", "model.embed_tokens.weight"),
        Key("blocks.{layer}.ln_attn.w", f"{layer}.input_layernorm.weight"),
        Key("blocks.{layer}.ln_attn.b", f"{layer}.input_layernorm.bias"),
        Key("blocks.{layer}.ln_mlp.w", f"{layer}.input_layernorm.weight"),
        Key("blocks.{layer}.ln_mlp.b", f"{layer}.input_layernorm.bias"),
        Key("blocks.{layer}.attn.W_Q", f"{attn}.q_proj.weight", "(head d_head) d_model -> head d_model d_head"),
        Key("blocks.{layer}.attn.W_K", f"{attn}.k_proj.weight", "(kv_head d_head) d_model -> kv_head d_model d_head"),
        Key("blocks.{layer}.attn.W_V", f"{attn}.v_proj.weight", "(kv_head d_head) d_model -> kv_head d_model d_head"),
        Key("blocks.{layer}.attn.W_O", f"{attn}.dense.weight", "d_model (head d_head) -> head d_head d_model"),
        Key("blocks.{layer}.attn.b_Q", f"{attn}.q_proj.bias", "(head d_head) -> head d_head"),
        Key("blocks.{layer}.attn.b_K", f"{attn}.k_proj.bias", "(kv_head d_head) -> kv_head d_head"),
        Key("blocks.{layer}.attn.b_V", f"{attn}.v_proj.bias", "(kv_head d_head) -> kv_head d_head"),
        Key("blocks.{layer}.attn.b_O", f"{attn}.dense.bias"),
        Key("blocks.{layer}.mlp.W_in", f"{mlp}.fc1.weight", "d_mlp d_model -> d_model d_mlp"),
        Key("blocks.{layer}.mlp.b_in", f"{mlp}.fc1.bias"),
        Key("blocks.{layer}.mlp.W_out", f"{mlp}.fc2.weight", "d_model d_mlp -> d_mlp d_model"),
        Key("blocks.{layer}.mlp.b_out", f"{mlp}.fc2.bias"),
        Key("ln_final.w", "model.final_layernorm.weight"),
        Key("ln_final.b", "model.final_layernorm.bias"),
        Key("unembed.b_U", "lm_head.bias"),
    ]
    if not config.tie_embeddings:
        table.append(Key("unembed.W_U", "lm_head.weight", "d_vocab d_model -> d_model d_vocab"))
    return per_layer(table, config.n_layers)


FAMILY = Family(
    model_types=("phi",),
    config=config_from_hf,
    keys=keys,
    head_keys=("lm_head.weight", "lm_head.bias"),
    prepend_bos=False,
    fields=ROPE_CONFIG_FIELDS | {
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
        "vocab_size", "layer_norm_eps", "qk_layernorm", "hidden_act", "tie_word_embeddings",
    },
)
