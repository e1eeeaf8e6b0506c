"""Argument checks shared by the analyses: layers, neurons and counts, each with an error that says what to pass;
renamed parameters (the old keyword kept for one release, with a DeprecationWarning)."""

import warnings
from collections.abc import Sequence
from typing import TypeVar

from resid.errors import ResidError, param
from resid.model import Transformer

T = TypeVar("T")


def select_layers(model: Transformer, layers: int | Sequence[int] | None) -> list[int]:
    """Layer indices (negative ones counted from the end), checked and sorted; None means every layer."""
    n = model.config.n_layers
    if layers is None:
        return list(range(n))
    chosen = [layers] if isinstance(layers, int) else list(layers)
    if not chosen:
        raise ResidError("No layers given: pass None for every layer, a layer index or a non-empty list.")
    bad = [l for l in chosen if not isinstance(l, int) or isinstance(l, bool) or not -n <= l < n]
    if bad:
        raise ResidError(f"Layers {bad} are out of range: the model has {n} layers (0..{n - 1}, or -{n}..-1).")
    return sorted({l % n for l in chosen})


def has_experts(model: Transformer, layers: Sequence[int]) -> bool:
    """Whether the MLPs of `layers` (checked indices) are mixtures of experts. They must all be of one kind, since a
    neuron table's rows are (layer, neuron) or (layer, expert, neuron): DeepSeek's first layers are dense."""
    kinds = {model.config.has_experts(layer) for layer in layers}
    if len(kinds) > 1:
        dense = [layer for layer in layers if not model.config.has_experts(layer)]
        moe = [layer for layer in layers if model.config.has_experts(layer)]
        raise ResidError(f"Layers {dense} of this model have dense MLPs and layers {moe} mixtures of experts, and "
                         f"one neuron table covers one kind: pass {param('layers')} of one kind ({dense}, then "
                         f"{moe}).")
    return kinds.pop() if kinds else model.config.n_experts > 0


def select_neurons(model: Transformer, neurons: int | Sequence[int] | None,
                   layers: Sequence[int] | None = None) -> list[int] | None:
    """Neuron indices, checked and sorted (None: every neuron) against the MLP width of `layers` (checked
    indices, of one kind; None: d_mlp)."""
    if neurons is None:
        return None
    d_mlp = model.config.mlp_width(layers[0]) if layers else model.config.d_mlp
    chosen = [neurons] if isinstance(neurons, int) else list(neurons)
    if not chosen:
        raise ResidError("No neurons given: pass None for every neuron, a neuron index or a non-empty list.")
    bad = [i for i in chosen if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < d_mlp]
    if bad:
        raise ResidError(f"Neurons {bad} are out of range: the MLP has {d_mlp} neurons (0..{d_mlp - 1}).")
    return sorted(set(chosen))


def select_heads(model: Transformer, heads: int | Sequence[int] | None) -> tuple[int, ...]:
    """Query-head indices of a layer, checked, in the order given (None: every head)."""
    n = model.config.n_heads
    if heads is None:
        return tuple(range(n))
    chosen = [heads] if isinstance(heads, int) else list(heads)
    bad = [h for h in chosen if not isinstance(h, int) or isinstance(h, bool) or not 0 <= h < n]
    if not chosen or bad:
        raise ResidError(f"{param('heads')} must be head indices in 0..{n - 1} (the model has {n} heads per layer), "
                         f"or None for all; got {heads!r}.")
    return tuple(chosen)


def check_k(k: int, name: str = "k", upper: int | None = None) -> int:
    """A positive count, capped at `upper` (e.g. the vocabulary size)."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ResidError(f"{param(name)} must be a positive integer, got {k!r}.")
    return k if upper is None else min(k, upper)


def check_choice(value: object, name: str, choices: Sequence[str]) -> None:
    """`value` is one of `choices` (an option typed as a Literal), or an error listing them."""
    if value not in choices:
        raise ResidError(f"{param(name)} must be one of {tuple(choices)}, got {value!r}.")


def renamed(new: str, value: T, old: str, old_value: object, default: object = None) -> T:
    """The value of a parameter renamed from `old` to `new`, which still takes the old keyword for one release:
    `old_value` (the old keyword's; None when not given) with a DeprecationWarning naming the new keyword, else
    `value`. `default`: the new parameter's default; the new keyword given too is an error."""
    if old_value is None:
        return value
    if value is not default:
        raise ResidError(f"{param(old)} is the old name of {param(new)}: give {param(new)} only.")
    warnings.warn(f"{param(old)} is deprecated and will be removed in the next release: use {param(new)}.",
                  DeprecationWarning, stacklevel=3)
    return old_value  # type: ignore[return-value]
