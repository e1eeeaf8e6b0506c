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

The frozen block (an attribution graph's local replacement model, resid.analyses.graphs): with the attention
pattern and every norm's scale frozen at a run's values (`frozen_sites()`, keyed by those Sites, one prompt, batch
axis dropped) and the MLP replaced by a given map, the block is affine in resid_pre. `frozen` runs it forward and
`frozen_adjoint` walks a cotangent on resid_post back to resid_pre through the same topology, so the graph never
restates it; `frozen_pre` / `frozen_post` / `frozen_attn` are the pieces, each with its adjoint beside it.
`frozen_adjoint_heads` is frozen_adjoint split into the part that crosses no attention and one part per head of
the block's attention (an attribution graph's edges split by head).
Everything frozen is float32.
"""

import functools
from collections.abc import Callable, Mapping, Sequence

from jaxtyping import Float, Int
from torch import Tensor, nn

from resid.components.attention import Attention, AttnContext
from resid.components.latent import LatentAttention
from resid.components.mlp import MLP
from resid.components.moe import MoE
from resid.components.norm import Norm
from resid.config import ModelConfig
from resid.errors import ResidError
from resid.interventions import Edit, Replace, ZeroAblate, apply_edits, edit_residual
from resid.sites import Site

FrozenValues = Mapping[Site, Tensor]  # one prompt's frozen values: patterns [head pos key_pos], scales [pos 1]


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.parallel = config.block == "parallel"
        self.ln_attn = Norm(config) if config.pre_norms else None
        self.attn = LatentAttention(config, layer) if config.kv_rank else Attention(config, layer)  # DeepSeek: MLA
        self.ln_attn_post = Norm(config) if config.post_norms else None
        self.ln_mlp = Norm(config) if config.pre_norms else None
        self.mlp = MoE(config, layer) if config.has_experts(layer) else MLP(config, layer)  # Mixtral: experts
        self.ln_mlp_post = Norm(config) if config.post_norms else None
        self.ln_attn_resid = Norm(config) if config.post_ln else None
        self.ln_mlp_resid = Norm(config) if config.post_ln else None
        cross = config.cross_attention  # encoder-decoder decoders: a third sublayer between attn and mlp
        self.ln_cross = Norm(config) if cross and config.pre_norms else None
        self.cross = Attention(config, layer, cross=True) if cross else None
        self.ln_cross_post = Norm(config) if cross and config.post_norms else None
        self.ln_cross_resid = Norm(config) if cross and config.post_ln else None
        self.parts = ("attn", "cross", "mlp") if cross else ("attn", "mlp")

    def reads(self, part: str) -> Site:
        """The residual sublayer `part` ("attn" | "cross" | "mlp") reads, a Site of this layer (through its pre-norm,
        where it has one): attention reads resid_pre, cross-attention resid_mid; the MLP reads resid_pre in parallel
        blocks (GPT-NeoX, GPT-J), resid_cross in decoders with cross-attention, resid_mid otherwise."""
        if part == "attn" or (part == "mlp" and self.parallel):
            return Site(self.layer, "resid_pre")
        if part == "cross" and self.cross is not None:
            return Site(self.layer, "resid_mid")
        if part == "mlp":
            return Site(self.layer, "resid_mid" if self.cross is None else "resid_cross")
        raise ResidError(f"Layer {self.layer}'s sublayers are {', '.join(map(repr, self.parts))}, got {part!r}.")

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
        replaced = _replaced(resid, wanted, edited)
        if replaced is not None:
            return replaced
        pre, attention, post = (self.ln_attn, self.attn, self.ln_attn_post) if part == "attn" else (
            self.ln_cross, self.cross, self.ln_cross_post)
        raw, computed = attention(_pre(pre, resid, found, wanted, edited), ctx, wanted, edited)
        found.update(computed)
        return _post(post, raw, edited, found, wanted)

    def _mlp(self, resid: Tensor, want: dict, edits: dict, values: dict) -> Tensor:
        wanted, edited, found = want.get("mlp", frozenset()), edits.get("mlp", ()), values["mlp"]
        replaced = _replaced(resid, wanted, edited)
        if replaced is not None:
            return replaced
        raw, computed = self.mlp(_pre(self.ln_mlp, resid, found, wanted, edited), wanted, edited)
        found.update(computed)
        return _post(self.ln_mlp_post, raw, edited, found, wanted)


    # --- the frozen block ----------------------------------------------------------------------------------------
    def frozen_sites(self) -> tuple[Site, ...]:
        """The Sites of the values `frozen` reads: the attention pattern and every norm's scale this block has."""
        if self.cross is not None:
            raise ResidError(f"Layer {self.layer} has cross-attention, whose values read the encoder's output: the "
                             "frozen block covers decoder-only and encoder stacks (no cross-attention).")
        # the pattern, and what else the attention's value path reads frozen (latent attention: its latent's scale)
        sites = [_site(self.layer, "attn", field) for field in ("pattern", *self.attn.frozen_fields)]
        for part in ("attn", "mlp"):
            pre, post, resid = self._norms(part)
            sites += [_site(self.layer, part, field) for norm, field in (
                (pre, "norm_scale"), (post, "post_norm_scale"), (resid, "resid_norm_scale")) if norm is not None]
        return tuple(sites)

    def frozen_pre(
        self, part: str, resid: Float[Tensor, "*batch d_model"], frozen: FrozenValues, constants: bool = True,
        standardized: bool = False, positions: Int[Tensor, "n"] | None = None,
    ) -> Float[Tensor, "*batch d_model"]:
        """What sublayer `part` ("attn" | "mlp") reads from the residual: its pre-norm with the scale frozen (or
        the norm's standardized form, before gain and bias), or the residual itself without a pre-norm. resid is
        [... pos d_model], or one row per position in `positions` ([n d_model]: e.g. the terms of one position's
        residual, each read with that position's scale)."""
        norm = self._norms(part)[0]
        if norm is None:
            if standardized:
                raise ResidError(f"Layer {self.layer}'s {part} has no pre-norm, so it has no standardized input.")
            return resid.float()
        scale = frozen[_site(self.layer, part, "norm_scale")]
        scale = scale if positions is None else scale[positions]
        return norm.standardized(resid.float(), scale) if standardized else norm.frozen(resid, scale, constants)

    def frozen_pre_adjoint(
        self, part: str, g: Float[Tensor, "*batch d_model"], frozen: FrozenValues,
        positions: Int[Tensor, "n"] | None = None, standardized: bool = False,
    ) -> Float[Tensor, "*batch d_model"]:
        """The adjoint of frozen_pre's linear part: g [... pos d_model] on what the sublayer reads, or one row per
        position in `positions` ([n d_model]: e.g. read-out vectors at the positions of their targets)."""
        norm = self._norms(part)[0]
        if norm is None:
            return g.float()
        scale = frozen[_site(self.layer, part, "norm_scale")]
        scale = scale if positions is None else scale[positions]
        return norm.standardized_adjoint(g, scale) if standardized else norm.pull_back(g, scale)

    def frozen_post(
        self, part: str, out: Float[Tensor, "*batch d_model"], frozen: FrozenValues, constants: bool = True
    ) -> Float[Tensor, "*batch d_model"]:
        """Sublayer `part`'s write from its output: through its post-norm (scale frozen), if it has one."""
        norm = self._norms(part)[1]
        if norm is None:
            return out.float()
        return norm.frozen(out, frozen[_site(self.layer, part, "post_norm_scale")], constants)

    def frozen_post_adjoint(
        self, part: str, g: Float[Tensor, "*batch d_model"], frozen: FrozenValues
    ) -> Float[Tensor, "*batch d_model"]:
        """The adjoint of frozen_post's linear part: from a cotangent on the write to one on the output."""
        norm = self._norms(part)[1]
        if norm is None:
            return g
        return norm.pull_back(g, frozen[_site(self.layer, part, "post_norm_scale")])

    def frozen_attn(
        self, resid: Float[Tensor, "pos d_model"], frozen: FrozenValues, constants: bool = True
    ) -> Float[Tensor, "pos d_model"]:
        """The attention's write from the residual it reads, pattern and norm scales frozen (float32)."""
        normalized = self.frozen_pre("attn", resid, frozen, constants)
        out = self.attn.frozen(normalized, frozen[_site(self.layer, "attn", "pattern")], constants,
                               **self._attn_frozen(frozen))
        return self.frozen_post("attn", out, frozen, constants)

    def frozen_attn_adjoint(
        self, g: Float[Tensor, "batch pos d_model"], frozen: FrozenValues
    ) -> Float[Tensor, "batch pos d_model"]:
        """The cotangents on the residual the attention reads from cotangents g on its write."""
        g = self.frozen_post_adjoint("attn", g, frozen)
        g = self.attn.frozen_adjoint(g, frozen[_site(self.layer, "attn", "pattern")], **self._attn_frozen(frozen))
        return self.frozen_pre_adjoint("attn", g, frozen)

    def frozen_attn_adjoint_heads(
        self, g: Float[Tensor, "batch pos d_model"], frozen: FrozenValues
    ) -> Float[Tensor, "batch head pos d_model"]:
        """frozen_attn_adjoint split by query head (they sum to it): the post-norm's adjoint, head h's adjoint
        (Attention.frozen_adjoint_heads), the pre-norm's adjoint."""
        g = self.frozen_post_adjoint("attn", g, frozen)
        g = self.attn.frozen_adjoint_heads(g, frozen[_site(self.layer, "attn", "pattern")],
                                           **self._attn_frozen(frozen))
        return self.frozen_pre_adjoint("attn", g, frozen)

    def frozen_adjoint_heads(
        self,
        g: Float[Tensor, "batch pos d_model"],
        frozen: FrozenValues,
        mlp_adjoint: Callable[[Tensor, Tensor], Tensor],
    ) -> tuple[Float[Tensor, "batch pos d_model"], Float[Tensor, "batch head pos d_model"]]:
        """frozen_adjoint split by the way the cotangent crosses the block: (the part that crosses no attention,
        through the residual and the MLP's replacement; each head's part through this layer's attention), which
        sum to frozen_adjoint(g, frozen, mlp_adjoint). Sequential: the heads read resid_pre and write into
        resid_mid, which the MLP reads, so what reaches the heads has passed the MLP's replacement; parallel: the
        MLP and the heads both read resid_pre, so the heads take g on resid_post as it is. `mlp_adjoint` as in
        frozen_adjoint (here it is given g_write as g_read in both topologies)."""
        if self.parallel:
            heads = self.frozen_attn_adjoint_heads(g, frozen)  # before mlp_adjoint may add to g in place
            return mlp_adjoint(g, g), heads
        g = self._frozen_resid_adjoint("mlp", g, frozen)
        g_mid = self._frozen_resid_adjoint("attn", mlp_adjoint(g, g), frozen)
        return g_mid, self.frozen_attn_adjoint_heads(g_mid, frozen)

    def frozen(
        self,
        resid_pre: Float[Tensor, "pos d_model"],
        frozen: FrozenValues,
        mlp: Callable[[Tensor], Tensor],
        constants: bool = True,
    ) -> Float[Tensor, "pos d_model"]:
        """resid_post of one prompt (float32), the pattern and norm scales frozen, the MLP sublayer replaced by
        `mlp`: the residual the MLP reads [pos d_model] -> its write (its pre- and post-norms are the replacement's
        to apply, with frozen_pre / frozen_post, or not). `constants` off: the linear part, if `mlp` is linear."""
        attn = self.frozen_attn(resid_pre, frozen, constants)
        if self.parallel:
            return resid_pre + attn + mlp(resid_pre)
        resid_mid = self._frozen_resid("attn", resid_pre + attn, frozen, constants)
        return self._frozen_resid("mlp", resid_mid + mlp(resid_mid), frozen, constants)

    def frozen_adjoint(
        self,
        g: Float[Tensor, "batch pos d_model"],
        frozen: FrozenValues,
        mlp_adjoint: Callable[[Tensor, Tensor], Tensor],
    ) -> Float[Tensor, "batch pos d_model"]:
        """The cotangents on resid_pre from cotangents g on resid_post: the transpose of `frozen`'s linear part.
        `mlp_adjoint(g_write, g_read)`: given the cotangent on the MLP's write and the one the residual it reads
        has from the other paths, that residual's whole cotangent (g_read plus what flows back through the
        replacement). It may add to g_read in place and return it; in a sequential block g_read is g_write itself
        (both are the cotangent on resid_mid + write), so it reads g_write before it adds anything."""
        if self.parallel:
            return mlp_adjoint(g, g + self.frozen_attn_adjoint(g, frozen))
        g = self._frozen_resid_adjoint("mlp", g, frozen)
        g_mid = self._frozen_resid_adjoint("attn", mlp_adjoint(g, g), frozen)
        return g_mid + self.frozen_attn_adjoint(g_mid, frozen)

    def _frozen_resid(self, part: str, resid: Tensor, frozen: FrozenValues, constants: bool) -> Tensor:
        """Post-LN: the norm of the residual after `part`'s write, its scale frozen; else the residual."""
        norm = self._norms(part)[2]
        if norm is None:
            return resid
        return norm.frozen(resid, frozen[_site(self.layer, part, "resid_norm_scale")], constants)

    def _frozen_resid_adjoint(self, part: str, g: Tensor, frozen: FrozenValues) -> Tensor:
        norm = self._norms(part)[2]
        if norm is None:
            return g
        return norm.pull_back(g, frozen[_site(self.layer, part, "resid_norm_scale")])

    def _attn_frozen(self, frozen: FrozenValues) -> dict[str, Tensor]:
        """The attention's frozen values beside its pattern, by field (none for standard attention)."""
        return {field: frozen[_site(self.layer, "attn", field)] for field in self.attn.frozen_fields}

    def _norms(self, part: str) -> tuple[Norm | None, Norm | None, Norm | None]:
        """(pre-norm, post-norm, post-LN residual norm) of sublayer `part`; None where the block has none."""
        if part == "attn":
            return self.ln_attn, self.ln_attn_post, self.ln_attn_resid
        if part == "mlp":
            return self.ln_mlp, self.ln_mlp_post, self.ln_mlp_resid
        raise ResidError(f"The frozen block's sublayers are 'attn' and 'mlp', got {part!r}.")


