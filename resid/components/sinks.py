"""Attention sinks (gpt-oss; Xiao et al. 2024, "Efficient Streaming Language Models with Attention Sinks"): each
head has one learned logit s_h that joins every query's softmax as a key no value belongs to, so the pattern over
the real keys sums to less than 1 (what the sink took is simply not written):

    pattern[h, q, k] = exp(scores[h, q, k]) / (sum_k' exp(scores[h, q, k']) + exp(s_h))

The pattern is still the weights of the values, so with it frozen attention stays affine in what it reads and
per-head attribution stays exact; the sink itself writes nothing.
"""

import torch
from jaxtyping import Float
from torch import Tensor


def softmax_with_sinks(
    scores: Float[Tensor, "batch head pos key_pos"], sinks: Float[Tensor, "head"], dtype: torch.dtype
) -> Float[Tensor, "batch head pos key_pos"]:
    """The pattern of `scores` with one sink logit per head, in float32 (as transformers' eager gpt-oss), cast to
    `dtype`; the sink's own column dropped."""
    scores = scores.float()
    sink = sinks.float().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1].to(dtype)
