"""JumpReLU with an L0 penalty through straight-through estimators, as SAELens 6's JumpReLUTrainingSAE trains it
after Rajamanoharan et al. 2024 ("Jumping Ahead", read for this):

    threshold = exp(log_threshold)                       (starts at recipe.init_threshold, 0.01)
    acts = pre * (pre > threshold)
    loss = sum_d (y - y^)^2 (mean over tokens) + l0_coefficient * sum_i H(pre_i - threshold_i) (mean over tokens)

H is the Heaviside step. Neither the jump nor the step has a useful gradient with respect to the threshold, so the
backward pass uses the rectangle kernel K(u) = 1 for |u| < 1/2 of width epsilon = recipe.bandwidth:

    d acts_i / d pre_i = 1 where pre_i > threshold_i (0 elsewhere)
    d acts_i / d threshold_i = -(threshold_i / epsilon) * K((pre_i - threshold_i) / epsilon)
    d H(pre_i - threshold_i) / d threshold_i = -(1 / epsilon) * K((pre_i - threshold_i) / epsilon)

(the step has no gradient with respect to pre). The decoder is left free, as in SAELens (rows start at norm 0.1).
"""

from typing import Any

import torch
from torch import Tensor, nn

from resid.analyses.training.coder import Coder, mse


def rectangle(u: Tensor) -> Tensor:
    return ((u > -0.5) & (u < 0.5)).to(u.dtype)


class JumpReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, pre: Tensor, threshold: Tensor, bandwidth: float) -> Tensor:
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return pre * (pre > threshold)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        pre, threshold = ctx.saved_tensors
        kernel = rectangle((pre - threshold) / ctx.bandwidth)
        d_threshold = (-(threshold / ctx.bandwidth) * kernel * grad).sum(0)
        return (pre > threshold) * grad, d_threshold, None


class Step(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, pre: Tensor, threshold: Tensor, bandwidth: float) -> Tensor:
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return (pre > threshold).to(pre.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, Tensor, None]:
        pre, threshold = ctx.saved_tensors
        kernel = rectangle((pre - threshold) / ctx.bandwidth)
        return None, (-(1.0 / ctx.bandwidth) * kernel * grad).sum(0), None


class JumpReLUCoder(Coder):
    unit_norm = False
    activation = "jumprelu"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log_threshold = nn.Parameter(torch.full((self.d_sae,), float(self.recipe.init_threshold)).log())

    def loss(self, x: Tensor, y: Tensor, step: int) -> tuple[Tensor, Tensor, Tensor]:
        pre = self.pre(x)
        threshold = self.log_threshold.exp()
        acts = JumpReLU.apply(pre, threshold, self.recipe.bandwidth)
        y_hat = self.decode(acts, x)
        l0 = Step.apply(pre, threshold, self.recipe.bandwidth).sum(-1).mean()
        coefficient = self.recipe.l0_coefficient * self.recipe.sparsity_factor(step)
        return mse(y, y_hat) + coefficient * l0, acts, y_hat

    def export_fields(self) -> dict:
        return {"activation": "jumprelu", "threshold": self.log_threshold.detach().exp().float().cpu().clone()}
