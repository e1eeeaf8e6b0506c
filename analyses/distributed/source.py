"""Where a remote worker gets its model: from what `resid.load` was given on the driver, never from pickled
weights (resid never unpickles weights).

Glossary: the *source* of a model is the resid model name, local folder, .gguf path or Hub id it was loaded from
(`model.name`; a relative path is made absolute so that a worker in another working directory finds it) plus its
dtype; its *fingerprint* is, per parameter, the float64 sum and norm of the values. A worker loads the source and
compares fingerprints, so a model that was edited after loading (folded, ablated in place, re-drawn) is refused
instead of being silently replaced by the file's weights.
"""

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from resid.errors import ResidError
from resid.model import Transformer

Fingerprint = tuple[tuple[str, float, float], ...]  # (parameter name, sum, norm), in named_parameters() order
RTOL = 1e-6  # float64 reductions of equal float32 values differ only by summation order (threads, vector width)


@dataclass(frozen=True)
class ModelSource:
    name: str  # what resid.load takes: a resid model name, an absolute folder or .gguf path, or a Hub id
    dtype: str  # "float32", "bfloat16" or "float16"
    fingerprint: Fingerprint


def fingerprint(model: Transformer) -> Fingerprint:
    """Per parameter, the float64 sum and norm of its values (a fraction of a second for SmolLM2-135M)."""
    with torch.no_grad():
        return tuple(
            (name, float(torch.sum(p, dtype=torch.float64)), float(torch.linalg.vector_norm(p, dtype=torch.float64)))
            for name, p in model.named_parameters()
        )


def source_of(model: Transformer) -> ModelSource:
    """The source remote workers load `model` from; a clear error for a model built in memory."""
    if not model.weight_files:
        raise ResidError(
            f"The model {model.name!r} was built in memory, so remote workers cannot load it: they load a model from "
            "where it came from, never from pickled weights. Save it (e.g. save_pretrained(folder, "
            "safe_serialization=True) with a tokenizer.json) and load it with resid.load(folder), or use the "
            "in-process executor (executor=None)."
        )
    local = Path(model.name).expanduser()
    name = str(local.resolve()) if local.exists() else model.name
    return ModelSource(name, str(model.dtype).removeprefix("torch."), fingerprint(model))


def load(source: ModelSource, device: torch.device) -> Transformer:
    """The model of `source` on `device`, checked against the driver's fingerprint."""
    from resid.load import load as load_model

    model = load_model(source.name, device=device, dtype=source.dtype)
    mine = fingerprint(model)
    names = [entry[0] for entry in source.fingerprint]
    if [entry[0] for entry in mine] != names:
        raise ResidError(
            f"A worker loaded {source.name} with different parameters than the driver's model has: the driver's "
            "model was changed after loading. Save it and load it from that path, or use the in-process executor."
        )
    for (name, total, norm), (_, my_total, my_norm) in zip(source.fingerprint, mine):
        # A sum near 0 (weights of both signs) is compared on the scale of the norm, not of itself.
        if not (math.isclose(norm, my_norm, rel_tol=RTOL) and abs(total - my_total) <= RTOL * (abs(total) + norm)):
            raise ResidError(
                f"The weights a worker loaded from {source.name} differ from the driver's model (parameter {name}): "
                "the driver's model was edited after loading (folded, ablated in place, re-drawn). Save the edited "
                "model and load it from that path, or use the in-process executor."
            )
    return model
