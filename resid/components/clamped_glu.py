"""gpt-oss's clamped SwiGLU (OpenAI 2025): the experts' gate and linear branches are clamped before they meet, and
the linear branch is shifted by 1:

    g    = min(gate, limit)                   gate = x W_gate + b_gate
    u    = clamp(up, -limit, limit)           up   = x W_in + b_in
    post = (u + 1) * g * sigmoid(alpha g)

(limit 7, alpha 1.702 in the released models). Elementwise per neuron, so each expert neuron's coefficient is post[i]
as in any gated MLP, and the expert writes post W_out + b_out.
"""

import torch
from jaxtyping import Float
from torch import Tensor


def clamped_swiglu(
    gate: Float[Tensor, "*batch d_mlp"], up: Float[Tensor, "*batch d_mlp"], limit: float, alpha: float
) -> Float[Tensor, "*batch d_mlp"]:
    gate = gate.clamp(max=limit)
    return (up.clamp(-limit, limit) + 1) * (gate * torch.sigmoid(gate * alpha))
