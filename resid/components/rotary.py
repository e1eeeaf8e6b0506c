"""Rotary position embedding (Su et al. 2021) in Hugging Face's `rotate_half` layout, with the scaling schemes
of transformers' modeling_rope_utils (linear, dynamic NTK, llama3, yarn) and llama.cpp's per-frequency factors.

The first `rotary_dims` dims of each head are split in two halves (x1, x2) that rotate as complex pairs
(x1[i], x2[i]) with frequency inv_freq[i] = base^(-2i/rotary_dims), rescaled by the scheme; the remaining
dims pass through (partial rotary, GPT-NeoX, Phi). llama.cpp stores Q/K rows interleaved instead; the GGUF
loader un-permutes them. Gemma 3 has two rotaries: its sliding layers use a local base, unscaled.

The sin that `cos_sin` returns has its first half negated (sin of the angles times (-1, .., -1, 1, .., 1)), so that
rotate_half(x) * sin == x.roll(rot / 2) * signed sin, bit for bit (a sign flip is exact): applying the rotary is
three kernels and a roll instead of chunk, neg, cat and three more, and the sign is flipped once per run, not per
layer.
"""

import math

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from resid.components import computed
from resid.config import ModelConfig, RopeScaling


def rotate_half(x: Float[Tensor, "... d"]) -> Float[Tensor, "... d"]:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _plain(base: float, dims: int) -> Float[Tensor, "half"]:
    return 1.0 / (base ** (torch.arange(0, dims, 2, dtype=torch.int64).float() / dims))


def inverse_frequencies(
    base: float, dims: int, scaling: RopeScaling | None, n_ctx: int, seq_len: int | None = None
) -> tuple[Float[Tensor, "half"], float]:
    """(inv_freq, attention factor multiplying cos and sin), as transformers computes them for this scheme.
    `seq_len` matters only to dynamic scaling, which changes the base once a sequence outgrows `n_ctx`."""
    if scaling is None:
        return _plain(base, dims), 1.0
    factor = scaling.factor
    if scaling.kind == "linear":
        return _plain(base, dims) / factor, 1.0
    if scaling.kind == "factors":
        return _plain(base, dims) / torch.tensor(scaling.factors, dtype=torch.float32), 1.0
    if scaling.kind == "dynamic":
        original = scaling.original_n_ctx or n_ctx
        seq_len = max(seq_len or original, original)
        grown = base * ((factor * seq_len / original) - (factor - 1)) ** (dims / (dims - 2))
        return _plain(grown, dims), 1.0
    if scaling.kind == "llama3":
        inv_freq = _plain(base, dims)
        old = scaling.original_n_ctx or n_ctx
        low_wavelen, high_wavelen = old / scaling.low_freq_factor, old / scaling.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled), 1.0
    return _yarn(base, dims, scaling)


def _yarn(base: float, dims: int, scaling: RopeScaling) -> tuple[Float[Tensor, "half"], float]:
    factor, original = scaling.factor, scaling.original_n_ctx

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = scaling.attention_factor
    if attention is None:
        if scaling.mscale and scaling.mscale_all_dim:
            attention = mscale(factor, scaling.mscale) / mscale(factor, scaling.mscale_all_dim)
        else:
            attention = mscale(factor)

    def correction_dim(rotations: float) -> float:
        return (dims * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(scaling.beta_fast), correction_dim(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dims - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dims // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dims, 2).float() / dims)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention)


class Rotary(nn.Module):
    def __init__(self, config: ModelConfig, base: float | None = None, scaled: bool = True):
        super().__init__()
        self.dims = config.rotary_dims
        self.base = config.rotary_base if base is None else base
        self.scaling = config.rope_scaling if scaled else None
        self.n_ctx = config.n_ctx
        with computed():
            inv_freq, self.attention_factor = inverse_frequencies(self.base, self.dims, self.scaling, self.n_ctx)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _apply(self, fn, recurse: bool = True):
        """Moves the frequencies with the model but keeps them float32 (as transformers does): model.to(bfloat16)
        would round 0.1 to 0.1001 and turn each angle by ~0.1 rad at position 1,000."""
        super()._apply(fn, recurse)
        if self.inv_freq.dtype != torch.float32:
            inv_freq = inverse_frequencies(self.base, self.dims, self.scaling, self.n_ctx)[0]
            self.inv_freq = inv_freq.to(self.inv_freq.device)
        return self

    def cos_sin(
        self, position_ids: Int[Tensor, "batch pos"], dtype: torch.dtype
    ) -> tuple[Float[Tensor, "batch pos 1 rot"], Float[Tensor, "batch pos 1 rot"]]:
        """(cos, signed sin) of every position's angles, in `dtype` (the module docstring's layout), for `apply`."""
        if self.scaling is not None and self.scaling.kind == "dynamic":
            # Each prompt's base grows with its own length, so a prompt's numbers never depend on its batch
            # (transformers uses the longest row of the batch; the two agree for one prompt).
            lengths = (position_ids.max(dim=1).values + 1).tolist() if position_ids.numel() else [1] * len(position_ids)
            per_row = [inverse_frequencies(self.base, self.dims, self.scaling, self.n_ctx, int(n))[0] for n in lengths]
            inv_freq = torch.stack(per_row).to(position_ids.device)
            freqs = position_ids.float()[..., None] * inv_freq[:, None, :]
        else:
            # Angles in float32 even for half-precision models: positions times frequencies lose digits otherwise.
            freqs = position_ids.float()[..., None] * self.inv_freq.float()
        cos, sin = freqs[:, :, None, :].cos(), freqs[:, :, None, :].sin()
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype), sin.to(dtype)

    @staticmethod
    def apply(
        x: Float[Tensor, "batch pos head d_head"], cos: Float[Tensor, "batch pos 1 rot"],
        sin: Float[Tensor, "batch pos 1 rot"],
    ) -> Float[Tensor, "batch pos head d_head"]:
        """x rotated by (cos, signed sin) from `cos_sin`: x * cos + rotate_half(x) * sin in Hugging Face's terms."""
        dims = cos.shape[-1]
        if dims == x.shape[-1]:
            return x * cos + x.roll(dims // 2, -1) * sin
        rot, rest = x[..., :dims], x[..., dims:]
        return torch.cat((rot * cos + rot.roll(dims // 2, -1) * sin, rest), dim=-1)

    @staticmethod
    def apply_qk(
        q: Float[Tensor, "batch pos head d_head"], k: Float[Tensor, "batch pos kv_head d_head"],
        cos: Float[Tensor, "batch pos 1 rot"], sin: Float[Tensor, "batch pos 1 rot"],
    ) -> tuple[Float[Tensor, "batch pos head d_head"], Float[Tensor, "batch pos kv_head d_head"]]:
        """q and k rotated in one application over their heads side by side (one kernel per step of `apply` for
        both, and one copy to put them side by side, instead of each step twice): the same numbers as
        apply(q, ...) and apply(k, ...); both come back as views of one tensor."""
        both = Rotary.apply(torch.cat((q, k), dim=2), cos, sin)
        return both.split((q.shape[2], k.shape[2]), dim=2)
