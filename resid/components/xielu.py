"""xIELU (Huang & Schlag 2025, "Deriving Activation Functions Using Integration"), the activation of Apertus'
MLPs, as transformers' XIELUActivation computes it (its Python path), with two learned scalars per layer:

    alpha_p = softplus(a_p),  alpha_n = beta + softplus(a_n)
    xielu(x) = alpha_p x^2 + beta x                            x > 0
               alpha_n (expm1(min(x, eps)) - x) + beta x       x <= 0

a_p, a_n, beta and eps are read from the checkpoint (act_fn.alpha_p, act_fn.alpha_n, act_fn.beta, act_fn.eps). It is
elementwise, so each neuron's coefficient post[i] = xielu(pre[i]) is as in any plain MLP.
"""

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn


class XIELU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.alpha_p = nn.Parameter(torch.zeros(1))
        self.alpha_n = nn.Parameter(torch.zeros(1))
        self.beta = nn.Parameter(torch.zeros(()))
        self.eps = nn.Parameter(torch.zeros(()))

    def forward(self, x: Float[Tensor, "*batch d_mlp"]) -> Float[Tensor, "*batch d_mlp"]:
        alpha_p = F.softplus(self.alpha_p)
        alpha_n = self.beta + F.softplus(self.alpha_n)
        negative = (torch.expm1(torch.minimum(x, self.eps)) - x) * alpha_n + self.beta * x
        return torch.where(x > 0, alpha_p * x * x + self.beta * x, negative)
