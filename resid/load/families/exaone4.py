"""EXAONE 4.0 (LG AI Research 2025): OLMo 2's post-norm block (no pre-norms, each write RMS-normed) with q/k
RMSNorm per head, sliding-window attention on the layers layer_types names and, where there is a window, no
position embedding on the global layers (NoPE; hybrid attention)."""

from resid.config import ModelConfig
from resid.load.families import Family, layer_types, llama, olmo2


def config_from_hf(hf: dict) -> ModelConfig:
    n_layers = hf["num_hidden_layers"]
    window = hf.get("sliding_window")
    types = layer_types(hf, n_layers) if window is not None else None
    if types is not None and "sliding" not in types:
        types = None
    nope = tuple(layer for layer, kind in enumerate(types) if kind == "full") if types is not None else ()
    plain = {k: v for k, v in hf.items() if k not in ("layer_types", "sliding_window", "sliding_window_pattern")}
    return llama.config_from_hf(
        plain, architecture="exaone4", pre_norms=False, post_norms=True, qk_norm="head",
        sliding_window=window if types is not None else None, layer_types=types, nope_layers=nope,
    )


FAMILY = Family(
    model_types=("exaone4",),
    config=config_from_hf,
    keys=olmo2.keys,
    prepend_bos=False,
    fields=llama.FIELDS | {"sliding_window_pattern"},
)
