"""Rotary position embedding (Su et al. 2021) in Hugging Face's `rotate_half` layout.

The first `rotary_dims` dims of each head are split in two halves (x1, x2) that rotate as complex pairs
(x1[i], x2[i]) with frequency base^(-2i/rotary_dims); the remaining dims pass through (partial rotary,
GPT-NeoX). llama.cpp stores Q/K rows interleaved instead; the GGUF loader un-permutes them.
"""

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from resid.config import ModelConfig


def rotate_half(x: Float[Tensor, "... d"]) -> Float[Tensor, "... d"]:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Rotary(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.dims = config.rotary_dims
        exponents = torch.arange(0, self.dims, 2, dtype=torch.int64).float() / self.dims
        self.register_buffer("inv_freq", 1.0 / (config.rotary_base**exponents), persistent=False)

    def cos_sin(
        self, position_ids: Int[Tensor, "batch pos"], dtype: torch.dtype
    ) -> tuple[Float[Tensor, "batch pos 1 rot"], Float[Tensor, "batch pos 1 rot"]]:
        # Angles in float32 even for half-precision models: positions times frequencies lose digits otherwise.
        freqs = position_ids.float()[..., None] * self.inv_freq.float()
        angles = torch.cat((freqs, freqs), dim=-1)[:, :, None, :]
        return angles.cos().to(dtype), angles.sin().to(dtype)

    @staticmethod
    def apply(
        x: Float[Tensor, "batch pos head d_head"], cos: Float[Tensor, "batch pos 1 rot"], sin: Float[Tensor, "batch pos 1 rot"]
    ) -> Float[Tensor, "batch pos head d_head"]:
        dims = cos.shape[-1]
        if dims == x.shape[-1]:
            return x * cos + rotate_half(x) * sin
        rot, rest = x[..., :dims], x[..., dims:]
        return torch.cat((rot * cos + rotate_half(rot) * sin, rest), dim=-1)
