"""Running top-k lists per neuron, mergeable in any order.

Glossary: a *candidate* is a token with its score (the ranked quantity: m, -m or |m|), its coefficient m and its
flat id (window index in scan order * 2^20 + position: unique over the corpus). A TopK keeps, per neuron, the k
best candidates under one total order: higher score first, then the smaller flat id (the token scanned first).
Because the order is total and the ids unique, the top k of a set of tokens is one well-defined list, so
    merge(a, merge(b, c)) == merge(merge(a, b), c) and merge(a, b) == merge(b, a):
shards of a corpus can be scanned by any number of workers and merged as they finish, always with the same
result. Empty slots (fewer than k tokens seen) have score -inf, coefficient 0 and flat id -1.
"""

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

EMPTY_FLAT = -1


@dataclass(frozen=True)
class TopK:
    """Running top-k of one layer: [k neuron] scores (-inf: empty), coefficients and flat token ids."""

    score: Float[Tensor, "k neuron"]
    coefficient: Float[Tensor, "k neuron"]
    flat: Int[Tensor, "k neuron"]

    @classmethod
    def empty(cls, k: int, n: int, device: torch.device) -> "TopK":
        score = torch.full((k, n), -torch.inf, device=device)
        return cls(score, torch.zeros((k, n), device=device), torch.full((k, n), EMPTY_FLAT, device=device))

    def add(self, post: Tensor, valid: Tensor, flat_ids: Tensor, sign: str) -> "TopK":
        """This list with a batch's tokens ranked in (see _batch_best)."""
        return self.merge(_batch_best(self.score.shape[0], post, valid, flat_ids, sign))

    def merge(self, other: "TopK") -> "TopK":
        """The k best of both lists under the total order (associative and commutative)."""
        k = self.score.shape[0]
        score = torch.cat([self.score, other.score.to(self.score.device)])
        coefficient = torch.cat([self.coefficient, other.coefficient.to(self.score.device)])
        flat = torch.cat([self.flat, other.flat.to(self.score.device)])
        return _best(score, coefficient, flat, k)

    def numpy(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(score, coefficient, flat) as numpy arrays: what a remote worker sends back."""
        return tuple(t.cpu().numpy() for t in (self.score, self.coefficient, self.flat))

    @classmethod
    def from_numpy(cls, arrays: tuple[np.ndarray, np.ndarray, np.ndarray]) -> "TopK":
        return cls(*(torch.tensor(a) for a in arrays))  # a copy: arrays from Ray are read-only


def _best(score: Tensor, coefficient: Tensor, flat: Tensor, k: int) -> TopK:
    """The first k candidates per neuron by (score descending, flat id ascending), empty slots made canonical."""
    order = flat.argsort(dim=0, stable=True)  # by id first, then a stable sort by score keeps ids ascending in ties
    score, coefficient, flat = (t.gather(0, order) for t in (score, coefficient, flat))
    order = score.argsort(dim=0, descending=True, stable=True)[:k]
    score, coefficient, flat = (t.gather(0, order) for t in (score, coefficient, flat))
    empty = score == -torch.inf  # masked or never filled: the same whatever produced them
    return TopK(score, coefficient.masked_fill(empty, 0.0), flat.masked_fill(empty, EMPTY_FLAT))


def _batch_best(
    k: int,
    post: Float[Tensor, "batch pos neuron"],
    valid: Bool[Tensor, "batch pos"] | Bool[Tensor, "batch pos neuron"],  # per neuron: experts' routing
    flat_ids: Int[Tensor, "batch pos"],
    sign: str,
) -> TopK:
    """The batch's own top k per neuron under the total order. torch.topk picks arbitrarily among tokens tied
    with the k-th score; where that matters, the earliest tied tokens (smallest flat ids) are taken instead."""
    post = post.reshape(-1, post.shape[-1]).float()  # [tokens neuron]; tokens in flat-id order
    score = post if sign == "positive" else -post if sign == "negative" else post.abs()
    score = score.masked_fill(~valid.reshape(score.shape[0], -1), -torch.inf)
    flat_ids = flat_ids.reshape(-1)
    top = score.topk(min(k, score.shape[0]), dim=0)
    threshold = top.values[-1]  # [neuron]: the k-th best score
    above = (top.values > threshold).sum(0)
    ties = score == threshold
    needed = top.values.shape[0] - above  # how many tied tokens the list takes
    # Exact as is unless more tokens tie than the list takes (and they are real tokens, not -inf filler).
    if bool(((ties.sum(0) > needed) & (threshold > -torch.inf)).any()):
        chosen = (score > threshold) | (ties & (ties.cumsum(0) <= needed))
        top = score.masked_fill(~chosen, -torch.inf).topk(top.values.shape[0], dim=0)
    indices = top.indices
    return _best(score.gather(0, indices), post.gather(0, indices), flat_ids[indices], k)
