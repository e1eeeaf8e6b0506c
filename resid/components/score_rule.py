"""The frozen rule that turns one attention layer's queries and keys into scores and a pattern: the scale, Gemma 2's
soft cap, the query-to-key/value head map (MHA, GQA, MQA), and the float32 softmax. The forward (Attention,
ScoreInputs) and every reader of frozen scores (QK attribution, AtP*, the source side) use this one rule."""

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from resid.config import ModelConfig


@dataclass(frozen=True)
class ScoreRule:
    """What turns one head's query q and key k into its score, frozen: raw = q . k * scale, then the soft cap,
    score = cap * tanh(raw / cap) (Gemma 2; none elsewhere); query head h reads key/value head h // group. The
    masks and T5's relative position bias are the pass's (AttnContext), not the layer's."""

    scale: float  # d_head^-0.5 unless the config sets attn_scale (score_scale)
    softcap: float | None  # None: no cap
    group: int  # query heads per key/value head: 1 (MHA), n_heads / n_kv_heads (GQA), n_heads (MQA)

    def kv_head(self, head: int) -> int:
        """The key/value head query head `head` reads."""
        return head // self.group

    def repeat_kv(self, x: Float[Tensor, "..."], dim: int) -> Float[Tensor, "..."]:
        """x with its key/value-head axis `dim` repeated to one entry per query head (Hugging Face's repeat_kv)."""
        return x.repeat_interleave(self.group, dim=dim)

    def raw(self, q: Float[Tensor, "*batch pos d_head"], k: Float[Tensor, "*batch key_pos d_head"]
            ) -> Float[Tensor, "*batch pos key_pos"]:
        """q k^T * scale, before any soft cap: queries and keys of the same heads (repeat_kv the keys first)."""
        # in place on the fresh product: the same numbers, one pass fewer over the [... pos key_pos] scores
        return (q @ k.transpose(-1, -2)).mul_(self.scale)

    def capped(self, raw: Float[Tensor, "*shape"]) -> Float[Tensor, "*shape"]:
        """The scores of raw scores: cap * tanh(raw / cap) with a soft cap, raw itself without one."""
        return raw if self.softcap is None else torch.tanh(raw / self.softcap) * self.softcap

    def uncapped(self, scores: Float[Tensor, "*shape"]) -> Float[Tensor, "*shape"]:
        """The raw scores of scores (capped's inverse, cap * atanh(score / cap)), in float64: a capped score within
        float rounding of the cap is read as just below it."""
        if self.softcap is None:
            return scores.double()
        return self.softcap * torch.atanh((scores.double() / self.softcap).clamp(-1 + 1e-15, 1 - 1e-15))


def score_scale(config: ModelConfig) -> float:
    """What q . k is multiplied by: config.attn_scale where the loader sets one (Gemma's query_pre_attn_scalar,
    DeepSeek's yarn mscale), else 1 / sqrt(d_head)."""
    return config.attn_scale if config.attn_scale is not None else config.d_head**-0.5


def softmax(scores: Float[Tensor, "*batch key_pos"], dtype: torch.dtype) -> Float[Tensor, "*batch key_pos"]:
    """The pattern of scores: softmax over the keys in float32 (as the eager Hugging Face attention), in `dtype`."""
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
