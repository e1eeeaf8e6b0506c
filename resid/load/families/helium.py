"""Helium (Kyutai 2025): Llama's block with interleaved rotary pairs (2i, 2i + 1), regathered into rotate_half's
halves at load (rotary_halves); q/k/v biases with attention_bias, never on the output projection."""

from resid.config import ModelConfig
from resid.load.families import Family, interleaved_rotary, llama
from resid.load.weights import Key, per_layer


def config_from_hf(hf: dict) -> ModelConfig:
    return llama.config_from_hf(hf, architecture="helium", attn_qkv_bias=bool(hf.get("attention_bias", False)),
                                attn_out_bias=False)


def keys(config: ModelConfig) -> list[Key]:
    return per_layer(interleaved_rotary(llama.table(config), config), config.n_layers)


FAMILY = Family(
    model_types=("helium",),
    config=config_from_hf,
    keys=keys,
    prepend_bos=True,
    fields=llama.FIELDS,
)
