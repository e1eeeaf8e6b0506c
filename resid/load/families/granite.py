"""Granite 3 (IBM 2024): Llama's block with four constant multipliers, folded where they act:

    embedding_multiplier   the token embedding is multiplied by it (embed_scale)
    attention_multiplier   the attention scale, instead of 1/sqrt(d_head) (attn_scale)
    residual_multiplier    every sublayer's write is multiplied by it before it is added: folded into W_O, b_O,
                           W_out and b_out, so each head's and neuron's write is already the scaled one
    logits_scaling         the logits are divided by it: folded into the final norm's gain (final_norm_multiplier)
"""

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.load.families import Family, llama, scaled
from resid.load.weights import Key, per_layer

WRITES = ("attn.W_O", "attn.b_O", "mlp.W_out", "mlp.b_out")


def config_from_hf(hf: dict) -> ModelConfig:
    return llama.config_from_hf(
        hf, architecture="granite", embed_scale=float(hf.get("embedding_multiplier", 1.0)),
        attn_scale=float(hf.get("attention_multiplier", 1.0)),
        final_norm_multiplier=1.0 / float(hf.get("logits_scaling", 1.0)),
    )


def keys(config: ModelConfig, hf: dict) -> list[Key]:
    multiplier = float(hf.get("residual_multiplier", 1.0))
    return per_layer(scaled(llama.table(config), WRITES, multiplier), config.n_layers)


def without_multiplier(config: ModelConfig) -> list[Key]:
    raise ResidError("Granite's key table needs its config.json (residual_multiplier scales the writes); load the "
                     "model from its Hugging Face folder.")


FAMILY = Family(
    model_types=("granite",),
    config=config_from_hf,
    keys=without_multiplier,
    hf_keys=keys,
    prepend_bos=False,
    fields=llama.FIELDS | {"embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling"},
)
