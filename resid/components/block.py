"""One Transformer block. Sequential, pre-norm (GPT-2, Llama, ...):

    resid_mid  = resid_pre + attn(ln_attn(resid_pre))
    resid_post = resid_mid + mlp(ln_mlp(resid_mid))

Parallel (GPT-NeoX, GPT-J): both sublayers read resid_pre, and there is no resid_mid:

    resid_post = resid_pre + attn(ln_attn(resid_pre)) + mlp(ln_mlp(resid_pre))

With post-norms each sublayer's output is normed before it is written: Gemma 2/3 keep the pre-norms too
("sandwich"), OLMo 2 has post-norms only (its sublayers read the residual itself):

    resid_mid  = resid_pre + ln_attn_post(attn(ln_attn(resid_pre)))

Post-LN (the original Transformer, BERT) norms the residual itself after each write is added; the sublayers
read it as it is, and resid_mid / resid_post are the normed states the next sublayer reads:

    resid_mid  = ln_attn_resid(resid_pre + attn(resid_pre))
    resid_post = ln_mlp_resid(resid_mid + mlp(resid_mid))

Their scales are recorded (`resid_norm_scale`), so the stream can carry every write through the frozen norms
after it (resid.stream). The write a sublayer adds to the residual (its record's `out`) is always after any
post-norm; whole-write interventions edit that. With the post-norm's scale frozen (`post_norm_scale`) the write is linear in the
sublayer output, so per-head and per-neuron writes still sum to it (analyses.attribution).
"""

from collections.abc import Sequence

from jaxtyping import Float
from torch import Tensor, nn

from resid.components.attention import Attention, AttnContext
from resid.components.mlp import MLP
from resid.components.moe import MoE
from resid.components.norm import Norm
from resid.config import ModelConfig
from resid.interventions import Edit, apply_edits


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.parallel = config.block == "parallel"
        self.ln_attn = Norm(config) if config.pre_norms else None
        self.attn = Attention(config, layer)
        self.ln_attn_post = Norm(config) if config.post_norms else None
        self.ln_mlp = Norm(config) if config.pre_norms else None
        self.mlp = MoE(config, layer) if config.n_experts > 0 else MLP(config, layer)  # Mixtral: experts
        self.ln_mlp_post = Norm(config) if config.post_norms else None
        self.ln_attn_resid = Norm(config) if config.post_ln else None
        self.ln_mlp_resid = Norm(config) if config.post_ln else None

    def forward(
        self,
        resid_pre: Float[Tensor, "batch pos d_model"],
        ctx: AttnContext,
        want_attn: frozenset[str],
        want_mlp: frozenset[str],
        edits_attn: Sequence[Edit] = (),
        edits_mlp: Sequence[Edit] = (),
    ) -> tuple[Float[Tensor, "batch pos d_model"], dict[str, Tensor], dict[str, Tensor]]:
        attn_values: dict[str, Tensor] = {}
        mlp_values: dict[str, Tensor] = {}
        attn_in = _pre(self.ln_attn, resid_pre, attn_values, want_attn)
        attn_raw, found = self.attn(attn_in, ctx, want_attn, edits_attn)
        attn_values.update(found)
        attn_out = _post(self.ln_attn_post, attn_raw, edits_attn, attn_values, want_attn)
        mlp_reads = resid_pre if self.parallel else _resid_norm(self.ln_attn_resid, resid_pre + attn_out, attn_values)
        mlp_in = _pre(self.ln_mlp, mlp_reads, mlp_values, want_mlp)
        mlp_raw, found = self.mlp(mlp_in, want_mlp, edits_mlp)
        mlp_values.update(found)
        mlp_out = _post(self.ln_mlp_post, mlp_raw, edits_mlp, mlp_values, want_mlp)
        resid_post = (resid_pre + attn_out if self.parallel else mlp_reads) + mlp_out
        return _resid_norm(self.ln_mlp_resid, resid_post, mlp_values), attn_values, mlp_values


def _resid_norm(norm: Norm | None, resid: Tensor, values: dict[str, Tensor]) -> Tensor:
    """Post-LN: the norm of the residual after a write, its scale always kept (the stream needs it to be read)."""
    if norm is None:
        return resid
    normalized, values["resid_norm_scale"] = norm(resid)
    return normalized


def _pre(norm: Norm | None, resid: Tensor, values: dict[str, Tensor], want: frozenset[str]) -> Tensor:
    """The sublayer's input: the norm of the residual it reads (or the residual itself, without pre-norms)."""
    if norm is None:
        return resid
    normalized, scale = norm(resid)
    if "normalized" in want:
        values["normalized"] = normalized
    if "norm_scale" in want:
        values["norm_scale"] = scale
    return normalized


def _post(
    norm: Norm | None, raw: Tensor, edits: Sequence[Edit], values: dict[str, Tensor], want: frozenset[str]
) -> Tensor:
    """The write into the residual: the post-norm of the sublayer output (if any), then whole-write edits."""
    out = raw
    if norm is not None:
        out, scale = norm(raw)
        if "post_norm_scale" in want:
            values["post_norm_scale"] = scale
    out = apply_edits(out, edits, "write")
    if "out" in want:
        values["out"] = out
    return out
