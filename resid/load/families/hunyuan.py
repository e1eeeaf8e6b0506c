"""Hunyuan dense (Tencent 2025, model_type hunyuan_v1_dense): Llama's block with a per-head RMSNorm of q and k
(query_layernorm, key_layernorm) applied after the rotary embedding, not before it (qk_norm_after_rotary).
Rotation keeps each head's RMS, so the norm's scale is the same either way; its per-dim gains are not, which is why
the order matters."""

from resid.config import ModelConfig
from resid.load.families import Family, llama
from resid.load.weights import Key, per_layer


def config_from_hf(hf: dict) -> ModelConfig:
    return llama.config_from_hf(hf, architecture="hunyuan_v1_dense", qk_norm="head", qk_norm_after_rotary=True)


def keys(config: ModelConfig) -> list[Key]:
    attn = "model.layers.{layer}.self_attn"
    norms = [Key("blocks.{layer}.attn.q_norm.w", f"{attn}.query_layernorm.weight"),
             Key("blocks.{layer}.attn.k_norm.w", f"{attn}.key_layernorm.weight")]
    return per_layer(llama.table(config) + norms, config.n_layers)


FAMILY = Family(
    model_types=("hunyuan_v1_dense",),
    config=config_from_hf,
    keys=keys,
    prepend_bos=True,
    fields=llama.FIELDS,
)
