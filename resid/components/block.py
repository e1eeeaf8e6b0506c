"""One Transformer block. Sequential, pre-norm (GPT-2, Llama, ...):

    resid_mid  = resid_pre + attn(ln_attn(resid_pre))
    resid_post = resid_mid + mlp(ln_mlp(resid_mid))

Parallel (GPT-NeoX, GPT-J): both sublayers read resid_pre, and there is no resid_mid:

    resid_post = resid_pre + attn(ln_attn(resid_pre)) + mlp(ln_mlp(resid_pre))

With post-norms each sublayer's output is normed before it is written: Gemma 2/3 keep the pre-norms too
("sandwich"), OLMo 2 has post-norms only (its sublayers read the residual itself):

    resid_mid  = resid_pre + ln_attn_post(attn(ln_attn(resid_pre)))

Decoders of encoder-decoder models (the original Transformer, Marian) have a third sublayer between the two,
cross-attention (`cross`), whose queries read the stream and whose keys and values read the encoder's final
hidden state; it writes into the stream like self-attention, and resid_cross is the stream after its write.

Post-LN (the original Transformer, BERT) norms the residual itself after each write is added; the sublayers
read it as it is, and resid_mid / resid_post are the normed states the next sublayer reads:

    resid_mid  = ln_attn_resid(resid_pre + attn(resid_pre))
    resid_post = ln_mlp_resid(resid_mid + mlp(resid_mid))

Their scales are recorded (`resid_norm_scale`), so the stream can carry every write through the frozen norms
after it (resid.stream). The write a sublayer adds to the residual (its record's `out`) is always after any
post-norm; whole-write interventions edit that. With the post-norm's scale frozen (`post_norm_scale`) the write
is linear in the
sublayer output, so per-head and per-neuron writes still sum to it (resid.analyses.attribution).
"""

from collections.abc import Sequence

from jaxtyping import Float
from torch import Tensor, nn

from resid.components.attention import Attention, AttnContext
from resid.components.mlp import MLP
from resid.components.moe import MoE
from resid.components.norm import Norm
from resid.config import ModelConfig
from resid.interventions import Edit, apply_edits, edit_residual


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
        cross = config.cross_attention  # encoder-decoder decoders: a third sublayer between attn and mlp
        self.ln_cross = Norm(config) if cross and config.pre_norms else None
        self.cross = Attention(config, layer, cross=True) if cross else None
        self.ln_cross_post = Norm(config) if cross and config.post_norms else None
        self.ln_cross_resid = Norm(config) if cross and config.post_ln else None
        self.parts = ("attn", "cross", "mlp") if cross else ("attn", "mlp")

    def forward(
        self,
        resid_pre: Float[Tensor, "batch pos d_model"],
        ctx: AttnContext,
        want: dict[str, frozenset[str]],
        edits: dict[str, Sequence[Edit]],
        deltas: dict[str, Tensor],
    ) -> tuple[Float[Tensor, "batch pos d_model"], dict[str, dict[str, Tensor]]]:
        """(resid_post before its own edits, each sublayer's captured values). `want` and `edits` are keyed by
        part ("attn", "cross", "mlp", and the residual sites inside the block, "resid_mid" and "resid_cross"); a
        missing key means nothing captured or edited there. What residual edits add is kept in `deltas`."""
        values: dict[str, dict[str, Tensor]] = {part: {} for part in self.parts}
        attn_out = self._attention("attn", resid_pre, ctx, want, edits, values)
        if self.parallel:
            mlp_out = self._mlp(resid_pre, want, edits, values)
            return resid_pre + attn_out + mlp_out, values
        resid = _resid_norm(self.ln_attn_resid, resid_pre + attn_out, values["attn"])
        resid = edit_residual(resid, edits.get("resid_mid", ()), "resid_mid", deltas)
        if self.cross is not None:
            cross_out = self._attention("cross", resid, ctx, want, edits, values)
            resid = _resid_norm(self.ln_cross_resid, resid + cross_out, values["cross"])
            resid = edit_residual(resid, edits.get("resid_cross", ()), "resid_cross", deltas)
        resid = resid + self._mlp(resid, want, edits, values)
        return _resid_norm(self.ln_mlp_resid, resid, values["mlp"]), values

    def _attention(self, part: str, resid: Tensor, ctx: AttnContext, want: dict, edits: dict, values: dict) -> Tensor:
        """The write of the self- ("attn") or cross-attention ("cross") sublayer reading `resid`."""
        wanted, edited, found = want.get(part, frozenset()), edits.get(part, ()), values[part]
        pre, attention, post = (self.ln_attn, self.attn, self.ln_attn_post) if part == "attn" else (
            self.ln_cross, self.cross, self.ln_cross_post)
        raw, computed = attention(_pre(pre, resid, found, wanted, edited), ctx, wanted, edited)
        found.update(computed)
        return _post(post, raw, edited, found, wanted)

    def _mlp(self, resid: Tensor, want: dict, edits: dict, values: dict) -> Tensor:
        wanted, edited, found = want.get("mlp", frozenset()), edits.get("mlp", ()), values["mlp"]
        raw, computed = self.mlp(_pre(self.ln_mlp, resid, found, wanted, edited), wanted, edited)
        found.update(computed)
        return _post(self.ln_mlp_post, raw, edited, found, wanted)


def _resid_norm(norm: Norm | None, resid: Tensor, values: dict[str, Tensor]) -> Tensor:
    """Post-LN: the norm of the residual after a write, its scale always kept (the stream needs it to be read)."""
    if norm is None:
        return resid
    normalized, values["resid_norm_scale"] = norm(resid)
    return normalized


def _pre(norm: Norm | None, resid: Tensor, values: dict[str, Tensor], want: frozenset[str],
         edits: Sequence[Edit]) -> Tensor:
    """The sublayer's input: the norm of the residual it reads (or the residual itself, without pre-norms), after
    the edits of its `normalized` field (what a dictionary reading the sublayer's input splices)."""
    if norm is None:
        return resid
    normalized, scale = norm(resid)
    normalized = apply_edits(normalized, edits, "normalized")
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
    out = apply_edits(out, edits, "out")
    if "out" in want:
        values["out"] = out
    return out
