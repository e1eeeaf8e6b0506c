"""One module per architecture family: how its config.json maps to a ModelConfig and where each of its
checkpoint tensors goes (an explicit key table). Adding a family never touches the forward pass."""

from collections.abc import Callable
from dataclasses import dataclass

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.load.weights import Key


@dataclass(frozen=True)
class Family:
    model_types: tuple[str, ...]  # config.json "model_type" values this family reads
    config: Callable[[dict], ModelConfig]  # config.json -> ModelConfig
    keys: Callable[[ModelConfig], list[Key]]  # the key table, expanded per layer
    prefix: str  # prefix of the backbone's tensors in a *ForCausalLM checkpoint ("model.", "transformer.")
    head_keys: tuple[str, ...] = ()  # tensors outside the backbone (the LM head)
    ignore: tuple[str, ...] = ()  # regexes of checkpoint tensors that are not weights (cached masks, ...)
    prepend_bos: bool = False  # BOS policy when tokenizer_config.json does not say (add_bos_token)


def hf_get(hf: dict, *names: str, default: object = None) -> object:
    """The first of `names` present in a config.json dict (families renamed fields over time)."""
    for name in names:
        if hf.get(name) is not None:
            return hf[name]
    return default


def activation(name: str) -> str:
    table = {
        "silu": "silu",
        "swish": "silu",
        "gelu": "gelu",
        "gelu_new": "gelu_new",
        "gelu_pytorch_tanh": "gelu_new",
        "gelu_fast": "gelu_new",
        "relu": "relu",
    }
    if name not in table:
        raise ResidError(f"Activation {name!r} is not supported; resid supports {sorted(table)}.")
    return table[name]


def rope_base(hf: dict) -> float:
    """rope_theta from a config.json, refusing rope scaling schemes resid does not implement."""
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type != "default":
        raise ResidError(
            f"Rotary scaling {rope_type!r} is not supported yet (only plain rotary embeddings are); "
            "use a model without rope_scaling."
        )
    return float(params.get("rope_theta") or hf.get("rope_theta") or 10000.0)
