"""Where a remote worker gets its model: from what `resid.load` was given on the driver, never from pickled
weights (resid never unpickles weights).

Glossary: the *origin* of a model is the resid model name, local folder, .gguf path or Hub id it was loaded from
(`model.name`; a relative path is made absolute so that a worker in another working directory finds it) plus its
dtype and its identity (resid.identity: a hash of the weights as they are, the dtype and the config). A worker
loads the origin and compares identities, so a model that was edited after loading (folded, ablated in place,
re-drawn), or a file replaced since, is refused instead of being silently replaced by other weights.
"""

from dataclasses import dataclass
from pathlib import Path

import torch

from resid.errors import ResidError
from resid.identities import Identity, identity
from resid.load import load as load_model
from resid.model import Transformer


@dataclass(frozen=True)
class ModelOrigin:
    name: str  # what resid.load takes: a resid model name, an absolute folder or .gguf path, or a Hub id
    dtype: str  # "float32", "bfloat16" or "float16"
    identity: Identity


def origin_of(model: Transformer) -> ModelOrigin:
    """The origin remote workers load `model` from; a clear error for a model built in memory."""
    if not model.weight_files:
        raise ResidError(
            f"The model {model.name!r} was built in memory, so remote workers cannot load it: they load a model from "
            "where it came from, never from pickled weights. Save it (e.g. save_pretrained(folder, "
            "safe_serialization=True) with a tokenizer.json) and load it with resid.load(folder), or use the "
            "in-process executor (executor=None)."
        )
    local = Path(model.name).expanduser()
    name = str(local.resolve()) if local.exists() else model.name
    return ModelOrigin(name, str(model.dtype).removeprefix("torch."), identity(model))


def load(origin: ModelOrigin, device: torch.device) -> Transformer:
    """The model of `origin` on `device`, checked against the driver's identity."""
    model = load_model(origin.name, device=device, dtype=origin.dtype)
    if not identity(model).same_numbers(origin.identity):
        raise ResidError(
            f"The weights a worker loaded from {origin.name} differ from the driver's model: the driver's model was "
            "edited after loading (folded, ablated in place, re-drawn), or the file changed since. Save the edited "
            "model and load it from that path, or use the in-process executor."
        )
    return model
