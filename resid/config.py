"""ModelConfig: everything that distinguishes one decoder-only architecture from another.

An architecture in resid is a config plus a weight-key table (resid/load/), never a branch in the forward
pass: GPT-2, Llama, Mistral, Qwen2, GPT-NeoX and Gemma differ only in the values below.
"""

import dataclasses
from dataclasses import dataclass
from typing import Literal

from resid.errors import ResidError


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # family the weights came from ("llama", "gpt2", ...): provenance only, never branched on
    d_model: int  # residual stream width
    n_layers: int  # number of blocks
    n_heads: int  # query heads per attention sublayer
    n_kv_heads: int  # key/value heads; < n_heads means grouped-query attention
    d_head: int  # per-head width (not always d_model // n_heads, e.g. Gemma)
    d_mlp: int  # MLP hidden width (number of neurons)
    d_vocab: int  # vocabulary size (rows of W_E, columns of W_U)
    n_ctx: int  # longest sequence the model accepts (learned positions or trained context)
    norm: Literal["layernorm", "rmsnorm"]  # LayerNorm centres and scales; RMSNorm only scales
    norm_eps: float  # epsilon inside the square root of every norm
    norm_gain_offset: float = 0.0  # gain = offset + w; Gemma stores w - 1 and uses 1 + w
    block: Literal["sequential", "parallel"] = "sequential"  # parallel: attn and MLP both read resid_pre
    positions: Literal["learned", "rotary"] = "rotary"  # learned: W_pos added to the embedding
    rotary_dim: int | None = None  # leading dims of each head that rotate (partial rotary); None = d_head
    rotary_base: float = 10000.0  # theta of the rotary frequencies
    attn_qkv_bias: bool = False  # q, k and v projections have biases (GPT-2, Qwen2, GPT-NeoX)
    attn_out_bias: bool = False  # output projection has a bias (GPT-2, GPT-NeoX)
    attn_scale: float | None = None  # multiplies q.k; None = 1 / sqrt(d_head)
    sliding_window: int | None = None  # each query sees at most this many keys (itself included)
    act: Literal["gelu", "gelu_new", "relu", "silu"] = "silu"  # gelu_new is the tanh approximation
    gated_mlp: bool = True  # post = act(x W_gate) * (x W_in): SwiGLU with silu, GeGLU with gelu(_new)
    mlp_bias: bool = False  # W_in, W_gate and W_out have biases
    tie_embeddings: bool = False  # W_U is W_E transposed (one tensor)
    unembed_bias: bool = False  # the unembedding has a bias b_U
    embed_scale: float = 1.0  # the token embedding is multiplied by this (Gemma: sqrt(d_model))

    def __post_init__(self) -> None:
        problems = []
        if self.n_heads % self.n_kv_heads:
            problems.append(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        rotary_dim = self.rotary_dim if self.rotary_dim is not None else self.d_head
        if self.positions == "rotary" and (rotary_dim % 2 or not 0 < rotary_dim <= self.d_head):
            problems.append(f"rotary_dim={rotary_dim} must be even and in (0, d_head={self.d_head}]")
        for name in ("d_model", "n_layers", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx"):
            if getattr(self, name) <= 0:
                problems.append(f"{name}={getattr(self, name)} must be positive")
        if problems:
            raise ResidError("Invalid ModelConfig: " + "; ".join(problems) + ". Fix these fields.")

    @property
    def rotary_dims(self) -> int:
        """Dims of each head that rotate (0 for learned positions)."""
        if self.positions != "rotary":
            return 0
        return self.rotary_dim if self.rotary_dim is not None else self.d_head

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
