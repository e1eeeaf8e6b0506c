"""The ResidualStream: every write into the residual stream of one run, as typed attributes.

The final residual is a sum of writes, `embed + pos_embed + sum_l (attn_l.out + mlp_l.out)`, so resid_pre,
resid_mid, resid_post and final() are derived sums, never stored twice. Each record keeps only what its
Capture asked for; reading anything else raises a ResidError that names the Capture option to set.
Shapes use the axis glossary of resid (see resid/__init__.py); with Capture(positions=...), `pos` is the
captured positions, in the order given, for every prompt (their padded indices are `captured`).
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor

from resid.errors import ResidError

Level = Literal["layer", "sublayer"]  # read the stream after every layer, or after every sublayer
LEVELS: tuple[str, ...] = ("layer", "sublayer")
SiteName = Literal["resid_pre", "resid_mid", "resid_post"]


class _Record:
    """Captured tensors of one sublayer; missing ones raise an error saying how to capture them."""

    _part = ""

    def __init__(self, layer: int, values: dict[str, Tensor], absent: dict[str, str] | None = None):
        self.layer = layer
        self._values = values
        self._absent = absent or {}  # field -> why the model has no such tensor (e.g. not a gated MLP)

    def _get(self, name: str) -> Tensor:
        value = self._values.get(name)
        if value is not None:
            return value
        if name in self._absent:
            raise ResidError(f"layers[{self.layer}].{self._part}.{name} does not exist: {self._absent[name]}.")
        raise ResidError(
            f"layers[{self.layer}].{self._part}.{name} was not captured. Run with "
            f"resid.Capture({self._part}={{'{name}', ...}}) (and layer {self.layer} in Capture.layers), "
            "or resid.Capture.all()."
        )

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}{list(v.shape)}" for k, v in self._values.items() if v is not None)
        return f"{type(self).__name__}(layer={self.layer}, {fields})"


    @property
    def normalized(self) -> Float[Tensor, "batch pos d_model"]:
        """The sublayer's input after its norm (gain and bias applied). Attention reads resid_pre; the MLP
        reads resid_mid (resid_pre in parallel blocks)."""
        return self._get("normalized")

    @property
    def norm_scale(self) -> Float[Tensor, "batch pos 1"]:
        """The sublayer norm's 1/sigma (LayerNorm) or 1/rms (RMSNorm) of the residual it reads."""
        return self._get("norm_scale")

    @property
    def post_norm_scale(self) -> Float[Tensor, "batch pos 1"]:
        """Models with post-norms (Gemma 2/3, OLMo 2): the scale of the norm applied to the sublayer's output
        before it is written. Frozen, it makes the write linear in the output (per-head, per-neuron writes)."""
        return self._get("post_norm_scale")


class AttnRecord(_Record):
    _part = "attn"

    @property
    def q(self) -> Float[Tensor, "batch pos head d_head"]:
        """Queries as used in the scores (after the rotary embedding, if any)."""
        return self._get("q")

    @property
    def k(self) -> Float[Tensor, "batch pos kv_head d_head"]:
        """Keys as used in the scores (after rotary); kv_head < head under grouped-query attention."""
        return self._get("k")

    @property
    def v(self) -> Float[Tensor, "batch pos kv_head d_head"]:
        return self._get("v")

    @property
    def pattern(self) -> Float[Tensor, "batch head pos key_pos"]:
        """Attention probabilities (each row sums to 1 over key_pos)."""
        return self._get("pattern")

    @property
    def z(self) -> Float[Tensor, "batch pos head d_head"]:
        """Per-head mix of values; head h writes z[..., h, :] @ W_O[h]."""
        return self._get("z")

    @property
    def out(self) -> Float[Tensor, "batch pos d_model"]:
        """The sublayer's write into the residual stream (sum over heads of z @ W_O, plus b_O; through the
        post-norm in models that have one)."""
        return self._get("out")


