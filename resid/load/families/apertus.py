"""Apertus (Swiss AI 2025): Llama's attention with a per-head q/k RMSNorm, llama3 rope scaling, and a plain
(ungated) MLP whose activation is xIELU, with two learned scalars per layer (resid.components.xielu); its pre-norms
are named attention_layernorm and feedforward_layernorm."""

from resid.config import ModelConfig
from resid.load.families import Family, llama
from resid.load.weights import Key, per_layer

RENAMED = {"blocks.{layer}.ln_attn.w": "model.layers.{layer}.attention_layernorm.weight",
           "blocks.{layer}.ln_mlp.w": "model.layers.{layer}.feedforward_layernorm.weight"}
GATES = ("blocks.{layer}.mlp.W_gate", "blocks.{layer}.mlp.b_gate")


def config_from_hf(hf: dict) -> ModelConfig:
    return llama.config_from_hf({"hidden_act": "xielu", **hf}, architecture="apertus", qk_norm="head",
                                gated_mlp=False)


def keys(config: ModelConfig) -> list[Key]:
    table = [Key(key.attribute, RENAMED.get(key.attribute, key.checkpoint), key.pattern)
             for key in llama.table(config) if key.attribute not in GATES]
    act = "model.layers.{layer}.mlp.act_fn"
    if config.act == "xielu":
        table += [Key(f"blocks.{{layer}}.mlp.act.{name}", f"{act}.{name}") for name in ("alpha_p", "alpha_n", "beta",
                                                                                       "eps")]
    return per_layer(table + llama.QK_NORMS, config.n_layers)


FAMILY = Family(
    model_types=("apertus",),
    config=config_from_hf,
    keys=keys,
    prepend_bos=True,
    fields=llama.FIELDS,
)
