"""Llama, Mistral and Qwen2: pre-norm RMSNorm, rotary, (grouped-query) attention, SwiGLU MLP.

They differ only in config: Qwen2 has q/k/v biases, Mistral a sliding window. Hugging Face stores each
projection as nn.Linear [out in] with rows `(head d_head)`; resid's per-head views are [head d_model d_head].
The GGUF loader reuses this table after renaming llama.cpp's tensors (and un-permuting its Q/K rows).
"""

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.load.families import Family, activation, hf_get, rope_base
from resid.load.weights import Key, per_layer


def config_from_hf(hf: dict) -> ModelConfig:
    model_type = hf.get("model_type", "llama")
    n_heads = hf["num_attention_heads"]
    qkv_bias = model_type == "qwen2" or bool(hf.get("attention_bias", False))
    sliding_window = None
    if model_type == "mistral":
        sliding_window = hf.get("sliding_window")
    elif model_type == "qwen2" and hf.get("use_sliding_window"):
        raise ResidError("Qwen2 with use_sliding_window=true is not supported yet; only full attention is.")
    return ModelConfig(
        architecture=model_type,
        d_model=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=hf_get(hf, "num_key_value_heads", default=n_heads),
        d_head=hf_get(hf, "head_dim", default=hf["hidden_size"] // n_heads),
        d_mlp=hf["intermediate_size"],
        d_vocab=hf["vocab_size"],
        n_ctx=hf["max_position_embeddings"],
        norm="rmsnorm",
        norm_eps=hf_get(hf, "rms_norm_eps", default=1e-6),
        positions="rotary",
        rotary_base=rope_base(hf),
        attn_qkv_bias=qkv_bias,
        attn_out_bias=model_type != "qwen2" and bool(hf.get("attention_bias", False)),
        sliding_window=sliding_window,
        act=activation(hf.get("hidden_act", "silu")),
        gated_mlp=True,
        mlp_bias=bool(hf.get("mlp_bias", False)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )


def keys(config: ModelConfig) -> list[Key]:
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
    return per_layer(table, config.n_layers)


FAMILY = Family(
    model_types=("llama", "mistral", "qwen2"),
    config=config_from_hf,
    keys=keys,
    prefix="model.",
    head_keys=("lm_head.weight",),
    ignore=(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),
    prepend_bos=True,
)
