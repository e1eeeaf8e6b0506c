"""The ResidualStream: every write into the residual stream of one run, as typed attributes.

The final residual is a sum of writes, `embed + pos_embed + sum_l (attn_l.out + mlp_l.out)`, so resid_pre,
resid_mid, resid_post and final() are derived sums, never stored twice. Each record keeps only what its
Capture asked for; reading anything else raises a ResidError that names the Capture option to set.
Shapes use the axis glossary of resid.types; with Capture(positions=...), `pos` is the captured positions.
"""

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from resid.errors import ResidError


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
        """The sublayer's write into the residual stream (sum over heads of z @ W_O, plus b_O)."""
        return self._get("out")


class MLPRecord(_Record):
    _part = "mlp"

    @property
    def pre(self) -> Float[Tensor, "batch pos d_mlp"]:
        """Key scores: normalized @ W_in + b_in (for gated MLPs, the linear 'up' branch)."""
        return self._get("pre")

    @property
    def gate(self) -> Float[Tensor, "batch pos d_mlp"]:
        """Gated MLPs only: normalized @ W_gate + b_gate, before the activation."""
        return self._get("gate")

    @property
    def post(self) -> Float[Tensor, "batch pos d_mlp"]:
        """Memory coefficients m_i: act(pre), or act(gate) * pre; neuron i writes post[i] * W_out[i]."""
        return self._get("post")

    @property
    def out(self) -> Float[Tensor, "batch pos d_model"]:
        """The sublayer's write: post @ W_out + b_out."""
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
    positions: tuple[int, ...] | None  # captured padded-sequence positions (None = all)

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

    def resid_pre(self, layer: int) -> Float[Tensor, "batch pos d_model"]:
        """The residual stream entering `layer`: embeddings plus every earlier sublayer's write."""
        n = len(self.layers)
        if layer == n:
            return self.final()
        layer = self._layer(layer).attn.layer
        total = self._embeddings()
        for record in self.layers[:layer]:
            total = total + record.attn.out + record.mlp.out
        return total

    def resid_mid(self, layer: int) -> Float[Tensor, "batch pos d_model"] | None:
        """Between attention and MLP; None for parallel blocks, where both read resid_pre."""
        if self.parallel:
            return None
        return self.resid_pre(layer) + self._layer(layer).attn.out

    def resid_post(self, layer: int) -> Float[Tensor, "batch pos d_model"]:
        record = self._layer(layer)
        return self.resid_pre(layer) + record.attn.out + record.mlp.out

    def final(self) -> Float[Tensor, "batch pos d_model"]:
        """The residual stream entering the final norm."""
        return self.resid_post(len(self.layers) - 1)

    def components(self, level: str = "sublayer") -> tuple[list[str], Float[Tensor, "component batch pos d_model"]]:
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
