"""JumpReLU with an L0 penalty through straight-through estimators, as SAELens 6's JumpReLUTrainingSAE trains it
after Rajamanoharan et al. 2024 ("Jumping Ahead", read for this):

    threshold                                            a parameter itself (starts at recipe.init_threshold, 0.01),
                                                         projected onto threshold >= 0 before each step
    acts = pre * (pre > threshold)
    loss = sum_d (y - y^)^2 (mean over tokens) + l0_coefficient * sum_i H(pre_i - threshold_i) (mean over tokens)

H is the Heaviside step. Neither the jump nor the step has a useful gradient with respect to the threshold, so the
backward pass uses the rectangle kernel K(u) = 1 for |u| < 1/2 of width epsilon = recipe.bandwidth:

    d acts_i / d pre_i = 1 where pre_i > threshold_i (0 elsewhere)
    d acts_i / d threshold_i = -(threshold_i / epsilon) * K((pre_i - threshold_i) / epsilon)
    d H(pre_i - threshold_i) / d threshold_i = -(1 / epsilon) * K((pre_i - threshold_i) / epsilon)

(the step has no gradient with respect to pre). The decoder is left free, as in SAELens (rows start at norm 0.1).

The threshold is trained as it is, not as exp(log_threshold) (DeepMind's parametrisation, which SAELens 6.54 left:
Adam moves a parameter by about the learning rate per step, so a log moves a small threshold multiplicatively and
barely at all in a short run); tests/training/test_saelens_oracle.py replays SAELens 6.54.12's own steps. A state
saved with the earlier `log_threshold` loads as its exponential.
"""

from typing import Any

import torch
from torch import Tensor, nn

from resid.analyses.training.coder import Coder, mse
from resid.dictionaries import ActivationFunction


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
        self.threshold = nn.Parameter(torch.full((self.d_sae,), float(self.recipe.init_threshold)))

    def loss(self, x: Tensor, y: Tensor, step: int, dead: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        with torch.no_grad():  # a negative threshold would pass negative pre-activations: projected, as SAELens does
            self.threshold.clamp_(min=0.0)  # (a clamp in the graph would zero its gradient there for good)
        pre = self.pre(x)
        threshold = self.threshold
        acts = JumpReLU.apply(pre, threshold, self.recipe.bandwidth)
        y_hat = self.decode(acts, x)
        l0 = Step.apply(pre, threshold, self.recipe.bandwidth).sum(-1).mean()
        coefficient = self.recipe.l0_coefficient * self.recipe.sparsity_factor(step)
        return mse(y, y_hat) + coefficient * l0, acts, y_hat

    def exported_activation(self) -> ActivationFunction:
        return ActivationFunction("jumprelu", self.threshold.detach().float().cpu().clone())

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        old = f"{prefix}log_threshold"  # a state saved before the threshold was trained as it is
        if old in state_dict:
            state_dict[f"{prefix}threshold"] = state_dict.pop(old).exp()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
