"""The local replacement model of one prompt's run, as linear maps: every attention pattern and every norm's scale
frozen at the run's values, each MLP replaced by its transcoder (resid.analyses.graphs.transcoders), so the
residual stream is an affine function of the node writes (token embeddings, feature writes, error terms).

Notation for layer l (R: the residual, s: a frozen norm scale; norms with a frozen scale are affine, see
resid.components.norm):

    attention    a(R)  = post_attn( sum_h P_h (pre_attn(R) W_V[h] + b_V) W_O[h] + b_O )
    MLP input    x(R)  = pre_mlp(R), or its standardized form, or R itself (what the transcoder reads)
    MLP write    w(y)  = post_mlp(y), or y (y: the transcoder's output space: features, b_dec, skip, error)
    sequential   R_mid = R_pre + a(R_pre);   R_post = R_mid + w(y(x(R_mid)))
    parallel     R_post = R_pre + a(R_pre) + w(y(x(R_pre)))

`forward_*` apply these maps (constants included, or not), `*_adjoint` their linear parts' adjoints: a cotangent g
on a map's output becomes the cotangent on its input, [batch pos d] for a batch of targets at once. Nothing here
depends on the transcoder's non-linearity: features are sources with fixed writes, errors too; only a skip path
(x @ W_skip) is a linear map inside the MLP and carries gradient. Everything is float32.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from resid.components.norm import Norm


@dataclass
class Frozen:
    """The frozen state of one prompt's run (batch axis dropped)."""

    model: object
    patterns: list[Tensor]  # per layer [head q k]
    scales: dict[tuple[int, str], Tensor]  # (layer, "attn" | "attn_post" | "mlp" | "mlp_post") -> [pos 1]
    final_scale: Tensor  # [pos 1]
    reads: list[str]  # per layer: "normalized", "standardized" or "residual" (what the transcoder's input is)
    before_post_norm: list[bool]  # per layer: the transcoder's output is the MLP output before its post-norm
    skips: list[Tensor | None]  # per layer W_skip [d_in d_out], or None

    @property
    def parallel(self) -> bool:
        return self.model.config.block == "parallel"

    @property
    def n_layers(self) -> int:
        return len(self.patterns)

    # --- attention ------------------------------------------------------------------------------------------
    def attn_forward(self, layer: int, resid: Tensor, constants: bool = True) -> Tensor:
        """a(R) [pos d] for the residual [pos d] the attention reads (its constants left out if not `constants`)."""
        block = self.model.blocks[layer]
        attn = block.attn
        x = _norm(block.ln_attn, resid, self.scales.get((layer, "attn")), constants)
        v = torch.einsum("kd,gde->gke", x, attn.W_V.float())
        if constants and attn.b_V is not None:
            v = v + attn.b_V.float()[:, None, :]
        v = v.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=0)  # [head k e]
        z = self.patterns[layer] @ v  # [head q e]
        out = torch.einsum("hqe,hed->qd", z, attn.W_O.float())
        if constants and attn.b_O is not None:
            out = out + attn.b_O.float()
        return _norm(block.ln_attn_post, out, self.scales.get((layer, "attn_post")), constants)

    def attn_adjoint(self, layer: int, g: Tensor) -> Tensor:
        """The cotangent on the residual the attention reads, from g [batch pos d] on its write."""
        block = self.model.blocks[layer]
        attn = block.attn
        g = _pull(block.ln_attn_post, g, self.scales.get((layer, "attn_post")))
        gz = torch.einsum("bqd,hed->bhqe", g, attn.W_O.float())
        gv = torch.einsum("hqk,bhqe->bhke", self.patterns[layer], gz)
        batch, heads, keys, d_head = gv.shape
        gv = gv.view(batch, attn.n_kv_heads, heads // attn.n_kv_heads, keys, d_head).sum(2)
        gx = torch.einsum("bgke,gde->bkd", gv, attn.W_V.float())
        return _pull(block.ln_attn, gx, self.scales.get((layer, "attn")))

    # --- the MLP's replacement: input and write ------------------------------------------------------------
    def input_forward(self, layer: int, resid: Tensor, constants: bool = True) -> Tensor:
        """x(R): the transcoder's input [pos d_in] from the residual the MLP reads."""
        read = self.reads[layer]
        if read == "residual":
            return resid.float()
        norm, scale = self.model.blocks[layer].ln_mlp, self.scales[(layer, "mlp")]
        if read == "standardized":
            return _centre(norm, resid.float()) * scale
        return _norm(norm, resid, scale, constants)

    def input_adjoint(self, layer: int, w: Tensor, scale: Tensor | None = None) -> Tensor:
        """The cotangent on the residual the MLP reads from w on the transcoder's input ([... pos d_in] with the
        layer's scales, or any leading shape with `scale` [... 1] given: e.g. one vector per target)."""
        read = self.reads[layer]
        if read == "residual":
            return w.float()
        norm = self.model.blocks[layer].ln_mlp
        scale = self.scales[(layer, "mlp")] if scale is None else scale
        if read == "standardized":
            return _centre(norm, w.float()) * scale
        return norm.fold(w) * scale

    def write_forward(self, layer: int, y: Tensor, constants: bool = True) -> Tensor:
        """w(y): what the transcoder's output y [pos d_out] writes into the residual."""
        if not self.before_post_norm[layer]:
            return y.float()
        return _norm(self.model.blocks[layer].ln_mlp_post, y, self.scales[(layer, "mlp_post")], constants)

    def write_adjoint(self, layer: int, g: Tensor) -> Tensor:
        """The cotangent on the transcoder's output space from g [batch pos d] on the residual after the write."""
        if not self.before_post_norm[layer]:
            return g
        return self.model.blocks[layer].ln_mlp_post.fold(g) * self.scales[(layer, "mlp_post")]

    def skip_adjoint(self, layer: int, g_out: Tensor) -> Tensor | None:
        """The cotangent the skip path carries back to the residual the MLP reads (None without one)."""
        skip = self.skips[layer]
        if skip is None:
            return None
        return self.input_adjoint(layer, g_out @ skip.float().T)

    # --- the final norm -------------------------------------------------------------------------------------
    def final_adjoint(self, u: Tensor, positions: Tensor) -> Tensor:
        """The cotangents on the final residual of reading u [n d] after the final norm at `positions` [n]."""
        norm = self.model.readout.norm
        return u.float() if norm is None else norm.fold(u) * self.final_scale[positions]

    def final_forward(self, resid: Tensor, constants: bool = True) -> Tensor:
        """The final norm's output [pos d] (what the unembedding reads)."""
        return _norm(self.model.readout.norm, resid, self.final_scale, constants)


def _norm(norm: Norm | None, x: Tensor, scale: Tensor | None, constants: bool) -> Tensor:
    """A norm with its scale frozen (its bias only with `constants`); the identity where there is no norm."""
    if norm is None:
        return x.float()
    out = norm.linear(x) * scale.float()
    return out + norm.b.float() if constants and norm.b is not None else out


def _pull(norm: Norm | None, g: Tensor, scale: Tensor | None) -> Tensor:
    return g if norm is None else norm.fold(g) * scale


def _centre(norm: Norm, x: Tensor) -> Tensor:
    return x - x.mean(-1, keepdim=True) if norm.centre else x
