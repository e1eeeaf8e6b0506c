"""ERNIE 4.5 dense (Baidu 2025): Llama's block with interleaved rotary pairs (2i, 2i + 1), regathered into
rotate_half's halves at load (rotary_halves), and biases on every projection or none (use_bias)."""

from resid.config import ModelConfig
from resid.load.families import Family, interleaved_rotary, llama
from resid.load.weights import Key, per_layer


def config_from_hf(hf: dict) -> ModelConfig:
    bias = bool(hf.get("use_bias", False))
    return llama.config_from_hf(hf, architecture="ernie4_5", attn_qkv_bias=bias, attn_out_bias=bias, mlp_bias=bias,
                                tie_embeddings=bool(hf.get("tie_word_embeddings", True)))


def keys(config: ModelConfig) -> list[Key]:
    return per_layer(interleaved_rotary(llama.table(config), config), config.n_layers)


FAMILY = Family(
    model_types=("ernie4_5",),
    config=config_from_hf,
    keys=keys,
    prepend_bos=False,
    fields=llama.FIELDS | {"use_bias"},
)
