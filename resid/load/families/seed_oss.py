"""Seed-OSS (ByteDance Seed 2025): Llama's block with q/k/v biases (attention_bias) and a separate switch for the
output projection's bias (attention_out_bias); head_dim its own field."""

from resid.config import ModelConfig
from resid.load.families import Family, llama


def config_from_hf(hf: dict) -> ModelConfig:
    return llama.config_from_hf(hf, architecture="seed_oss", attn_qkv_bias=bool(hf.get("attention_bias", False)),
                                attn_out_bias=bool(hf.get("attention_out_bias", False)))


FAMILY = Family(
    model_types=("seed_oss",),
    config=config_from_hf,
    keys=llama.keys,
    prepend_bos=False,
    fields=llama.FIELDS | {"attention_out_bias", "residual_dropout"},
)
