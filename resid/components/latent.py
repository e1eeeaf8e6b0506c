"""Multi-head latent attention (MLA; DeepSeek-AI 2024, "DeepSeek-V2", section 2.1), as transformers'
DeepseekV2Attention / DeepseekV3Attention compute it (unabsorbed: each head's keys and values expanded).
Glossary: `kv_rank` the width of the compressed latent, `q_rank` of the query latent (0: none), `rot` the rotary
dims (config.rotary_dim, DeepSeek's qk_rope_head_dim), `nope` = d_head - rot the dims without position
(qk_nope_head_dim), `d_head_v` each head's value and z width (v_head_dim).

    q_proj     x W_Q, or (q_rank > 0) RMSNorm(x W_DQ) W_UQ          [head d_head] = [nope | rot] per head
    kv_latent  RMSNorm(x W_DKV)                                     [kv_rank], the latent DeepSeek caches
    k_proj     [kv_latent W_UK[h] | x W_KR]                         the rotary key x W_KR [rot] shared by all heads
    v          kv_latent W_UV[h]                                    [head d_head_v]
    q, k       the last `rot` dims of q_proj / k_proj rotated; the scores are q k^T * scale, where scale is
               d_head^-0.5 times yarn's mscale(factor, mscale_all_dim)^2 (the loader computes it, config.attn_scale)
    z, out     as any attention: z = pattern v, out = sum_h z[h] W_O[h]

Rotary pairs: DeepSeek rotates the dims (2i, 2i+1) together ("interleaved": V2 always, V3 with rope_interleave),
Hugging Face's rotate_half the dims (i, i + rot/2) ("halves"). Interleaved rotary dims are gathered into halves
before rotating, as transformers' V3 does, so `q` and `k` hold their rotary dims in the halves layout (transformers'
V2 writes them back interleaved: the same scores, the dims permuted); q_proj and k_proj are as projected.

The weights are stored as the checkpoint fuses them ([kv_rank + rot, d_model] for W_DKV and W_KR, [head (nope +
d_head_v), kv_rank] for W_UK and W_UV), one GEMM each; their public names are views. With the pattern and the
latent's norm scale frozen (an attribution graph's replacement model), the value path is linear in what the
attention reads:

    frozen(x, P, s)         = sum_h P[h] ((x W_DKV) * s * g) W_UV[h] W_O[h] + b_O        (g: the latent norm's gain)
    frozen_adjoint(u, P, s) = sum_h ((P[h]^T u W_O[h]^T W_UV[h]^T) * g * s) W_DKV^T
"""

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from resid.components.attention import Attention, AttnContext
from resid.components.norm import Norm
from resid.components.rotary import Rotary
from resid.components.score_rule import score_scale
from resid.config import ModelConfig
from resid.errors import ResidError
from resid.interventions import Edit, apply_edits

# The latents' RMSNorms keep transformers' (and DeepSeek's own code's) default epsilon, whatever rms_norm_eps says
LATENT_NORM_EPS = 1e-6


