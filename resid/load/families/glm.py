"""GLM-4 0414 and earlier (Zhipu 2024-25, model_types glm and glm4): Llama's block with q/k/v biases
(attention_bias, never on the output projection), partial rotary (partial_rotary_factor 0.5) with interleaved pairs
(2i, 2i + 1) regathered into rotate_half's halves at load (rotary_halves), and Phi-3's fused gate_up_proj (the gate
rows first). glm4 adds sandwich norms: each sublayer's output is RMS-normed before it is written
(post_self_attn_layernorm, post_mlp_layernorm), as in Gemma 2.
"""

from resid.config import ModelConfig
from resid.load.families import Family, interleaved_rotary, llama
from resid.load.weights import Key, per_layer

GATE_UP = ("blocks.{layer}.mlp.W_in", "blocks.{layer}.mlp.W_gate")


def config_from_hf(hf: dict) -> ModelConfig:
    return llama.config_from_hf(hf, architecture=hf["model_type"], attn_qkv_bias=bool(hf.get("attention_bias", True)),
                                attn_out_bias=False, post_norms=hf["model_type"] == "glm4")


def keys(config: ModelConfig) -> list[Key]:
    layer = "model.layers.{layer}"
    d_mlp = config.d_mlp
    table = [key for key in llama.table(config) if key.attribute not in GATE_UP]
    table += [
        Key("blocks.{layer}.mlp.W_gate", f"{layer}.mlp.gate_up_proj.weight", "d_mlp d_model -> d_model d_mlp",
            rows=(0, d_mlp, 2 * d_mlp)),
        Key("blocks.{layer}.mlp.W_in", f"{layer}.mlp.gate_up_proj.weight", "d_mlp d_model -> d_model d_mlp",
            rows=(d_mlp, 2 * d_mlp, 2 * d_mlp)),
    ]
    if config.post_norms:
        table += [
            Key("blocks.{layer}.ln_attn_post.w", f"{layer}.post_self_attn_layernorm.weight"),
            Key("blocks.{layer}.ln_mlp_post.w", f"{layer}.post_mlp_layernorm.weight"),
        ]
    return per_layer(interleaved_rotary(table, config), config.n_layers)


FAMILY = Family(
    model_types=("glm", "glm4"),
    config=config_from_hf,
    keys=keys,
    prepend_bos=False,
    fields=llama.FIELDS,
)
