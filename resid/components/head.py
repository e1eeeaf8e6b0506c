"""BERT's masked-LM transform, between the final hidden state and the (tied, biased) decoder:

    transform(x) = LN(act(x W_dense + b_dense))

It is not linear, but with its state frozen from the run it is affine, as a norm with a frozen scale is: the
activation becomes a per-unit gain r = act(h) / h (h = x W_dense + b_dense; r = act'(0) where h is 0) and the
norm's scale is frozen. `pull_back` carries a direction read after the transform to the hidden state before
it, so direct attribution through an MLM head stays exact (resid.readout).
"""

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from resid.components.mlp import ACTIVATIONS
from resid.components.norm import Norm
from resid.config import ModelConfig

# act'(0): the limit of act(h) / h at h = 0
_SLOPE_AT_ZERO = {"gelu": 0.5, "gelu_new": 0.5, "relu": 0.0, "silu": 0.5, "relu2": 0.0}


class MLMHead(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.act = ACTIVATIONS[config.act]
        self.slope_at_zero = _SLOPE_AT_ZERO[config.act]
        self._w_dense = nn.Parameter(torch.zeros(config.d_model, config.d_model))
        self.b_dense = nn.Parameter(torch.zeros(config.d_model))
        self.ln = Norm(config)

    @property
    def W_dense(self) -> Float[Tensor, "d_model d_model"]:
        """[d_in d_out]: h = x @ W_dense + b_dense."""
        return self._w_dense.T

    def forward(self, hidden: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch d_model"]:
        return self.ln(self.act(F.linear(hidden, self._w_dense, self.b_dense)))[0]

    @torch.no_grad()
    def pull_back(
        self, u: Float[Tensor, "batch d_model"], hidden: Float[Tensor, "batch d_model"]
    ) -> tuple[Float[Tensor, "batch d_model"], Float[Tensor, "batch"]]:
        """(v, c) with transform(hidden) . u == hidden . v + c, the transform's state frozen at `hidden` (float32)."""
        h = F.linear(hidden.float(), self._w_dense.float(), self.b_dense.float())
        activated = self.act(h)
        gain = torch.where(h != 0, activated / torch.where(h != 0, h, 1.0), self.slope_at_zero)
        scale = self.ln(activated)[1]
        after_act = self.ln.pull_back(u, scale)  # what u reads on act(h)
        on_h = after_act * gain
        v = on_h @ self._w_dense.float()  # W_dense^T pulled: h = hidden @ W_dense + b
        c = self.ln.bias_dot(u) + on_h @ self.b_dense.float()
        return v, c
