"""A model's first layers as a model of its own: the embeddings, layers 0..n-1, the final norm and the head, as
transformers builds a checkpoint loaded with num_hidden_layers=n (the layers past n left out, nothing else changed).

    small = resid.first_layers(model, 3)   # small.run(...).logits: the final norm and head read layer 2's output

Not `run(stop_at_layer=n)`, which stops before the final norm and has no logits: the truncated model is a whole
model (logits, lenses, fits) whose last layer is layer n-1. Its weights are the model's own tensors (no copy: an
edit of one is an edit of the other); its config is the model's with the per-layer fields cut to n layers.
"""

import dataclasses

import torch

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.model import Transformer


def first_layers(model: Transformer, n: int) -> Transformer:
    """`model` with only its first `n` layers (1..n_layers): a new Transformer sharing the model's weights."""
    total = model.config.n_layers
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= total:
        raise ResidError(f"first_layers keeps 1..{total} layers of {model.name}, got {n!r}.")
    config = truncated_config(model.config, n)
    with torch.device("meta"):  # no memory: every parameter is assigned the model's own tensor below
        small = Transformer(config, model.tokenizer, name=f"{model.name}[:{n} layers]", weight_files=model.weight_files)
    kept = {key: value for key, value in model.state_dict(keep_vars=True).items()
            if not key.startswith("blocks.") or int(key.split(".")[1]) < n}
    small.load_state_dict(kept, strict=True, assign=True)
    return small.to(device=model.device, dtype=model.dtype).train(model.training)


def truncated_config(config: ModelConfig, n: int) -> ModelConfig:
    """The config of a model's first n layers: n_layers and the fields given per layer, cut to n."""
    return dataclasses.replace(
        config,
        n_layers=n,
        layer_types=None if config.layer_types is None else config.layer_types[:n],
        nope_layers=tuple(layer for layer in config.nope_layers if layer < n),
        n_dense_layers=min(config.n_dense_layers, n),
    )