class MLPRecord(_Record):
    """A dense MLP's record, or a mixture of experts' (Mixtral, resid.components.moe): `post` then has an
    expert axis, and router_logits, expert_weights and expert_out exist (pre and gate do not)."""

    _part = "mlp"

    @property
    def pre(self) -> Float[Tensor, "batch pos d_mlp"]:
        """Key scores: normalized @ W_in + b_in. For gated MLPs this is the linear 'up' branch, which the gate
        multiplies; TransformerLens's hook_pre is the gate's input instead (resid's `gate`)."""
        return self._get("pre")

    @property
    def gate(self) -> Float[Tensor, "batch pos d_mlp"]:
        """Gated MLPs only: normalized @ W_gate + b_gate, before the activation."""
        return self._get("gate")

    @property
    def post(self) -> Float[Tensor, "batch pos d_mlp"] | Float[Tensor, "batch pos expert d_mlp"]:
        """Memory coefficients m_i: act(pre), or act(gate) * pre; neuron i writes post[i] * W_out[i]. Mixture
        of experts: [batch pos expert d_mlp], each expert's act(x W_gate[e]) * (x W_in[e]), zero for experts
        the token was not routed to; neuron i of expert e writes expert_weights[e] * post[e, i] * W_out[e, i]."""
        return self._get("post")

    @property
    def router_logits(self) -> Float[Tensor, "batch pos expert"]:
        """Mixture of experts only: normalized @ W_router, before the softmax over experts."""
        return self._get("router_logits")

    @property
    def expert_weights(self) -> Float[Tensor, "batch pos expert"]:
        """Mixture of experts only: the top-k router probabilities renormalized to sum to 1, zero for the experts
        the token was not routed to (in the model dtype)."""
        return self._get("expert_weights")

    @property
    def expert_out(self) -> Float[Tensor, "batch pos expert d_model"]:
        """Mixture of experts only: each expert's weighted write, expert_weights[e] * post[e] @ W_out[e] (zero
        where not routed). They sum to `out`; with post-norms, to the output before the post-norm."""
        return self._get("expert_out")

    @property
    def out(self) -> Float[Tensor, "batch pos d_model"]:
        """The sublayer's write: post @ W_out + b_out, or the sum of expert_out (through the post-norm in
        models that have one)."""
        return self._get("out")


@dataclass(frozen=True)
class LayerRecord:
    attn: AttnRecord
    mlp: MLPRecord


