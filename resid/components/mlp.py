"""The MLP as a key-value memory (Geva et al. 2021): neuron i has key W_in[:, i] (with W_gate[:, i] for
gated MLPs), value W_out[i], and coefficient post[i]; the MLP writes sum_i post[i] * W_out[i] + b_out.

Plain:  pre = x W_in + b_in,  post = act(pre).
Gated:  pre = x W_in + b_in (the linear 'up' branch), gate = x W_gate + b_gate, post = act(gate) * pre
        (SwiGLU with silu, GeGLU with gelu).

The weights are stored privately in torch's linear layout (one GEMM each); W_in, W_gate and W_out are their
one public name, as views.
"""

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from resid.components.xielu import XIELU
from resid.config import ModelConfig
from resid.interventions import Edit, apply_edits

ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "relu2": lambda x: F.relu(x).square(),  # squared ReLU (So et al. 2021): Nemotron, Arcee
}


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        # xIELU has learned scalars per layer: a module of its own (its parameters are this MLP's act.*)
        self.act = XIELU() if config.act == "xielu" else ACTIVATIONS[config.act]
        d_mlp = config.mlp_width(layer)  # d_mlp, or DeepSeek's dense first layers' d_mlp_dense
        self._w_in = nn.Parameter(torch.zeros(d_mlp, config.d_model))
        self._w_gate = nn.Parameter(torch.zeros(d_mlp, config.d_model)) if config.gated_mlp else None
        self._w_out = nn.Parameter(torch.zeros(config.d_model, d_mlp))
        bias = config.mlp_bias
        self.b_in = nn.Parameter(torch.zeros(d_mlp)) if bias else None
        self.b_gate = nn.Parameter(torch.zeros(d_mlp)) if bias and config.gated_mlp else None
        self.b_out = nn.Parameter(torch.zeros(config.d_model)) if bias else None

    @property
    def W_in(self) -> Float[Tensor, "d_model d_mlp"]:
        return self._w_in.T

    @property
    def W_gate(self) -> Float[Tensor, "d_model d_mlp"] | None:
        return None if self._w_gate is None else self._w_gate.T

    @property
    def W_out(self) -> Float[Tensor, "d_mlp d_model"]:
        return self._w_out.T

    def forward(
        self, normalized: Float[Tensor, "batch pos d_model"], want: frozenset[str], edits: Sequence[Edit]
    ) -> tuple[Float[Tensor, "batch pos d_model"], dict[str, Tensor]]:
        """The MLP output before any post-norm (the block applies that, and the write edits)."""
        # over the rows [batch * pos, d_model]: each projection one 2-D matmul (F.linear of 3-D input reshapes
        # around it), back to [batch pos ...] where a value is edited or kept
        lead = normalized.shape[:-1]
        rows = normalized.flatten(0, 1)
        pre = F.linear(rows, self._w_in, self.b_in)
        gate = None
        if self._w_gate is not None:
            gate = F.linear(rows, self._w_gate, self.b_gate)
            post = self.act(gate) * pre
        else:
            post = self.act(pre)
        if edits:
            post = apply_edits(post.view(*lead, -1), edits, "post").flatten(0, 1)
        out = F.linear(post, self._w_out, self.b_out).view(normalized.shape)
        values = {"pre": pre, "gate": gate, "post": post}
        return out, {name: values[name].view(*lead, -1) for name in want if values.get(name) is not None}
