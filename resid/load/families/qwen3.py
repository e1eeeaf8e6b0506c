"""Qwen3: Llama's layout with an RMSNorm over each head's queries and keys before rotary (q_norm, k_norm), no
q/k/v biases (attention_bias), head_dim its own field, windows as Qwen2 (use_sliding_window)."""

from resid.config import ModelConfig
from resid.load.families import Family, llama
from resid.load.weights import Key, per_layer


def config_from_hf(hf: dict) -> ModelConfig:
    return llama.config_from_hf(hf, architecture="qwen3", qk_norm="head")


def keys(config: ModelConfig) -> list[Key]:
    return per_layer(llama.table(config) + llama.QK_NORMS, config.n_layers)


FAMILY = Family(
    model_types=("qwen3",),
    config=config_from_hf,
    keys=keys,
    prepend_bos=False,
    fields=llama.FIELDS,
)
