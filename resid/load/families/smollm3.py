"""SmolLM3 (Hugging Face 2025): Llama's block with no position embedding at all on every fourth layer (NoPE):
config.json's no_rope_layers holds 1 where a layer rotates q and k and 0 where it does not (nope_layers)."""

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.load.families import Family, llama


def config_from_hf(hf: dict) -> ModelConfig:
    n_layers = hf["num_hidden_layers"]
    flags = hf.get("no_rope_layers")
    if flags is None:
        interval = hf.get("no_rope_layer_interval", 4)
        flags = [int((layer + 1) % interval != 0) for layer in range(n_layers)]
    if not isinstance(flags, list) or len(flags) != n_layers or any(f not in (0, 1) for f in flags):
        raise ResidError(f"config.json's no_rope_layers must give 1 (rotary) or 0 (none) for each of its {n_layers} "
                         f"layers, but it is {flags!r}. Fix that field of config.json.")
    return llama.config_from_hf(hf, architecture="smollm3",
                                nope_layers=tuple(layer for layer, rotates in enumerate(flags) if not rotates))


FAMILY = Family(
    model_types=("smollm3",),
    config=config_from_hf,
    keys=llama.keys,
    prepend_bos=False,
    fields=llama.FIELDS | {"no_rope_layers", "no_rope_layer_interval"},
)
