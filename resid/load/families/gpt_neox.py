"""GPT-NeoX and Pythia (Black et al. 2022, Biderman et al. 2023): pre-norm LayerNorm, partial rotary,
parallel (or sequential) blocks, a plain gelu MLP with biases, an untied `embed_out` head.

Traps:
- The fused `query_key_value` rows are laid out (head three d_head): each head's q, k and v rows sit
  together (Hugging Face views the output as [..., head, 3 * d_head] and chunks the last axis), unlike
  GPT-2's c_attn, whose Q, K and V blocks sit side by side.
- Only the first rotary_pct (partial_rotary_factor) of each head's dims rotate: int(d_head * pct).
- config.json names changed across versions: rotary_pct / rotary_emb_base (Pythia) became
  rope_parameters.partial_rotary_factor / rope_parameters.rope_theta (transformers 5).
- transformers 5 calls the head `lm_head` in memory but reads and writes it as `embed_out.weight`.
"""

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.load.families import ROPE_CONFIG_FIELDS, Family, activation, hf_get, rope_base
from resid.load.weights import Key, per_layer


def config_from_hf(hf: dict) -> ModelConfig:
    d_model, n_heads = hf["hidden_size"], hf["num_attention_heads"]
    d_head = d_model // n_heads
    params = hf.get("rope_parameters") or {}
    # Hugging Face's default when neither name is present is 0.25.
    rotary_pct = float(hf_get(params, "partial_rotary_factor", default=hf_get(hf, "rotary_pct", default=0.25)))
    rotary_dim = int(d_head * rotary_pct)
    if rotary_dim == 0 or rotary_dim % 2:
        raise ResidError(
            f"GPT-NeoX config.json gives {rotary_dim} rotary dims per head (d_head={d_head} x rotary_pct="
            f"{rotary_pct}); resid needs an even, positive number of rotating dims."
        )
    # rope_base refuses rope scaling; an old config's rotary_emb_base stands in for rope_theta.
    base = rope_base(dict(hf, rope_theta=hf_get(hf, "rope_theta", "rotary_emb_base", default=10000.0)))
    bias = bool(hf.get("attention_bias", True))
    return ModelConfig(
        architecture="gpt_neox",
        d_model=d_model,
        n_layers=hf["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=n_heads,
        d_head=d_head,
        d_mlp=hf["intermediate_size"],
        d_vocab=hf["vocab_size"],
        n_ctx=hf["max_position_embeddings"],
        norm="layernorm",
        norm_eps=hf_get(hf, "layer_norm_eps", default=1e-5),
        block="parallel" if hf.get("use_parallel_residual", True) else "sequential",
        positions="rotary",
        rotary_dim=rotary_dim,
        rotary_base=base,
        attn_qkv_bias=bias,
        attn_out_bias=bias,
        act=activation(hf_get(hf, "hidden_act", default="gelu")),
        gated_mlp=False,
        mlp_bias=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )


def keys(config: ModelConfig) -> list[Key]:
    layer, attn, mlp = "gpt_neox.layers.{layer}", "gpt_neox.layers.{layer}.attention", "gpt_neox.layers.{layer}.mlp"
    qkv = "(head three d_head) d_model -> three head d_model d_head"
    table = [
        Key("embed.W_E", "gpt_neox.embed_in.weight"),
        Key("blocks.{layer}.ln_attn.w", f"{layer}.input_layernorm.weight"),
        Key("blocks.{layer}.ln_attn.b", f"{layer}.input_layernorm.bias"),
        Key("blocks.{layer}.attn.W_Q", f"{attn}.query_key_value.weight", qkv, pick=0),
        Key("blocks.{layer}.attn.W_K", f"{attn}.query_key_value.weight", qkv, pick=1),
        Key("blocks.{layer}.attn.W_V", f"{attn}.query_key_value.weight", qkv, pick=2),
        Key("blocks.{layer}.attn.W_O", f"{attn}.dense.weight", "d_model (head d_head) -> head d_head d_model"),
        Key("blocks.{layer}.ln_mlp.w", f"{layer}.post_attention_layernorm.weight"),
        Key("blocks.{layer}.ln_mlp.b", f"{layer}.post_attention_layernorm.bias"),
        Key("blocks.{layer}.mlp.W_in", f"{mlp}.dense_h_to_4h.weight", "d_mlp d_model -> d_model d_mlp"),
        Key("blocks.{layer}.mlp.b_in", f"{mlp}.dense_h_to_4h.bias"),
        Key("blocks.{layer}.mlp.W_out", f"{mlp}.dense_4h_to_h.weight", "d_model d_mlp -> d_mlp d_model"),
        Key("blocks.{layer}.mlp.b_out", f"{mlp}.dense_4h_to_h.bias"),
        Key("ln_final.w", "gpt_neox.final_layer_norm.weight"),
        Key("ln_final.b", "gpt_neox.final_layer_norm.bias"),
    ]
    if config.attn_qkv_bias:
        bias = "(head three d_head) -> three head d_head"
        table += [
            Key("blocks.{layer}.attn.b_Q", f"{attn}.query_key_value.bias", bias, pick=0),
            Key("blocks.{layer}.attn.b_K", f"{attn}.query_key_value.bias", bias, pick=1),
            Key("blocks.{layer}.attn.b_V", f"{attn}.query_key_value.bias", bias, pick=2),
            Key("blocks.{layer}.attn.b_O", f"{attn}.dense.bias"),
        ]
    if not config.tie_embeddings:
        table.append(Key("unembed.W_U", "embed_out.weight", "d_vocab d_model -> d_model d_vocab"))
    return per_layer(table, config.n_layers)


FAMILY = Family(
    model_types=("gpt_neox",),
    config=config_from_hf,
    keys=keys,
    prefix="gpt_neox.",
    head_keys=("embed_out.weight",),
    # Old checkpoints carry the causal mask and rotary frequencies as buffers.
    ignore=(
        r"gpt_neox\.layers\.\d+\.attention\.(bias|masked_bias)",
        r"gpt_neox\.layers\.\d+\.attention\.rotary_emb\.inv_freq",
    ),
    prepend_bos=False,
    fields=ROPE_CONFIG_FIELDS | {
        "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
        "layer_norm_eps", "hidden_act", "use_parallel_residual", "attention_bias", "tie_word_embeddings",
        "rotary_pct", "rotary_emb_base",
    },
)
