"""Scalar metrics of a next-token prediction, one per row of logits."""

from typing import Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

Metric = Literal["logit_diff", "logit", "target_prob", "loss"]
METRICS = {
    "logit_diff": "logit(target) - logit(baseline)",
    "logit": "logit(target)",
    "target_prob": "softmax probability of the target",
    "loss": "cross-entropy of the target, -log p(target)",
}


def metric_values(
    metric: str,
    logits: Float[Tensor, "rows d_vocab"],
    targets: Int[Tensor, "rows"],
    baselines: Int[Tensor, "rows"] | None = None,
) -> Float[Tensor, "rows"]:
    logits = logits.float()
    rows = torch.arange(logits.shape[0], device=logits.device)
    if metric == "logit_diff":
        return logits[rows, targets] - logits[rows, baselines]
    if metric == "logit":
        return logits[rows, targets]
    log_probs = torch.log_softmax(logits, dim=-1)[rows, targets]
    return log_probs.exp() if metric == "target_prob" else -log_probs
