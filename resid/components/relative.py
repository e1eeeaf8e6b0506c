"""T5's relative position bias (Raffel et al. 2020): no position is added to the stream; instead every
self-attention score q.k gets a learned bias b[bucket(key_pos - query_pos), head]. Distances are sorted into
`relative_buckets` buckets: half of them exact (0, 1, 2, ...), the other half log-spaced up to
`relative_max_distance`, beyond which all distances share the last bucket. Encoders are bidirectional (half
the buckets for keys after the query), decoders causal (only distances to earlier keys count).

T5 stores one table in layer 0 and every layer reads it; umT5 gives every layer its own. Positions are the
position ids of the run (0 = a sequence's first real token), so padding on either side changes nothing.

The bias only moves attention patterns: it writes nothing into the residual stream, so every decomposition of
the stream is as exact as without it.
"""

import math

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from resid.config import ModelConfig


def relative_buckets(
    relative: Int[Tensor, "*shape"], bidirectional: bool, n_buckets: int, max_distance: int
) -> Int[Tensor, "*shape"]:
    """The bucket of each relative position (key - query), as T5 (mesh-tensorflow) computes it."""
    bucket = torch.zeros_like(relative)
    if bidirectional:
        n_buckets //= 2
        bucket = bucket + (relative > 0).long() * n_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    exact = n_buckets // 2
    # log-spaced beyond `exact`; float32 as in the reference, then truncated toward zero
    far = exact + (
        torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact) * (n_buckets - exact)
    ).long()
    far = far.clamp(max=n_buckets - 1)
    return bucket + torch.where(distance < exact, distance, far)


class RelativeBias(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        n_tables = config.n_layers if config.relative_bias_per_layer else 1
        # table t: [bucket head], as the checkpoints store it (relative_attention_bias.weight)
        self.tables = nn.ParameterList(
            nn.Parameter(torch.zeros(config.relative_buckets, config.n_heads)) for _ in range(n_tables)
        )
        self.bidirectional = not config.causal
        self.n_buckets, self.max_distance = config.relative_buckets, config.relative_max_distance

    def buckets(
        self, query_positions: Int[Tensor, "batch pos"], key_positions: Int[Tensor, "batch key_pos"]
    ) -> Int[Tensor, "#batch pos key_pos"]:
        """The bucket of every (query, key) pair; one row for the whole batch when every row has the same
        positions (nothing padded), so that the bias is computed once, not per prompt."""
        if bool((query_positions == query_positions[:1]).all()) and bool((key_positions == key_positions[:1]).all()):
            query_positions, key_positions = query_positions[:1], key_positions[:1]
        relative = key_positions[:, None, :] - query_positions[:, :, None]
        return relative_buckets(relative, self.bidirectional, self.n_buckets, self.max_distance)

    def table(self, layer: int) -> int:
        """Which table `layer` reads."""
        return layer if len(self.tables) > 1 else 0

    def bias(
        self,
        layer: int,
        buckets: Int[Tensor, "#batch pos key_pos"],
        blocked: Bool[Tensor, "#batch 1 pos key_pos"] | Bool[Tensor, "pos key_pos"] | None,
        dtype: torch.dtype,
    ) -> Float[Tensor, "#batch head pos key_pos"]:
        """What `layer` adds to its scores: the bias, and -inf where a key may not be read (an additive mask)."""
        bias = self.tables[self.table(layer)][buckets].permute(0, 3, 1, 2).to(dtype)
        if blocked is not None:  # buckets may be one row shared by the batch, the mask per row: broadcast
            bias = torch.where(blocked, torch.tensor(float("-inf"), dtype=dtype, device=bias.device), bias)
        return bias
