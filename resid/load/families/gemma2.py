"""Gemma 2 and Gemma 3 (text): Gemma's layout (gains stored as w, applied as 1 + w; embeddings times
sqrt(d_model); GeGLU with tanh gelu; tied embeddings) plus

- "sandwich" norms: each sublayer has a norm before it and one after it, on its output, before the write:
  input_layernorm -> attention -> post_attention_layernorm; pre_feedforward_layernorm -> MLP ->
  post_feedforward_layernorm. Trap: in Llama, post_attention_layernorm is the MLP's *pre*-norm.
- attention scores scaled by query_pre_attn_scalar^-0.5 instead of d_head^-0.5;
- sliding-window and global layers (layer_types; Gemma 2 alternates, Gemma 3 has five local per global);
- Gemma 2: attention-score and final-logit soft caps (cap * tanh(x / cap));
- Gemma 3: an RMSNorm on each head's queries and keys before rotary (also 1 + w), and two rotaries: the global
  layers use rope_theta (1e6, possibly scaled), the local ones rope_local_base_freq (1e4), unscaled.
"""

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.load.families import ROPE_CONFIG_FIELDS, Family, activation, context, hf_get, layer_types, llama, rope
from resid.load.weights import Key, per_layer

FIELDS = ROPE_CONFIG_FIELDS | {
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "vocab_size", "rms_norm_eps", "attention_bias", "hidden_act", "hidden_activation",
    "tie_word_embeddings", "query_pre_attn_scalar", "sliding_window", "layer_types", "attn_logit_softcapping",
    "final_logit_softcapping", "rope_local_base_freq", "sliding_window_pattern", "_sliding_window_pattern",
    "cache_implementation",
}


def _layer_types(hf: dict, n_layers: int, gemma3: bool) -> tuple[str, ...]:
    types = layer_types(hf, n_layers)
    if types is not None:
        return types
    # transformers' defaults: Gemma 2 alternates (sliding first); Gemma 3 makes every `pattern`-th layer global
    pattern = hf_get(hf, "sliding_window_pattern", "_sliding_window_pattern", default=6) if gemma3 else 2
    return tuple("sliding" if (layer + 1) % pattern else "full" for layer in range(n_layers))


def config_from_hf(hf: dict) -> ModelConfig:
    gemma3 = hf.get("model_type") == "gemma3_text"
    d_model, n_heads, n_layers = hf["hidden_size"], hf["num_attention_heads"], hf["num_hidden_layers"]
    d_head = hf_get(hf, "head_dim", default=d_model // n_heads)
    types = _layer_types(hf, n_layers, gemma3)
    if gemma3:
        global_rope = rope(hf, "full_attention", default_base=1_000_000.0)
        params = hf.get("rope_parameters") or {}
        nested = "sliding_attention" in params
        local = rope(hf, "sliding_attention") if nested else None
        if local is not None and local.scaling is not None:
            raise ResidError("Gemma 3 config.json scales the sliding layers' rotary; resid supports unscaled ones.")
        local_base = local.base if local is not None else float(hf.get("rope_local_base_freq") or 10_000.0)
    else:
        global_rope, local_base = rope(hf), None
    if global_rope.partial != 1.0:
        raise ResidError("Gemma config.json asks for partial rotary, which Gemma models do not use; refusing.")
    act = hf_get(hf, "hidden_activation", "hidden_act", default="gelu_pytorch_tanh")
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        architecture=hf["model_type"],
        d_model=d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=hf_get(hf, "num_key_value_heads", default=n_heads),
        d_head=d_head,
        d_mlp=hf["intermediate_size"],
        d_vocab=hf["vocab_size"],
        n_ctx=context(hf, global_rope),
        norm="rmsnorm",
        norm_eps=hf_get(hf, "rms_norm_eps", default=1e-6),
        norm_gain_offset=1.0,
        positions="rotary",
        rotary_base=global_rope.base,
        rope_scaling=global_rope.scaling,
        rotary_base_local=local_base,
        attn_qkv_bias=bias,
        attn_out_bias=bias,
        attn_scale=float(hf_get(hf, "query_pre_attn_scalar", default=d_head)) ** -0.5,
        sliding_window=hf.get("sliding_window") if "sliding" in types else None,
        layer_types=types if "sliding" in types else None,
        post_norms=True,
        qk_norm="head" if gemma3 else "none",
        attn_softcap=hf.get("attn_logit_softcapping"),
        final_softcap=hf.get("final_logit_softcapping"),
        act="gelu_new" if act == "gelu" else activation(act),
        gated_mlp=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        embed_scale=d_model**0.5,
    )


def keys(config: ModelConfig) -> list[Key]:
    layer, attn, mlp = "model.layers.{layer}", "model.layers.{layer}.self_attn", "model.layers.{layer}.mlp"
    table = [
        Key("embed.W_E", "model.embed_tokens.weight"),
        Key("blocks.{layer}.ln_attn.w", f"{layer}.input_layernorm.weight"),
        Key("blocks.{layer}.attn.W_Q", f"{attn}.q_proj.weight", "(head d_head) d_model -> head d_model d_head"),
        Key("blocks.{layer}.attn.W_K", f"{attn}.k_proj.weight", "(kv_head d_head) d_model -> kv_head d_model d_head"),
        Key("blocks.{layer}.attn.W_V", f"{attn}.v_proj.weight", "(kv_head d_head) d_model -> kv_head d_model d_head"),
        Key("blocks.{layer}.attn.W_O", f"{attn}.o_proj.weight", "d_model (head d_head) -> head d_head d_model"),
        Key("blocks.{layer}.ln_attn_post.w", f"{layer}.post_attention_layernorm.weight"),
        Key("blocks.{layer}.ln_mlp.w", f"{layer}.pre_feedforward_layernorm.weight"),
        Key("blocks.{layer}.mlp.W_in", f"{mlp}.up_proj.weight", "d_mlp d_model -> d_model d_mlp"),
        Key("blocks.{layer}.mlp.W_gate", f"{mlp}.gate_proj.weight", "d_mlp d_model -> d_model d_mlp"),
        Key("blocks.{layer}.mlp.W_out", f"{mlp}.down_proj.weight", "d_model d_mlp -> d_mlp d_model"),
        Key("blocks.{layer}.ln_mlp_post.w", f"{layer}.post_feedforward_layernorm.weight"),
        Key("ln_final.w", "model.norm.weight"),
    ]
    if config.qk_norm == "head":
        table += llama.QK_NORMS
    if config.attn_qkv_bias:
        table += [
            Key("blocks.{layer}.attn.b_Q", f"{attn}.q_proj.bias", "(head d_head) -> head d_head"),
            Key("blocks.{layer}.attn.b_K", f"{attn}.k_proj.bias", "(kv_head d_head) -> kv_head d_head"),
            Key("blocks.{layer}.attn.b_V", f"{attn}.v_proj.bias", "(kv_head d_head) -> kv_head d_head"),
            Key("blocks.{layer}.attn.b_O", f"{attn}.o_proj.bias"),
        ]
    if not config.tie_embeddings:
        table.append(Key("unembed.W_U", "lm_head.weight", "d_vocab d_model -> d_model d_vocab"))
    return per_layer(table, config.n_layers)


FAMILY = Family(
    model_types=("gemma2", "gemma3_text"),
    config=config_from_hf,
    keys=keys,
    prepend_bos=True,
    fields=FIELDS,
)
