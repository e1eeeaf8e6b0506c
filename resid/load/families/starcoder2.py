"""StarCoder2 (Lozhkov et al. 2024): pre-norm LayerNorm (with biases), rotary, grouped-query attention, a plain
(ungated) gelu-tanh MLP (c_fc, c_proj), biases on every projection (use_bias), a sliding window on every layer when
set, tied embeddings."""

from resid.config import ModelConfig
from resid.load.families import ROPE_CONFIG_FIELDS, Family, activation, context, hf_get, rope
from resid.load.weights import Key, per_layer


def config_from_hf(hf: dict) -> ModelConfig:
    d_model, n_heads = hf["hidden_size"], hf["num_attention_heads"]
    rotary = rope(hf)
    bias = bool(hf.get("use_bias", True))
    return ModelConfig(
        architecture="starcoder2",
        d_model=d_model,
        n_layers=hf["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=hf_get(hf, "num_key_value_heads", default=n_heads),
        d_head=d_model // n_heads,
        d_mlp=hf["intermediate_size"],
        d_vocab=hf["vocab_size"],
        n_ctx=context(hf, rotary),
        norm="layernorm",
        norm_eps=hf_get(hf, "norm_epsilon", default=1e-5),
        positions="rotary",
        rotary_base=rotary.base,
        rope_scaling=rotary.scaling,
        attn_qkv_bias=bias,
        attn_out_bias=bias,
        sliding_window=hf.get("sliding_window"),
        act=activation(hf.get("hidden_act", "gelu_pytorch_tanh")),
        gated_mlp=False,
        mlp_bias=bias,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
    )


def keys(config: ModelConfig) -> list[Key]:
    layer = "model.layers.{layer}"
    attn, mlp = f"{layer}.self_attn", f"{layer}.mlp"
    table = [
        Key("embed.W_E", "model.embed_tokens.weight"),
        Key("blocks.{layer}.ln_attn.w", f"{layer}.input_layernorm.weight"),
        Key("blocks.{layer}.ln_attn.b", f"{layer}.input_layernorm.bias"),
        Key("blocks.{layer}.attn.W_Q", f"{attn}.q_proj.weight", "(head d_head) d_model -> head d_model d_head"),
        Key("blocks.{layer}.attn.W_K", f"{attn}.k_proj.weight", "(kv_head d_head) d_model -> kv_head d_model d_head"),
        Key("blocks.{layer}.attn.W_V", f"{attn}.v_proj.weight", "(kv_head d_head) d_model -> kv_head d_model d_head"),
        Key("blocks.{layer}.attn.W_O", f"{attn}.o_proj.weight", "d_model (head d_head) -> head d_head d_model"),
        Key("blocks.{layer}.ln_mlp.w", f"{layer}.post_attention_layernorm.weight"),
        Key("blocks.{layer}.ln_mlp.b", f"{layer}.post_attention_layernorm.bias"),
        Key("blocks.{layer}.mlp.W_in", f"{mlp}.c_fc.weight", "d_mlp d_model -> d_model d_mlp"),
        Key("blocks.{layer}.mlp.W_out", f"{mlp}.c_proj.weight", "d_model d_mlp -> d_mlp d_model"),
        Key("ln_final.w", "model.norm.weight"),
        Key("ln_final.b", "model.norm.bias"),
    ]
    if config.attn_qkv_bias:
        table += [
            Key("blocks.{layer}.attn.b_Q", f"{attn}.q_proj.bias", "(head d_head) -> head d_head"),
            Key("blocks.{layer}.attn.b_K", f"{attn}.k_proj.bias", "(kv_head d_head) -> kv_head d_head"),
            Key("blocks.{layer}.attn.b_V", f"{attn}.v_proj.bias", "(kv_head d_head) -> kv_head d_head"),
            Key("blocks.{layer}.attn.b_O", f"{attn}.o_proj.bias"),
            Key("blocks.{layer}.mlp.b_in", f"{mlp}.c_fc.bias"),
            Key("blocks.{layer}.mlp.b_out", f"{mlp}.c_proj.bias"),
        ]
    if not config.tie_embeddings:
        table.append(Key("unembed.W_U", "lm_head.weight", "d_vocab d_model -> d_model d_vocab"))
    return per_layer(table, config.n_layers)


FAMILY = Family(
    model_types=("starcoder2",),
    config=config_from_hf,
    keys=keys,
    prepend_bos=False,
    fields=ROPE_CONFIG_FIELDS | {
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
        "vocab_size", "norm_epsilon", "use_bias", "hidden_act", "tie_word_embeddings", "sliding_window",
        "residual_dropout", "embedding_dropout",
    },
)
