"""Ministral (Mistral AI 2024, model_type ministral): Mistral's block with sliding-window attention on the layers
config.json's layer_types names (all of them by default) and global attention on the others."""

from resid.config import ModelConfig
from resid.load.families import Family, layer_types, llama


def config_from_hf(hf: dict) -> ModelConfig:
    window = hf.get("sliding_window")
    types = layer_types(hf, hf["num_hidden_layers"]) if window is not None else None
    if types is not None and "sliding" not in types:
        window = types = None
    plain = {k: v for k, v in hf.items() if k not in ("layer_types", "sliding_window")}
    return llama.config_from_hf(plain, architecture="ministral", sliding_window=window, layer_types=types)


FAMILY = Family(
    model_types=("ministral",),
    config=config_from_hf,
    keys=llama.keys,
    prepend_bos=True,
    fields=llama.FIELDS,
)
