"""Scalar metrics of a next-token prediction, one per row of logits: a name of METRICS, or a function
f(logits [rows d_vocab], targets [rows], baselines [rows] or None) -> [rows] of the last token's logits."""

from collections.abc import Callable
from typing import Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

from resid.errors import ResidError, param

Metric = Literal["logit_diff", "logit", "target_prob", "loss"]
METRICS = {
    "logit_diff": "logit(target) - logit(baseline)",
    "logit": "logit(target)",
    "target_prob": "softmax probability of the target",
    "loss": "cross-entropy of the target, -log p(target)",
}


def check_metric(metric: object, has_baselines: bool) -> str:
    """The metric's name for tables (a function's __name__); a name must be one of METRICS, and logit_diff
    needs baselines."""
    if callable(metric):
        return getattr(metric, "__name__", "custom")
    if metric not in METRICS:
        raise ResidError(f"{param('metric')} must be one of {tuple(METRICS)} or a function of the logits, got "
                         f"{metric!r}.")
    if metric == "logit_diff" and not has_baselines:
        raise ResidError(f"{param('metric', 'logit_diff')} needs {param('baselines')} (one per prompt); or use "
                         f"{param('metric', 'target_prob')}.")
    return metric


def metric_values(
    metric: str | Callable,
    logits: Float[Tensor, "rows d_vocab"],
    targets: Int[Tensor, "rows"],
    baselines: Int[Tensor, "rows"] | None = None,
) -> Float[Tensor, "rows"]:
    if callable(metric):
        value = metric(logits, targets, baselines)
        if not isinstance(value, Tensor) or tuple(value.shape) != (logits.shape[0],):
            shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise ResidError(
                f"The metric function must return one number per prompt, a tensor of shape [{logits.shape[0]}], "
                f"got {shape}. It is called with (logits [rows d_vocab], targets [rows], baselines [rows] or None)."
            )
        return value.float()
    logits = logits.float()
    rows = torch.arange(logits.shape[0], device=logits.device)
    if metric == "logit_diff":
        return logits[rows, targets] - logits[rows, baselines]
    if metric == "logit":
        return logits[rows, targets]
    log_probs = torch.log_softmax(logits, dim=-1)[rows, targets]
    return log_probs.exp() if metric == "target_prob" else -log_probs
