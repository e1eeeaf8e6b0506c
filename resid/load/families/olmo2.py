"""OLMo 2 (OLMo et al. 2024): Llama's tensors with the norms moved after the sublayers. Its sublayers read
the residual itself (no pre-norms) and each output is RMS-normed before it is written:

    resid_mid = resid_pre + post_attention_layernorm(attn(resid_pre))
    resid_post = resid_mid + post_feedforward_layernorm(mlp(resid_mid))

Trap: its q_norm and k_norm normalize the whole query (and key) projection, all heads together
([n_heads * d_head] gains), not each head as Qwen3's and Gemma 3's do.
"""

from resid.config import ModelConfig
from resid.load.families import Family, llama
from resid.load.weights import Key, per_layer


def config_from_hf(hf: dict) -> ModelConfig:
    return llama.config_from_hf(hf, architecture="olmo2", pre_norms=False, post_norms=True, qk_norm="all")


def keys(config: ModelConfig) -> list[Key]:
    layer = "model.layers.{layer}"
    pre_norms = ("blocks.{layer}.ln_attn.w", "blocks.{layer}.ln_mlp.w")
    table = [key for key in llama.table(config) if key.attribute not in pre_norms] + llama.QK_NORMS
    table += [
        Key("blocks.{layer}.ln_attn_post.w", f"{layer}.post_attention_layernorm.weight"),
        Key("blocks.{layer}.ln_mlp_post.w", f"{layer}.post_feedforward_layernorm.weight"),
    ]
    return per_layer(table, config.n_layers)


FAMILY = Family(
    model_types=("olmo2",),
    config=config_from_hf,
    keys=keys,
    prepend_bos=False,
    fields=llama.FIELDS,
)
