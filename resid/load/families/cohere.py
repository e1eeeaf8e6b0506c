"""Command R (Cohere 2024, model_type cohere) and Command R7B / A (cohere2): a parallel block whose attention and
SwiGLU MLP both read one LayerNorm (without a bias) of resid_pre, rotary with interleaved pairs, tied embeddings and
the logits multiplied by logit_scale.

- the one norm (input_layernorm) is read into both ln_attn and ln_mlp: the same numbers, the parallel block's two
  reads;
- interleaved rotary pairs (2i, 2i + 1) are regathered into rotate_half's halves at load (rotary_halves);
- logit_scale is folded into the final norm's gain (final_norm_multiplier);
- cohere2: sliding-window attention on the layers layer_types names, and no position embedding on the global ones
  (NoPE).
use_qk_norm (Command R+'s per-head LayerNorm of q and k) is refused: resid's q/k norms are RMSNorms.
"""

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.load.families import (
    ROPE_CONFIG_FIELDS,
    Family,
    activation,
    context,
    hf_get,
    interleaved_rotary,
    layer_types,
    rope,
)
from resid.load.weights import Key, per_layer


def config_from_hf(hf: dict) -> ModelConfig:
    if hf.get("use_qk_norm"):
        raise ResidError("config.json has use_qk_norm: true (a LayerNorm of each head's queries and keys, Command R+), "
                         "which resid does not support (its q/k norms are RMSNorms). Use a model without it.")
    d_model, n_heads, n_layers = hf["hidden_size"], hf["num_attention_heads"], hf["num_hidden_layers"]
    rotary = rope(hf)
    window = types = None
    nope: tuple[int, ...] = ()
    if hf.get("model_type") == "cohere2":
        types = layer_types(hf, n_layers)
        window = hf.get("sliding_window")
        if types is not None and window is not None and "sliding" in types:
            nope = tuple(layer for layer, kind in enumerate(types) if kind == "full")
        else:
            types = window = None
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        architecture=hf["model_type"],
        d_model=d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=hf_get(hf, "num_key_value_heads", default=n_heads),
        d_head=hf_get(hf, "head_dim", default=d_model // n_heads),
        d_mlp=hf["intermediate_size"],
        d_vocab=hf["vocab_size"],
        n_ctx=context(hf, rotary),
        norm="layernorm",
        norm_eps=hf_get(hf, "layer_norm_eps", default=1e-5),
        block="parallel",
        positions="rotary",
        rotary_base=rotary.base,
        rope_scaling=rotary.scaling,
        nope_layers=nope,
        attn_qkv_bias=bias,
        attn_out_bias=bias,
        sliding_window=window,
        layer_types=types,
        act=activation(hf.get("hidden_act", "silu")),
        gated_mlp=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        final_norm_multiplier=float(hf.get("logit_scale", 1.0)),
    )


def table(config: ModelConfig) -> list[Key]:
    """Cohere's names (Llama's) with its one norm read twice (and its rotary regathered)."""
    attn, mlp = "model.layers.{layer}.self_attn", "model.layers.{layer}.mlp"
    table = [
        Key("embed.W_E", "model.embed_tokens.weight"),
        Key("blocks.{layer}.ln_attn.w", "model.layers.{layer}.input_layernorm.weight"),
        Key("blocks.{layer}.ln_mlp.w", "model.layers.{layer}.input_layernorm.weight"),
        Key("blocks.{layer}.attn.W_Q", f"{attn}.q_proj.weight", "(head d_head) d_model -> head d_model d_head"),
        Key("blocks.{layer}.attn.W_K", f"{attn}.k_proj.weight", "(kv_head d_head) d_model -> kv_head d_model d_head"),
        Key("blocks.{layer}.attn.W_V", f"{attn}.v_proj.weight", "(kv_head d_head) d_model -> kv_head d_model d_head"),
        Key("blocks.{layer}.attn.W_O", f"{attn}.o_proj.weight", "d_model (head d_head) -> head d_head d_model"),
        Key("blocks.{layer}.mlp.W_in", f"{mlp}.up_proj.weight", "d_mlp d_model -> d_model d_mlp"),
        Key("blocks.{layer}.mlp.W_gate", f"{mlp}.gate_proj.weight", "d_mlp d_model -> d_model d_mlp"),
        Key("blocks.{layer}.mlp.W_out", f"{mlp}.down_proj.weight", "d_model d_mlp -> d_mlp d_model"),
        Key("ln_final.w", "model.norm.weight"),
    ]
    if config.attn_qkv_bias:
        table += [
            Key("blocks.{layer}.attn.b_Q", f"{attn}.q_proj.bias", "(head d_head) -> head d_head"),
            Key("blocks.{layer}.attn.b_K", f"{attn}.k_proj.bias", "(kv_head d_head) -> kv_head d_head"),
            Key("blocks.{layer}.attn.b_V", f"{attn}.v_proj.bias", "(kv_head d_head) -> kv_head d_head"),
            Key("blocks.{layer}.attn.b_O", f"{attn}.o_proj.bias"),
        ]
    if not config.tie_embeddings:
        table.append(Key("unembed.W_U", "lm_head.weight", "d_vocab d_model -> d_model d_vocab"))
    return interleaved_rotary(table, config)


def keys(config: ModelConfig) -> list[Key]:
    return per_layer(table(config), config.n_layers)


FAMILY = Family(
    model_types=("cohere", "cohere2"),
    config=config_from_hf,
    keys=keys,
    prepend_bos=True,
    fields=ROPE_CONFIG_FIELDS | {
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
        "intermediate_size", "vocab_size", "layer_norm_eps", "attention_bias", "hidden_act", "tie_word_embeddings",
        "logit_scale", "use_qk_norm", "sliding_window", "layer_types",
    },
)