class LatentAttention(Attention):
    frozen_fields = ("kv_norm_scale",)

    def __init__(self, config: ModelConfig, layer: int):
        nn.Module.__init__(self)  # Attention's fields that the shared forward reads, not its weights
        self.layer, self.cross, self.layer_type = layer, False, config.layer_type(layer)
        self.rotates = True  # its shared rotary key always rotates (no NoPE layers)
        self.sinks = None  # no attention sinks
        self.n_heads = self.n_kv_heads = config.n_heads
        self.d_head, self.d_head_v = config.d_head, config.v_width
        self.rot, self.kv_rank, self.q_rank = config.rotary_dims, config.kv_rank, config.q_rank
        self.nope = self.d_head - self.rot
        self.interleaved = config.rotary_pairs == "interleaved"
        self.scale = score_scale(config)
        self.softcap, self.qk_norm, self.q_norm, self.k_norm = None, "none", None, None
        self.same: dict[str, str] = {}  # q_proj and k_proj are rotated into q and k: never the same tensor
        d_model, d_q = config.d_model, config.n_heads * config.d_head
        if self.q_rank:
            self._w_dq = nn.Parameter(torch.zeros(self.q_rank, d_model))
            self.q_latent_norm = Norm(config, self.q_rank, rms=True, eps=LATENT_NORM_EPS)
            self._w_uq = nn.Parameter(torch.zeros(d_q, self.q_rank))
        else:
            self._w_q = nn.Parameter(torch.zeros(d_q, d_model))
        self._w_dkv = nn.Parameter(torch.zeros(self.kv_rank + self.rot, d_model))  # W_DKV and W_KR, fused
        self.kv_latent_norm = Norm(config, self.kv_rank, rms=True, eps=LATENT_NORM_EPS)
        self._w_ukv = nn.Parameter(torch.zeros(config.n_heads * (self.nope + self.d_head_v), self.kv_rank))
        self._w_o = nn.Parameter(torch.zeros(d_model, config.n_heads * self.d_head_v))
        self.b_O = nn.Parameter(torch.zeros(d_model)) if config.attn_out_bias else None

    # --- weights: views of the fused storage ---------------------------------------------------------------
    @property
    def W_Q(self) -> Float[Tensor, "head d_model d_head"]:
        if self.q_rank:
            raise ResidError(f"Layer {self.layer}'s queries are read from a normed latent (q_rank={self.q_rank}), "
                             "so they have no single W_Q: use W_DQ, q_latent_norm and W_UQ.")
        return self._w_q.view(self.n_heads, self.d_head, -1).transpose(1, 2)

    @property
    def W_DQ(self) -> Float[Tensor, "d_model q_rank"]:
        return self._w_dq.T

    @property
    def W_UQ(self) -> Float[Tensor, "head q_rank d_head"]:
        return self._w_uq.view(self.n_heads, self.d_head, -1).transpose(1, 2)

    @property
    def W_DKV(self) -> Float[Tensor, "d_model kv_rank"]:
        return self._w_dkv[: self.kv_rank].T

    @property
    def W_KR(self) -> Float[Tensor, "d_model rot"]:
        return self._w_dkv[self.kv_rank :].T

    @property
    def W_UK(self) -> Float[Tensor, "head kv_rank nope"]:
        return self._w_ukv.view(self.n_heads, -1, self.kv_rank)[:, : self.nope].transpose(1, 2)

    @property
    def W_UV(self) -> Float[Tensor, "head kv_rank d_head_v"]:
        return self._w_ukv.view(self.n_heads, -1, self.kv_rank)[:, self.nope :].transpose(1, 2)

    @property
    def W_O(self) -> Float[Tensor, "head d_head_v d_model"]:
        return self._w_o.T.view(self.n_heads, self.d_head_v, -1)

    @property
    def W_K(self) -> Tensor:
        raise ResidError(f"Layer {self.layer}'s keys are read from a normed latent, so they have no single W_K: use "
                         "W_DKV, kv_latent_norm and W_UK (their first dims) and W_KR (the shared rotary key).")

    @property
    def W_V(self) -> Tensor:
        raise ResidError(f"Layer {self.layer}'s values are read from a normed latent, so they have no single W_V: "
                         "use W_DKV, kv_latent_norm and W_UV.")

    b_Q = b_K = b_V = None  # DeepSeek's attention_bias is refused by its loader

    # --- the forward: Attention.forward with these queries, keys and values -----------------------------------
    def _qkv(
        self, normalized: Tensor, ctx: AttnContext, edits: Sequence[Edit], want: frozenset[str],
        projected: dict[str, Tensor],
    ) -> tuple[Tensor, Tensor, Tensor]:
        """q, k [batch pos head d_head] (rotated) and v [batch pos head d_head_v] from the latents."""
        batch, n_pos, _ = normalized.shape
        if self.q_rank:
            q = F.linear(self.q_latent_norm(F.linear(normalized, self._w_dq))[0], self._w_uq)
        else:
            q = F.linear(normalized, self._w_q)
        q = self._kept("q_proj", q.view(batch, n_pos, self.n_heads, self.d_head), edits, want, projected)
        latent, k_rot = F.linear(normalized, self._w_dkv).split((self.kv_rank, self.rot), dim=-1)
        latent, scale = self.kv_latent_norm(latent)
        latent = self._kept("kv_latent", latent, edits, want, projected)
        if "kv_norm_scale" in want:
            projected["kv_norm_scale"] = scale
        kv = F.linear(latent, self._w_ukv).view(batch, n_pos, self.n_heads, self.nope + self.d_head_v)
        k_nope, v = kv.split((self.nope, self.d_head_v), dim=-1)
        k = torch.cat((k_nope, k_rot[:, :, None, :].expand(-1, -1, self.n_heads, -1)), dim=-1)
        k = self._kept("k_proj", k, edits, want, projected)
        cos, sin = ctx.rotary[self.layer_type]
        return self._rotated(q, cos, sin), self._rotated(k, cos, sin), v

    def _kept(self, field: str, x: Tensor, edits: Sequence[Edit], want: frozenset[str],
              projected: dict[str, Tensor]) -> Tensor:
        x = apply_edits(x, edits, field) if edits else x
        if field in want:
            projected[field] = x
        return x

    def _rotated(self, x: Float[Tensor, "batch pos head d_head"], cos: Tensor, sin: Tensor) -> Tensor:
        """x with its last `rot` dims rotated (gathered from DeepSeek's interleaved pairs into halves first)."""
        nope, rot = x[..., : self.nope], x[..., self.nope :]
        if self.interleaved:
            rot = torch.cat((rot[..., 0::2], rot[..., 1::2]), dim=-1)
        return torch.cat((nope, Rotary.apply(rot, cos, sin)), dim=-1)

    # --- frozen: the pattern and the latent's norm scale fixed ------------------------------------------------
    def frozen(
        self,
        normalized: Float[Tensor, "key_pos d_model"],
        pattern: Float[Tensor, "head pos key_pos"],
        constants: bool = True,
        kv_norm_scale: Float[Tensor, "key_pos 1"] | None = None,
    ) -> Float[Tensor, "pos d_model"]:
        """Attention.frozen with the latent's norm scale frozen too (its values are read through that norm)."""
        latent = self.kv_latent_norm.frozen(normalized.float() @ self.W_DKV.float(), self._scale(kv_norm_scale),
                                            constants=False)
        v = torch.einsum("kr,hre->hke", latent, self.W_UV.float())
        out = torch.einsum("hqe,hed->qd", pattern.float() @ v, self.W_O.float())
        return out + self.b_O.float() if constants and self.b_O is not None else out

    def frozen_adjoint(
        self, g: Float[Tensor, "batch pos d_model"], pattern: Float[Tensor, "head pos key_pos"],
        kv_norm_scale: Float[Tensor, "key_pos 1"] | None = None,
    ) -> Float[Tensor, "batch key_pos d_model"]:
        return self.frozen_adjoint_heads(g, pattern, kv_norm_scale).sum(1)

    def frozen_adjoint_heads(
        self, g: Float[Tensor, "batch pos d_model"], pattern: Float[Tensor, "head pos key_pos"],
        kv_norm_scale: Float[Tensor, "key_pos 1"] | None = None,
    ) -> Float[Tensor, "batch head key_pos d_model"]:
        gz = torch.einsum("bqd,hed->bhqe", g.float(), self.W_O.float())
        gv = torch.einsum("hqk,bhqe->bhke", pattern.float(), gz)
        latent = torch.einsum("bhke,hre->bhkr", gv, self.W_UV.float())
        latent = self.kv_latent_norm.pull_back(latent, self._scale(kv_norm_scale))
        return latent @ self.W_DKV.float().T

    def _scale(self, kv_norm_scale: Tensor | None) -> Tensor:
        if kv_norm_scale is None:
            raise ResidError(f"Layer {self.layer}'s frozen latent attention needs the latent's norm scale "
                             f"(Site({self.layer}, 'attn', field='kv_norm_scale')) beside its pattern.")
        return kv_norm_scale.float()

    def frozen_qk(self, *args, **kwargs) -> Tensor:
        raise ResidError(f"Layer {self.layer} is latent attention (DeepSeek): its queries and keys read normed "
                         "latents and one shared rotary key, which QK attribution does not decompose yet. Explain "
                         "the patterns of a model with standard attention, or attribute the graph without QK.")
