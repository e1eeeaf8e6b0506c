"""Which padded positions a run unembeds (`logits_at`) and keeps (`Capture(positions=...)`).

Every public position argument is prompt-relative (0 = a prompt's first real token, -1 its last, whatever the
padding). Indices of the padded batch are taken only through the explicit wrapper `Padded(index)`, for callers
that already hold them; `Tokens.padded_index` and `Tokens.relative` map one kind to the other.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Int
from torch import Tensor

from resid.errors import ResidError
from resid.tokenizer import Tokens


@dataclass(frozen=True)
class Padded:
    """Indices into the pos axis of a padded batch, [batch] or [batch k] (one row per prompt), marked as such:
    `model.run(tokens, logits_at=resid.Padded(index))`. Everywhere else positions are prompt-relative."""

    index: Int[Tensor, "..."]


# None: every position; "last": each prompt's last real token; a list of prompt-relative positions (the same for
# every prompt); a [batch] / [batch k] tensor of prompt-relative positions (one row per prompt); or Padded(index).
LogitsAt = str | Sequence[int] | Tensor | Padded | None


def logit_index(logits_at: LogitsAt, tokens: Tokens) -> Tensor | None:
    """[batch k] padded positions whose logits are computed, or None for all."""
    if logits_at is None:
        return None
    batch, n_pos = tokens.ids.shape
    if isinstance(logits_at, str):
        if logits_at != "last":
            raise ResidError(f"logits_at must be None, 'last', a list of positions, a tensor of positions or "
                             f"resid.Padded(index), got {logits_at!r}.")
        return tokens.last_positions()[:, None]
    if isinstance(logits_at, (list, tuple)):
        return tokens.padded_index(logits_at)
    padded = isinstance(logits_at, Padded)
    index = torch.as_tensor(logits_at.index if padded else logits_at, device=tokens.ids.device).long()
    index = index[:, None] if index.ndim == 1 else index
    if index.ndim != 2 or index.shape[0] != batch:
        raise ResidError(f"logits_at positions must have shape [batch] or [batch k] with batch={batch}.")
    if not padded:
        return tokens.padded_index(index.tolist())
    if index.numel() and (index.min() < -n_pos or index.max() >= n_pos):
        raise ResidError(f"logits_at=Padded(index) must lie in -{n_pos}..{n_pos - 1} (the padded batch's width).")
    return index % n_pos


def position_selector(index: Tensor | None):
    """keep(tensor, axis): the tensor at the padded positions `index` [batch k] along `axis` (all if None)."""
    if index is None:
        return lambda tensor, axis=1: tensor

    def keep(tensor: Tensor, axis: int = 1) -> Tensor:
        shape = [1] * tensor.ndim
        shape[0], shape[axis] = index.shape
        size = list(tensor.shape)
        size[axis] = index.shape[1]
        return tensor.gather(axis, index.view(shape).expand(size))

    return keep
