"""LayerNorm and RMSNorm that also return their scale (1/sigma or 1/rms), so it can be frozen.

With the scale frozen a norm is affine in its input, which is what makes direct attribution exact.
Statistics are computed in float32 whatever the model dtype, as Hugging Face does.
"""

import torch
from jaxtyping import Float
from torch import Tensor, nn

from resid.config import ModelConfig


class Norm(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.centre = config.norm == "layernorm"
        self.eps = config.norm_eps
        self.gain_offset = config.norm_gain_offset
        self.w = nn.Parameter(torch.ones(config.d_model) - config.norm_gain_offset)
        self.b = nn.Parameter(torch.zeros(config.d_model)) if self.centre else None

    @property
    def gain(self) -> Float[Tensor, "d_model"]:
        """The effective multiplier: w, or 1 + w for Gemma-style stored gains."""
        return self.w + self.gain_offset if self.gain_offset else self.w

    def forward(
        self, x: Float[Tensor, "batch pos d_model"]
    ) -> tuple[Float[Tensor, "batch pos d_model"], Float[Tensor, "batch pos 1"]]:
        x32 = x.float()
        if self.centre:
            x32 = x32 - x32.mean(-1, keepdim=True)
        scale = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        # The gain in float32 before adding the offset: Gemma's 1 + w rounded to bfloat16 would lose most of w.
        normalized = x32 * scale * (self.w.float() + self.gain_offset)
        if self.b is not None:
            normalized = normalized + self.b.float()
        return normalized.to(x.dtype), scale.to(x.dtype)
