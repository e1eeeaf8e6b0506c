"""Nemotron (NVIDIA 2024, Minitron): LayerNorm with biases whose gains are stored as w and applied as 1 + w
("layernorm1p": norm_gain_offset 1), partial rotary, and a plain (ungated) squared-ReLU MLP (up_proj, down_proj).
"""

from resid.config import ModelConfig
from resid.load.families import Family, hf_get, llama
from resid.load.weights import Key, per_layer

GATES = ("blocks.{layer}.mlp.W_gate", "blocks.{layer}.mlp.b_gate")


def config_from_hf(hf: dict) -> ModelConfig:
    return llama.config_from_hf({"hidden_act": "relu2", **hf}, architecture="nemotron", norm="layernorm",
                                norm_eps=hf_get(hf, "norm_eps", default=1e-5), norm_gain_offset=1.0,
                                gated_mlp=False)


def keys(config: ModelConfig) -> list[Key]:
    table = [key for key in llama.table(config) if key.attribute not in GATES]
    norms = [("blocks.{layer}.ln_attn", "model.layers.{layer}.input_layernorm"),
             ("blocks.{layer}.ln_mlp", "model.layers.{layer}.post_attention_layernorm"), ("ln_final", "model.norm")]
    table += [Key(f"{norm}.b", f"{name}.bias") for norm, name in norms]
    return per_layer(table, config.n_layers)


FAMILY = Family(
    model_types=("nemotron",),
    config=config_from_hf,
    keys=keys,
    prepend_bos=True,
    fields=llama.FIELDS | {"norm_eps"},
)
