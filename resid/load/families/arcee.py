"""Arcee AFM (Arcee AI 2025, model_type arcee): Llama's attention with a plain (ungated) MLP of squared ReLU,
relu(x W_in)^2 W_out (up_proj, down_proj)."""

from resid.config import ModelConfig
from resid.load.families import Family, llama
from resid.load.weights import Key, per_layer


def config_from_hf(hf: dict) -> ModelConfig:
    return llama.config_from_hf({"hidden_act": "relu2", **hf}, architecture="arcee", gated_mlp=False)


def keys(config: ModelConfig) -> list[Key]:
    gates = ("blocks.{layer}.mlp.W_gate", "blocks.{layer}.mlp.b_gate")
    return per_layer([key for key in llama.table(config) if key.attribute not in gates], config.n_layers)


FAMILY = Family(
    model_types=("arcee",),
    config=config_from_hf,
    keys=keys,
    prepend_bos=True,
    fields=llama.FIELDS,
)
