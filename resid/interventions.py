"""Typed interventions on the residual-stream writes, applied inside `model.run` and nowhere else.

A `Site` names what is edited: a sublayer's write (`part="attn"|"mlp"`), one head's `z` (the head's
attention-weighted value mix, before W_O, so its write is `z[h] @ W_O[h]`), or one neuron's coefficient
`post[i]` (Geva et al.'s memory coefficient, so its write is `post[i] * W_out[i]`); optionally only at
some positions (indices into the padded sequence; negative counts from the end).

Nothing is attached to the model: `run` hands each sublayer the edits for it, so an intervention cannot
outlive the call that asked for it.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from resid.config import ModelConfig
from resid.errors import ResidError


@dataclass(frozen=True)
class Site:
    layer: int  # negative counts from the last layer
    part: str  # "attn" or "mlp" (checked here, so a typo is a ResidError, not a type-checker traceback)
    head: int | None = None  # attn only: edit this head's z instead of the whole write
    neuron: int | None = None  # mlp only: edit this neuron's coefficient post[i]
    positions: Sequence[int] | None = None  # None = every position; stored as a tuple

    def __post_init__(self) -> None:
        if self.part not in ("attn", "mlp"):
            raise ResidError(f"Site part must be 'attn' or 'mlp', got {self.part!r}.")
        if self.head is not None and self.part != "attn":
            raise ResidError(f"Site(layer={self.layer}, part='mlp') cannot take a head; heads are part='attn'.")
        if self.neuron is not None and self.part != "mlp":
            raise ResidError(f"Site(layer={self.layer}, part='attn') cannot take a neuron; neurons are part='mlp'.")
        if self.positions is not None:
            object.__setattr__(self, "positions", tuple(int(p) for p in self.positions))

    @property
    def unit(self) -> Literal["head", "neuron", None]:
        """What the site edits: one head's z, one neuron's coefficient, or (None) the whole write."""
        return "head" if self.head is not None else "neuron" if self.neuron is not None else None

    def describe(self) -> str:
        where = f"layers[{self.layer}].{self.part}"
        if self.head is not None:
            where += f" head {self.head}"
        if self.neuron is not None:
            where += f" neuron {self.neuron}"
        if self.positions is not None:
            where += f" positions {list(self.positions)}"
        return where

    def validate(self, config: ModelConfig) -> None:
        n = config.n_layers
        if not -n <= self.layer < n:
            raise ResidError(
                f"Site layer {self.layer} is out of range: the model has {n} layers (0..{n - 1}, or -{n}..-1)."
            )
        if self.head is not None and not 0 <= self.head < config.n_heads:
            raise ResidError(f"Site head {self.head} is out of range: the model has {config.n_heads} heads.")
        if self.neuron is not None and not 0 <= self.neuron < config.d_mlp:
            raise ResidError(f"Site neuron {self.neuron} is out of range: the MLP has {config.d_mlp} neurons.")


@dataclass(frozen=True)
class ZeroAblate:
    site: Site

    def edit(self, target: Tensor) -> Tensor:
        return torch.zeros_like(target)


@dataclass(frozen=True)
class Replace:
    site: Site
    value: Tensor  # broadcastable to the edited slice, e.g. [batch pos d_model] for a sublayer write

    def edit(self, target: Tensor) -> Tensor:
        _check_broadcast(self, self.value, target)
        return self.value.to(target.device, target.dtype).expand_as(target)


@dataclass(frozen=True)
class Scale:
    site: Site
    factor: float | Tensor  # a number, or a tensor broadcastable to the edited slice

    def edit(self, target: Tensor) -> Tensor:
        if isinstance(self.factor, Tensor):
            _check_broadcast(self, self.factor, target)
            return target * self.factor.to(target.device, target.dtype)
        return target * self.factor


@dataclass(frozen=True)
class Add:
    site: Site
    vector: Tensor  # broadcastable to the edited slice: [d_model] for a write, [d_head] for a head

    def edit(self, target: Tensor) -> Tensor:
        _check_broadcast(self, self.vector, target)
        return target + self.vector.to(target.device, target.dtype)


Intervention = ZeroAblate | Replace | Scale | Add


def _check_broadcast(iv: Intervention, value: Tensor, target: Tensor) -> None:
    try:
        ok = torch.broadcast_shapes(value.shape, target.shape) == target.shape
    except RuntimeError:
        ok = False
    if not ok:
        raise ResidError(
            f"{type(iv).__name__} at {iv.site.describe()} got a tensor of shape {tuple(value.shape)}, which does "
            f"not broadcast to the edited slice of shape {tuple(target.shape)} (batch, pos, ...). Pass a tensor of "
            "that shape, or one that broadcasts to it."
        )


def plan(interventions: Sequence[Intervention], config: ModelConfig) -> dict[tuple[int, str], list[Intervention]]:
    """Validate every intervention and group them by (layer, part), layers made non-negative."""
    grouped: dict[tuple[int, str], list[Intervention]] = {}
    for iv in interventions:
        if not isinstance(iv, (ZeroAblate, Replace, Scale, Add)):
            raise ResidError(
                f"Unknown intervention {iv!r}: use resid.ZeroAblate, resid.Replace, resid.Scale or resid.Add."
            )
        iv.site.validate(config)
        grouped.setdefault((iv.site.layer % config.n_layers, iv.site.part), []).append(iv)
    return grouped


def apply_edits(tensor: Tensor, edits: Sequence[Intervention], unit: Literal["head", "neuron", None]) -> Tensor:
    """Apply the edits whose site unit matches (head / neuron / whole write) to `tensor` [batch pos ...]."""
    for iv in edits:
        if iv.site.unit != unit:
            continue
        index = iv.site.head if unit == "head" else iv.site.neuron
        region = _region(iv.site.positions, tensor.shape[1], index, tensor.device)
        tensor = tensor.clone()
        tensor[region] = iv.edit(tensor[region])
    return tensor


def _region(positions: tuple[int, ...] | None, n_pos: int, index: int | None, device: torch.device) -> tuple:
    if positions is None:
        pos: slice | Tensor = slice(None)
    else:
        bad = [p for p in positions if not -n_pos <= p < n_pos]
        if bad:
            raise ResidError(
                f"Intervention positions {bad} are out of range for a sequence of {n_pos} positions "
                f"(use 0..{n_pos - 1}, or negative indices from the end)."
            )
        pos = torch.tensor(positions, device=device) % n_pos
    return (slice(None), pos) if index is None else (slice(None), pos, index)
