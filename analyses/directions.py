"""Logit directions through the final norm, with its scale frozen from the forward pass.

With s = final_norm_scale (1/rms or 1/sigma of the final residual x at that position) held fixed, the final
norm is affine in x, so for a target token t (minus a baseline b):

    RMSNorm:    logit = x . u' + c,   u' = s * (g * u)
    LayerNorm:  logit = x . u' + c,   u' = s * (g * u - mean(g * u))    (centering folded into the direction)

with u = W_U[:, t] - W_U[:, b], g the norm gain, and the constant c = ln_final.b . u + b_U[t] - b_U[b] (the
bias term). Every write into the residual stream then contributes `write . u'`, and the contributions plus
c sum exactly to the logit (difference). Computed in float32 whatever the model dtype.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from resid.model import Transformer


@dataclass(frozen=True)
class LogitDirection:
    direction: Float[Tensor, "batch d_model"]  # u' (float32): the logit (difference) is resid . u' + bias
    bias: Float[Tensor, "batch"]  # c: the final norm's bias and the unembedding bias, projected


@torch.no_grad()
def unembed_direction(
    model: Transformer, targets: Sequence[int], baselines: Sequence[int] | None = None
) -> tuple[Float[Tensor, "batch d_model"], Float[Tensor, "batch"]]:
    """u = W_U[:, t] - W_U[:, b] and b_U[t] - b_U[b] (zero without an unembedding bias), in float32."""
    weight = model.unembed.weight.float()  # [d_vocab d_model]
    t = torch.as_tensor(list(targets), device=model.device)
    u = weight[t]
    b_u = model.unembed.b_U
    bias = b_u.float()[t] if b_u is not None else torch.zeros(len(t), device=model.device)
    if baselines is not None:
        b = torch.as_tensor(list(baselines), device=model.device)
        u = u - weight[b]
        if b_u is not None:
            bias = bias - b_u.float()[b]
    return u, bias


@torch.no_grad()
def logit_direction(
    model: Transformer,
    targets: Sequence[int],
    final_norm_scale: Float[Tensor, "batch 1"],
    baselines: Sequence[int] | None = None,
) -> LogitDirection:
    """u' and c such that logit(target) - logit(baseline) == final_resid . u' + c at a position whose
    frozen final norm scale is `final_norm_scale` (one row per prompt)."""
    u, bias = unembed_direction(model, targets, baselines)
    norm = model.ln_final
    gained = u * norm.gain.float()
    if norm.centre:
        gained = gained - gained.mean(-1, keepdim=True)
    if norm.b is not None:
        bias = bias + u @ norm.b.float()
    return LogitDirection(gained * final_norm_scale.float(), bias)
