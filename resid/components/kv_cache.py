"""The keys and values generation keeps between its steps (resid.generate), one buffer per layer allocated once."""

import dataclasses
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from resid.config import ModelConfig


@dataclass
class KVCache:
    """Keys (after rotary) and values of every layer for the positions run so far (resid.generate). Storage for
    the whole generation is allocated once, so a step writes one position instead of copying the past."""

    keys: list[Float[Tensor, "batch kv_head max_pos d_head"]]  # one per layer
    values: list[Float[Tensor, "batch kv_head max_pos d_head_v"]]
    filled: list[int]  # positions written so far, per layer
    # decoders of encoder-decoder models: each layer's cross-attention keys and values of the source, computed
    # (and edited) once, on the first pass, and read by every later step
    cross: dict[int, tuple[Tensor, Tensor]] = dataclasses.field(default_factory=dict)

    @classmethod
    def empty(
        cls, config: ModelConfig, batch: int, max_pos: int, dtype: torch.dtype, device: torch.device
    ) -> "KVCache":
        shape = (batch, config.n_kv_heads, max_pos, config.d_head)
        keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layers)]
        shape = (*shape[:-1], config.v_width)  # latent attention's values are narrower than its keys
        values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layers)]
        return cls(keys, values, [0] * config.n_layers)

    def extend(
        self, layer: int, k_h: Float[Tensor, "batch kv_head pos d_head"],
        v_h: Float[Tensor, "batch kv_head pos d_head_v"],
    ) -> tuple[Float[Tensor, "batch kv_head key_pos d_head"], Float[Tensor, "batch kv_head key_pos d_head_v"]]:
        """Append this pass's keys/values to the layer's cache; return every cached position's."""
        start, end = self.filled[layer], self.filled[layer] + k_h.shape[2]
        self.keys[layer][:, :, start:end] = k_h
        self.values[layer][:, :, start:end] = v_h
        self.filled[layer] = end
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]
