"""OLMo 3 (OLMo et al. 2025): OLMo 2's block (post-norms only, q/k RMSNorm over the whole projection) with
sliding-window attention on the layers config.json's layer_types names (three in four), global on the others.

Its rope_parameters are nested per layer type; both are the same rotary in the released models. Where they differ,
the sliding layers' must be plain (no scaling): resid's local rotary (rotary_base_local) is unscaled.
"""

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.load.families import Family, layer_types, llama, olmo2, rope


def config_from_hf(hf: dict) -> ModelConfig:
    n_layers = hf["num_hidden_layers"]
    types = layer_types(hf, n_layers)
    nested = isinstance((hf.get("rope_parameters") or {}).get("full_attention"), dict)
    full = rope(hf, "full_attention" if nested else None)
    local = rope(hf, "sliding_attention") if nested else full
    if local.scaling is not None and local != full:
        raise ResidError("config.json's sliding layers have a scaled rotary that differs from the global layers'; "
                         "resid computes the sliding layers' rotary unscaled. Use a model whose sliding layers "
                         "rotate with plain ('default') rotary.")
    flat = {**hf, "rope_parameters": {"rope_type": "default", "rope_theta": full.base}}
    if full.scaling is not None:
        flat["rope_parameters"] = hf["rope_parameters"]["full_attention"] if nested else hf["rope_parameters"]
    window = hf.get("sliding_window") if types is not None and "sliding" in types else None
    return llama.config_from_hf(
        {k: v for k, v in flat.items() if k not in ("layer_types", "sliding_window")}, architecture="olmo3",
        pre_norms=False, post_norms=True, qk_norm="all", sliding_window=window,
        layer_types=types if window is not None else None,
        rotary_base_local=None if local.base == full.base else local.base,
    )


FAMILY = Family(
    model_types=("olmo3",),
    config=config_from_hf,
    keys=olmo2.keys,
    prepend_bos=False,
    fields=llama.FIELDS,
)
