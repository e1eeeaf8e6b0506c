"""Llama 1-3, Mistral and Qwen2: pre-norm RMSNorm, rotary, (grouped-query) attention, SwiGLU MLP.

They differ only in config: Llama 3.x scales its rotary ("llama3"), Qwen2 has q/k/v biases and, with
use_sliding_window, a window on the layers from max_window_layers on (layer_types), Mistral a window
everywhere. Hugging Face stores each
projection as nn.Linear [out in] with rows `(head d_head)`; resid's per-head views are [head d_model d_head].
The GGUF loader reuses this table after renaming llama.cpp's tensors (and un-permuting its Q/K rows).
"""

from resid.config import ModelConfig
from resid.load.families import ROPE_CONFIG_FIELDS, Family, activation, context, hf_get, layer_types, rope
from resid.load.weights import Key, per_layer

FIELDS = ROPE_CONFIG_FIELDS | {
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "vocab_size", "rms_norm_eps", "attention_bias", "mlp_bias", "hidden_act",
    "tie_word_embeddings", "sliding_window", "use_sliding_window", "max_window_layers", "layer_types",
}


def sliding(hf: dict, n_layers: int) -> tuple[int | None, tuple[str, ...] | None]:
    """(window, layer types): Mistral slides everywhere; Qwen2/3 only with use_sliding_window, on the layers
    from max_window_layers on (or as config.json's layer_types says)."""
    window = hf.get("sliding_window")
    if hf.get("model_type") == "mistral" or "use_sliding_window" not in hf:
        return window, None
    if not hf.get("use_sliding_window") or window is None:
        return None, None
    types = layer_types(hf, n_layers)
    if types is None:
        first = hf.get("max_window_layers", n_layers)
        types = tuple("sliding" if layer >= first else "full" for layer in range(n_layers))
    return window, types


def config_from_hf(hf: dict, **overrides) -> ModelConfig:
    model_type = hf.get("model_type", "llama")
    n_heads, n_layers = hf["num_attention_heads"], hf["num_hidden_layers"]
    qkv_bias = model_type == "qwen2" or bool(hf.get("attention_bias", False))
    window, types = sliding(hf, n_layers)
    d_head = hf_get(hf, "head_dim", default=hf["hidden_size"] // n_heads)
    rotary = rope(hf)
    fields = dict(
        architecture=model_type,
        d_model=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=hf_get(hf, "num_key_value_heads", default=n_heads),
        d_head=d_head,
        d_mlp=hf["intermediate_size"],
        d_vocab=hf["vocab_size"],
        n_ctx=context(hf, rotary),
        norm="rmsnorm",
        norm_eps=hf_get(hf, "rms_norm_eps", default=1e-6),
        positions="rotary",
        rotary_dim=None if rotary.partial == 1.0 else int(d_head * rotary.partial),
        rotary_base=rotary.base,
        rope_scaling=rotary.scaling,
        attn_qkv_bias=qkv_bias,
        attn_out_bias=model_type != "qwen2" and bool(hf.get("attention_bias", False)),
        sliding_window=window,
        layer_types=types,
        act=activation(hf.get("hidden_act", "silu")),
        gated_mlp=True,
        mlp_bias=bool(hf.get("mlp_bias", False)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )
    return ModelConfig(**{**fields, **overrides})


# Qwen3, Gemma 3 and OLMo 2: the q/k RMSNorm gains, under Llama's names
QK_NORMS = [
    Key("blocks.{layer}.attn.q_norm.w", "model.layers.{layer}.self_attn.q_norm.weight"),
    Key("blocks.{layer}.attn.k_norm.w", "model.layers.{layer}.self_attn.k_norm.weight"),
]


def keys(config: ModelConfig) -> list[Key]:
    return per_layer(table(config), config.n_layers)


def table(config: ModelConfig) -> list[Key]:
    """The key table with `{layer}` unexpanded (families built on Llama's names extend it)."""
    attn, mlp = "model.layers.{layer}.self_attn", "model.layers.{layer}.mlp"
    table = [
        Key("embed.W_E", "model.embed_tokens.weight"),
        Key("blocks.{layer}.ln_attn.w", "model.layers.{layer}.input_layernorm.weight"),
        Key("blocks.{layer}.attn.W_Q", f"{attn}.q_proj.weight", "(head d_head) d_model -> head d_model d_head"),
        Key("blocks.{layer}.attn.W_K", f"{attn}.k_proj.weight", "(kv_head d_head) d_model -> kv_head d_model d_head"),
        Key("blocks.{layer}.attn.W_V", f"{attn}.v_proj.weight", "(kv_head d_head) d_model -> kv_head d_model d_head"),
        Key("blocks.{layer}.attn.W_O", f"{attn}.o_proj.weight", "d_model (head d_head) -> head d_head d_model"),
        Key("blocks.{layer}.ln_mlp.w", "model.layers.{layer}.post_attention_layernorm.weight"),
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
        ]
    if config.attn_out_bias:
        table.append(Key("blocks.{layer}.attn.b_O", f"{attn}.o_proj.bias"))
    if config.mlp_bias:
        table += [
            Key("blocks.{layer}.mlp.b_in", f"{mlp}.up_proj.bias"),
            Key("blocks.{layer}.mlp.b_gate", f"{mlp}.gate_proj.bias"),
            Key("blocks.{layer}.mlp.b_out", f"{mlp}.down_proj.bias"),
        ]
    if not config.tie_embeddings:
        table.append(Key("unembed.W_U", "lm_head.weight", "d_vocab d_model -> d_model d_vocab"))
    return table


FAMILY = Family(
    model_types=("llama", "mistral", "qwen2"),
    config=config_from_hf,
    keys=keys,
    prepend_bos=True,
    fields=FIELDS,
)