@functools.cache
def _site(layer: int, part: str, field: str) -> Site:
    """The Site of a frozen value, made once: frozen lookups run per layer in every backward sweep of a graph."""
    return Site(layer, part, field=field)


def _replaced(resid: Tensor, want: frozenset[str], edits: Sequence[Edit]) -> Tensor | None:
    """A sublayer's write where one Replace or ZeroAblate of the whole write at every position is its only edit and
    nothing of it is captured: the write is then known without computing the sublayer (an ablated layer, an edge-
    patched pass's node that reads its reference's input), so it is not computed (its keys and values are then not
    cached either: no later step reads them, since the edit applies to every position). None otherwise."""
    if want or len(edits) != 1:
        return None
    iv, index = edits[0]
    if index is not None or not isinstance(iv, (Replace, ZeroAblate)) or iv.site.what != "out":
        return None
    return iv.edit(resid)


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
    if "norm_scale" in want:
        normalized, values["norm_scale"] = norm(resid)
    else:
        normalized = norm.normalize(resid)
    normalized = apply_edits(normalized, edits, "normalized")
    if "normalized" in want:
        values["normalized"] = normalized
    return normalized


def _post(
    norm: Norm | None, raw: Tensor, edits: Sequence[Edit], values: dict[str, Tensor], want: frozenset[str]
) -> Tensor:
    """The write into the residual: the post-norm of the sublayer output (if any), then whole-write edits."""
    out = raw
    if norm is not None and "post_norm_scale" in want:
        out, values["post_norm_scale"] = norm(raw)
    elif norm is not None:
        out = norm.normalize(raw)
    out = apply_edits(out, edits, "out")
    if "out" in want:
        values["out"] = out
    return out
