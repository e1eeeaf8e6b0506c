"""Synthetic activations from a planted dictionary: x = codes @ D, with `per_token` features active per token at
random magnitudes, and how well a trained decoder recovers D's rows."""

import torch


def planted(n_features: int = 48, d: int = 24, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(n_features, d, generator=g)
    return D / D.norm(dim=1, keepdim=True)


def batches(D: torch.Tensor, n: int, size: int, per_token: int = 3, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        scores = torch.rand(size, len(D), generator=g)
        index = scores.topk(per_token, dim=1).indices
        codes = torch.zeros(size, len(D)).scatter(1, index, 0.5 + torch.rand(size, per_token, generator=g))
        yield codes @ D


def recovered(D: torch.Tensor, W_dec: torch.Tensor) -> torch.Tensor:
    """For each planted row, the largest cosine with a learned decoder row."""
    learned = W_dec / W_dec.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return (D @ learned.T).max(dim=1).values
