"""Token embedding, positional (learned or sinusoidal) and token-type embeddings, and the unembedding."""

import math

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from resid.components import computed
from resid.config import ModelConfig


class Embed(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.W_E = nn.Parameter(torch.zeros(config.d_vocab, config.d_model))
        self.scale = config.embed_scale

    def forward(self, ids: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        x = F.embedding(ids, self.W_E)
        if self.scale != 1.0:
            # Gemma multiplies by sqrt(d_model) rounded to the model dtype; do the same for parity.
            x = x * torch.tensor(self.scale, dtype=x.dtype)
        return x


class PosEmbed(nn.Module):
    """W_pos [n_ctx d_model] added to the token embedding: learned, or the fixed sinusoids of Vaswani et al. 2017
    (a buffer, never read from a checkpoint)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.positions == "sinusoidal":
            with computed():
                table = sinusoids(config.n_ctx, config.d_model, config.sinusoid_layout)
            self.register_buffer("W_pos", table, persistent=False)
        else:
            self.W_pos = nn.Parameter(torch.zeros(config.n_ctx, config.d_model))

    def forward(self, position_ids: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return F.embedding(position_ids, self.W_pos)


def sinusoids(n_ctx: int, d_model: int, layout: str = "interleaved") -> Float[Tensor, "n_ctx d_model"]:
    """PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(p / 10000^(2i/d)) (Vaswani et al. 2017), computed in
    float64. layout "halves" puts the d/2 sines first and the cosines after them (Marian, fairseq)."""
    position = torch.arange(n_ctx, dtype=torch.float64)[:, None]
    frequency = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    angles = position * frequency  # [n_ctx d_model/2]
    if layout == "halves":
        table = torch.cat([angles.sin(), angles.cos()], dim=-1)
    else:
        table = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)
    return table.float()


class TokenTypeEmbed(nn.Module):
    """BERT's segment embedding W_type [n_token_types d_model]; resid feeds single texts, type 0 everywhere."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.W_type = nn.Parameter(torch.zeros(config.n_token_types, config.d_model))

    def forward(self, ids: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self.W_type[0].expand(*ids.shape, -1)


class Unembed(nn.Module):
    """logits = normalized_final @ W_U + b_U, soft-capped to cap * tanh(logits / cap) in models with a final
    soft cap (Gemma 2). W_U is stored as [d_vocab d_model] so that a tied model shares one tensor with W_E;
    `W_U` is its [d_model d_vocab] view. `raw` gives the logits before the cap, which are linear in x."""

    def __init__(self, config: ModelConfig, embed: Embed):
        super().__init__()
        if config.tie_embeddings:
            self.weight = embed.W_E
        else:
            self.weight = nn.Parameter(torch.zeros(config.d_vocab, config.d_model))
        self.b_U = nn.Parameter(torch.zeros(config.d_vocab)) if config.unembed_bias else None
        self.softcap = config.final_softcap

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        return self.weight.T

    def raw(self, x: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch d_vocab"]:
        return F.linear(x, self.weight, self.b_U)

    def frozen(self, x: Float[Tensor, "*batch d_model"], constants: bool = True) -> Float[Tensor, "*batch d_vocab"]:
        """`raw` in float32 whatever the model dtype (the logits before any soft cap: the linear map an
        attribution graph's replacement model ends on); b_U only with `constants`, so that without it this is
        linear, the adjoint of `frozen_adjoint`."""
        logits = x.float() @ self.weight.detach().float().T
        return logits + self.b_U.detach().float() if constants and self.b_U is not None else logits

    def frozen_adjoint(self, g: Float[Tensor, "*batch d_vocab"]) -> Float[Tensor, "*batch d_model"]:
        """The cotangent on x from one on the uncapped logits (float32): a read-out of the logits as a direction on
        the final norm's output, e.g. a one-hot g gives W_U[:, token]."""
        return g.float() @ self.weight.detach().float()

    def cap(self, logits: Float[Tensor, "*batch"]) -> Float[Tensor, "*batch"]:
        """The final soft cap (identity for models without one)."""
        return logits if self.softcap is None else torch.tanh(logits / self.softcap) * self.softcap

    def forward(self, x: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch d_vocab"]:
        return self.cap(self.raw(x))
