"""Phi-3 (Abdin et al. 2024): Llama's architecture with fused projections and, in some sizes, partial rotary.

Traps: `qkv_proj` stacks the q, k and v rows ([n_heads + 2 n_kv_heads] * d_head of them; unequal parts under
grouped-query attention, so they are cut by row ranges), and `gate_up_proj` stacks the gate rows first, then
the up rows (Hugging Face chunks its output in two: gate, up). A sliding_window, when set, applies to every
layer. longrope scaling (the 128k models) is not supported and is refused by name.
"""

from resid.config import ModelConfig
from resid.load.families import Family, llama
from resid.load.weights import Key, per_layer

FIELDS = llama.FIELDS | {"embd_pdrop", "resid_pdrop"}


def config_from_hf(hf: dict) -> ModelConfig:
    # llama's reading with Mistral's window rule (every layer) and no biases
    return llama.config_from_hf({**hf, "model_type": "mistral", "attention_bias": False}, architecture="phi3")


def keys(config: ModelConfig) -> list[Key]:
    attn, mlp = "model.layers.{layer}.self_attn", "model.layers.{layer}.mlp"
    d_q, d_kv, d_mlp = config.n_heads * config.d_head, config.n_kv_heads * config.d_head, config.d_mlp
    d_qkv = d_q + 2 * d_kv
    table = [
        Key("embed.W_E", "model.embed_tokens.weight"),
        Key("blocks.{layer}.ln_attn.w", "model.layers.{layer}.input_layernorm.weight"),
        Key("blocks.{layer}.attn.W_Q", f"{attn}.qkv_proj.weight", "(head d_head) d_model -> head d_model d_head",
            rows=(0, d_q, d_qkv)),
        Key("blocks.{layer}.attn.W_K", f"{attn}.qkv_proj.weight", "(kv_head d_head) d_model -> kv_head d_model d_head",
            rows=(d_q, d_q + d_kv, d_qkv)),
        Key("blocks.{layer}.attn.W_V", f"{attn}.qkv_proj.weight", "(kv_head d_head) d_model -> kv_head d_model d_head",
            rows=(d_q + d_kv, d_qkv, d_qkv)),
        Key("blocks.{layer}.attn.W_O", f"{attn}.o_proj.weight", "d_model (head d_head) -> head d_head d_model"),
        Key("blocks.{layer}.ln_mlp.w", "model.layers.{layer}.post_attention_layernorm.weight"),
        Key("blocks.{layer}.mlp.W_gate", f"{mlp}.gate_up_proj.weight", "d_mlp d_model -> d_model d_mlp",
            rows=(0, d_mlp, 2 * d_mlp)),
        Key("blocks.{layer}.mlp.W_in", f"{mlp}.gate_up_proj.weight", "d_mlp d_model -> d_model d_mlp",
            rows=(d_mlp, 2 * d_mlp, 2 * d_mlp)),
        Key("blocks.{layer}.mlp.W_out", f"{mlp}.down_proj.weight", "d_model d_mlp -> d_mlp d_model"),
        Key("ln_final.w", "model.norm.weight"),
    ]
    if not config.tie_embeddings:
        table.append(Key("unembed.W_U", "lm_head.weight", "d_vocab d_model -> d_model d_vocab"))
    return per_layer(table, config.n_layers)


FAMILY = Family(
    model_types=("phi3",),
    config=config_from_hf,
    keys=keys,
    prepend_bos=False,
    fields=FIELDS,
)