@dataclass(frozen=True)
class ResidualStream:
    embed_: Tensor | None  # stored under a private name so reading it uncaptured raises (see `embed`)
    pos_embed_: Tensor | None
    layers: tuple[LayerRecord, ...]
    final_norm_scale_: Tensor | None
    parallel: bool  # parallel blocks: no resid_mid
    learned_positions: bool
    captured: Tensor | None  # [batch k] padded indices of the Capture(positions=...) kept (None = all)

    @property
    def embed(self) -> Float[Tensor, "batch pos d_model"]:
        """The token embedding write (times the model's embed_scale)."""
        return self._need(self.embed_, "embed", "resid.Capture(embed=True)")

    @property
    def pos_embed(self) -> Float[Tensor, "batch pos d_model"] | None:
        """The learned positional embedding write; None for rotary models (positions act inside attention)."""
        if not self.learned_positions:
            return None
        return self._need(self.pos_embed_, "pos_embed", "resid.Capture(embed=True)")

    @property
    def final_norm_scale(self) -> Float[Tensor, "batch pos 1"]:
        """The final norm's 1/sigma (or 1/rms) of final(): freeze it to make the logits linear in the writes."""
        return self._need(self.final_norm_scale_, "final_norm_scale", "resid.Capture(final_norm_scale=True)")

    @staticmethod
    def _need(value: Tensor | None, name: str, option: str) -> Tensor:
        if value is None:
            raise ResidError(f"stream.{name} was not captured. Run with {option}, or resid.Capture.all().")
        return value

    def _layer(self, layer: int) -> LayerRecord:
        n = len(self.layers)
        if not -n <= layer < n:
            raise ResidError(f"Layer {layer} is out of range: the model has {n} layers (0..{n - 1}).")
        return self.layers[layer % n]

    def _embeddings(self) -> Tensor:
        pos = self.pos_embed
        return self.embed if pos is None else self.embed + pos

    def running(self, level: Level = "sublayer") -> Iterator[tuple[int, SiteName, Tensor]]:
        """(layer, site, residual) in stream order, each residual the previous one plus the writes between
        them (one addition per write, never re-summed from the embeddings). The sites: resid_pre of layer 0
        (the embeddings); with level="sublayer", each layer's resid_mid (not for parallel blocks, which have
        none); each layer's resid_post. resid_pre(l) of a later layer is resid_post(l - 1)."""
        if level not in LEVELS:
            raise ResidError(f"level must be one of {LEVELS}, got {level!r}.")
        resid = self._embeddings()
        yield 0, "resid_pre", resid
        for layer, record in enumerate(self.layers):
            if level == "sublayer" and not self.parallel:
                resid = resid + record.attn.out
                yield layer, "resid_mid", resid
                resid = resid + record.mlp.out
            else:
                resid = resid + record.attn.out + record.mlp.out
            yield layer, "resid_post", resid

    def accumulated(self, level: Level = "layer") -> tuple[list[str], Float[Tensor, "site batch pos d_model"]]:
        """The running residual at every site of `running(level)`, stacked, with labels like "resid_pre 0",
        "resid_mid 3" (TransformerLens's accumulated_resid, computed in one pass)."""
        labels, sums = [], []
        for layer, site, resid in self.running(level):
            labels.append(f"{site} {layer}")
            sums.append(resid)
        return labels, torch.stack(sums)

    def _site(self, layer: int, site: SiteName) -> Tensor:
        """The running residual at (layer, site), walking only as far as it lies."""
        for at_layer, at_site, resid in self.running("sublayer"):
            if (at_layer, at_site) == (layer, site):
                return resid
        raise AssertionError(f"no site {site} at layer {layer}")  # unreachable for checked arguments

    def resid_pre(self, layer: int) -> Float[Tensor, "batch pos d_model"]:
        """The residual stream entering `layer` (layer == n_layers: the final residual)."""
        n = len(self.layers)
        if layer == n:
            return self.final()
        layer = self._layer(layer).attn.layer
        return self._site(0, "resid_pre") if layer == 0 else self._site(layer - 1, "resid_post")

    def resid_mid(self, layer: int) -> Float[Tensor, "batch pos d_model"] | None:
        """Between attention and MLP; None for parallel blocks, where both read resid_pre."""
        if self.parallel:
            return None
        return self._site(self._layer(layer).attn.layer, "resid_mid")

    def resid_post(self, layer: int) -> Float[Tensor, "batch pos d_model"]:
        return self._site(self._layer(layer).attn.layer, "resid_post")

    def final(self) -> Float[Tensor, "batch pos d_model"]:
        """The residual stream entering the final norm."""
        return self.resid_post(len(self.layers) - 1)

    def components(self, level: Literal["sublayer", "head", "neuron"] = "sublayer") -> tuple[list[str], Float[Tensor, "component batch pos d_model"]]:
        """Every write, stacked; they sum to final(). Labels are the attribute paths of the writes."""
        if level != "sublayer":
            raise ResidError(
                f"components(level={level!r}) is not available on the stream: it holds sublayer writes. "
                "Use level='sublayer'; per-head and per-neuron contributions come from analyses.attribution."
            )
        labels, writes = ["embed"], [self.embed]
        if self.pos_embed is not None:
            labels.append("pos_embed")
            writes.append(self.pos_embed)
        for i, record in enumerate(self.layers):
            labels += [f"layers[{i}].attn.out", f"layers[{i}].mlp.out"]
            writes += [record.attn.out, record.mlp.out]
        return labels, torch.stack(writes)
