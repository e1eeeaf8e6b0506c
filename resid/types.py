"""Axis glossary and the tensor aliases used across resid.

Axes (every einsum in resid names them):

    batch     prompts in a padded batch
    pos       query / residual positions (padded sequence index, not the token's position id)
    key_pos   key positions an attention head reads from
    head      attention heads (n_heads)
    kv_head   key/value heads; fewer than `head` for grouped-query attention (n_kv_heads)
    d_head    per-head width
    d_model   residual stream width
    d_mlp     MLP hidden width; one neuron (Geva's key/value memory) per index
    d_vocab   vocabulary size
    component one write into the residual stream (embedding, a sublayer, a head, ...)
"""

from jaxtyping import Bool, Float, Int
from torch import Tensor

Resid = Float[Tensor, "batch pos d_model"]
NormScale = Float[Tensor, "batch pos 1"]
HeadVectors = Float[Tensor, "batch pos head d_head"]
KVHeadVectors = Float[Tensor, "batch pos kv_head d_head"]
Pattern = Float[Tensor, "batch head pos key_pos"]
Neurons = Float[Tensor, "batch pos d_mlp"]
Logits = Float[Tensor, "batch pos d_vocab"]
TokenIds = Int[Tensor, "batch pos"]
Mask = Bool[Tensor, "batch pos"]
