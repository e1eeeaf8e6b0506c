"""StableLM 2 / StableLM-3B-4E1T (Stability AI 2023-24): LayerNorm (with biases), partial rotary
(partial_rotary_factor), optional q/k/v biases (use_qkv_bias), a SwiGLU MLP, sequential blocks or, with
use_parallel_residual, a parallel block whose attention and MLP read one norm (read into ln_attn and ln_mlp).

qk_layernorm (StableLM 2 12B's per-head LayerNorm of q and k) is refused: resid's q/k norms are RMSNorms.
"""

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.load.families import ROPE_CONFIG_FIELDS, Family, activation, context, hf_get, rope
from resid.load.weights import Key, per_layer


def config_from_hf(hf: dict) -> ModelConfig:
    if hf.get("qk_layernorm"):
        raise ResidError("config.json has qk_layernorm: true (a LayerNorm of each head's queries and keys), which "
                         "resid does not support (its q/k norms are RMSNorms). Use a model without it.")
    d_model, n_heads = hf["hidden_size"], hf["num_attention_heads"]
    rotary = rope(hf)
    d_head = d_model // n_heads
    return ModelConfig(
        architecture="stablelm",
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
        block="parallel" if hf.get("use_parallel_residual") else "sequential",
        positions="rotary",
        rotary_dim=None if rotary.partial == 1.0 else int(d_head * rotary.partial),
        rotary_base=rotary.base,
        rope_scaling=rotary.scaling,
        attn_qkv_bias=bool(hf.get("use_qkv_bias", False)),
        act=activation(hf.get("hidden_act", "silu")),
        gated_mlp=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )


def keys(config: ModelConfig) -> list[Key]:
    layer = "model.layers.{layer}"
    attn, mlp = f"{layer}.self_attn", f"{layer}.mlp"
    mlp_norm = "input_layernorm" if config.block == "parallel" else "post_attention_layernorm"
    table = [
        Key("embed.W_E", "model.embed_tokens.weight"),
        Key("blocks.{layer}.ln_attn.w", f"{layer}.input_layernorm.weight"),
        Key("blocks.{layer}.ln_attn.b", f"{layer}.input_layernorm.bias"),
        Key("blocks.{layer}.attn.W_Q", f"{attn}.q_proj.weight", "(head d_head) d_model -> head d_model d_head"),
        Key("blocks.{layer}.attn.W_K", f"{attn}.k_proj.weight", "(kv_head d_head) d_model -> kv_head d_model d_head"),
        Key("blocks.{layer}.attn.W_V", f"{attn}.v_proj.weight", "(kv_head d_head) d_model -> kv_head d_model d_head"),
        Key("blocks.{layer}.attn.W_O", f"{attn}.o_proj.weight", "d_model (head d_head) -> head d_head d_model"),
        Key("blocks.{layer}.ln_mlp.w", f"{layer}.{mlp_norm}.weight"),
        Key("blocks.{layer}.ln_mlp.b", f"{layer}.{mlp_norm}.bias"),
        Key("blocks.{layer}.mlp.W_in", f"{mlp}.up_proj.weight", "d_mlp d_model -> d_model d_mlp"),
        Key("blocks.{layer}.mlp.W_gate", f"{mlp}.gate_proj.weight", "d_mlp d_model -> d_model d_mlp"),
        Key("blocks.{layer}.mlp.W_out", f"{mlp}.down_proj.weight", "d_model d_mlp -> d_mlp d_model"),
        Key("ln_final.w", "model.norm.weight"),
        Key("ln_final.b", "model.norm.bias"),
    ]
    if config.attn_qkv_bias:
        table += [
            Key("blocks.{layer}.attn.b_Q", f"{attn}.q_proj.bias", "(head d_head) -> head d_head"),
            Key("blocks.{layer}.attn.b_K", f"{attn}.k_proj.bias", "(kv_head d_head) -> kv_head d_head"),
            Key("blocks.{layer}.attn.b_V", f"{attn}.v_proj.bias", "(kv_head d_head) -> kv_head d_head"),
        ]
    if not config.tie_embeddings:
        table.append(Key("unembed.W_U", "lm_head.weight", "d_vocab d_model -> d_model d_vocab"))
    return per_layer(table, config.n_layers)


FAMILY = Family(
    model_types=("stablelm",),
    config=config_from_hf,
    keys=keys,
    prepend_bos=False,
    fields=ROPE_CONFIG_FIELDS | {
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
        "vocab_size", "layer_norm_eps", "use_qkv_bias", "qk_layernorm", "use_parallel_residual", "hidden_act",
        "tie_word_embeddings",
    },
)
