"""OLMo 1 (Groeneveld et al. 2024, model_type olmo): Llama's block with LayerNorms that have neither gain nor bias
(non-parametric; resid's gains stay 1 and biases 0, nothing is read for them) and epsilon 1e-5.

clip_qkv (clamping q, k and v, OLMo 1.7) is refused: resid does not clamp the projections.
"""

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.load.families import Family, llama
from resid.load.weights import Key, per_layer

NORMS = ("blocks.{layer}.ln_attn.w", "blocks.{layer}.ln_mlp.w", "ln_final.w")


def config_from_hf(hf: dict) -> ModelConfig:
    if hf.get("clip_qkv") is not None:
        raise ResidError(f"config.json has clip_qkv={hf['clip_qkv']!r} (q, k and v clamped to that range, OLMo "
                         "1.7), which resid does not compute. Use an OLMo without it.")
    return llama.config_from_hf(hf, architecture="olmo", norm="layernorm", norm_eps=1e-5)


def keys(config: ModelConfig) -> list[Key]:
    return per_layer([key for key in llama.table(config) if key.attribute not in NORMS], config.n_layers)


FAMILY = Family(
    model_types=("olmo",),
    config=config_from_hf,
    keys=keys,
    prepend_bos=False,
    fields=llama.FIELDS | {"clip_qkv"},
)
