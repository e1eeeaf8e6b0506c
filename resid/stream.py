"""The ResidualStream: every write into the residual stream of one run, as typed attributes.

The final residual is a sum of writes, `embed + pos_embed + sum_l (attn_l.out + mlp_l.out)`, so resid_pre,
resid_mid, resid_post and final() are derived sums, never stored twice. Each record (resid.records) keeps only
what its Capture asked for; reading anything else raises a ResidError that names the Capture option to set. An
attention's scores and pattern are given on read (resid.records.OnRead): the run keeps their queries and keys, and
the first read forms them, so a capture's memory grows linearly with the prompt until a pattern is read.
Shapes use the axis glossary of resid (see resid/__init__.py); with Capture(positions=...), `pos` is the
captured positions, in the order given, for every prompt (their padded indices are `captured`).

Post-LN models (BERT, the original Transformer) norm the residual after every write, so resid_pre(0) is the
normed embeddings, resid_mid(l) = ln(resid_pre(l) + attn.out) and resid_post(l) = ln(resid_mid(l) + mlp.out):
each is the normed state the next sublayer reads, computed here with the norms' recorded scales (equal to the
forward pass's to float32 rounding). The final state is then no longer a plain sum of writes; with every norm's
scale frozen each norm is affine, so it is again a sum: `components()` carries each write through the frozen
norms after it and adds one component per norm bias (embed_norm_bias, layers[l].attn.resid_norm_bias, ...).
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor

from resid.components.norm import Norm
from resid.config import ModelConfig
from resid.errors import ResidError
from resid.records import AttnRecord, LayerRecord, MLPRecord
from resid.sites import RESID_PARTS, Site

__all__ = ["AttnRecord", "LayerRecord", "MLPRecord", "ResidualStream", "StreamNorms"]

Every = Literal["layer", "sublayer"]  # read the stream after every layer, or after every sublayer
EVERY: tuple[str, ...] = ("layer", "sublayer")


@dataclass(frozen=True)
class StreamNorms:
    """A post-LN model's norms of the residual: after the embeddings (or None) and after each sublayer."""

    embed: Norm | None
    attn: tuple[Norm, ...]
    mlp: tuple[Norm, ...]
    cross: tuple[Norm, ...] | None = None  # decoders of encoder-decoder models


class LayerOutOfRange(ResidError, IndexError):
    """stream.layers[i] past the model's layers: a ResidError saying the range, and an IndexError for code that
    treats the layers as the sequence they are."""


class Layers(tuple):
    """The per-layer records, a tuple whose out-of-range index says the valid range instead of a bare
    "tuple index out of range"."""

    def __getitem__(self, index):
        try:
            return super().__getitem__(index)
        except IndexError:
            n = len(self)
            raise LayerOutOfRange(f"stream.layers[{index}] is out of range: the model has {n} layers, 0..{n - 1} "
                                  f"(or -{n}..-1 from the last).") from None


@dataclass(frozen=True)
class ResidualStream:
    embed_: Tensor | None  # stored under a private name so reading it uncaptured raises (see `embed`)
    pos_embed_: Tensor | None
    layers: tuple[LayerRecord, ...]  # a Layers tuple (see __post_init__)
    final_norm_scale_: Tensor | None
    parallel: bool  # parallel blocks: no resid_mid
    learned_positions: bool
    captured: Tensor | None  # [batch k] padded indices of the Capture(positions=...) kept (None = all)
    type_embed_: Tensor | None = None  # token-type embedding (BERT)
    embed_norm_scale_: Tensor | None = None  # the embedding norm's scale (BERT)
    norms: StreamNorms | None = None  # post-LN models only
    config: ModelConfig | None = None  # the model's: `read` checks a site's indices against it (None: unchecked)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", Layers(self.layers))

    def __repr__(self) -> str:  # shapes, not values: a full capture's tensors print as 15,000 characters
        shape = None if self.embed_ is None else list(self.embed_.shape)
        fields = sorted({name for record in self.layers for part in (record.attn, record.mlp, record.cross)
                         if part is not None for name, value in part._values.items() if value is not None})
        kept = "every position" if self.captured is None else f"positions {list(self.captured.shape)}"
        return (f"ResidualStream({len(self.layers)} layers recorded, embed {shape}, {kept}, fields {fields}; "
                "stream.layers[l] for a layer's records)")

    @property
    def type_embed(self) -> Float[Tensor, "batch pos d_model"] | None:
        """The token-type (segment) embedding write (BERT); None for models without one."""
        if self.type_embed_ is None and self.embed_ is not None:
            return None
        return self._need(self.type_embed_, "type_embed", "resid.Capture(embed=True)")

    @property
    def embed_norm_scale(self) -> Float[Tensor, "batch pos 1"] | None:
        """The scale of the norm of the summed embeddings (BERT); None for models without one."""
        if self.norms is None or self.norms.embed is None:
            return None
        return self._need(self.embed_norm_scale_, "embed_norm_scale", "resid.Capture(embed=True)")

    @property
    def embed(self) -> Float[Tensor, "batch pos d_model"]:
        """The token embedding write (times the model's embed_scale)."""
        return self._need(self.embed_, "embed", "resid.Capture(embed=True)")

    @property
    def pos_embed(self) -> Float[Tensor, "batch pos d_model"] | None:
        """The positional embedding write (learned or sinusoidal); None for rotary models (positions act inside
        attention)."""
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

    def _embedding_writes(self) -> list[tuple[str, Tensor]]:
        writes = [("embed", self.embed), ("pos_embed", self.pos_embed), ("type_embed", self.type_embed)]
        return [(label, write) for label, write in writes if write is not None]

    def _embeddings(self) -> Tensor:
        """resid_pre(0): the embedding writes summed in the forward pass's order, then normed if the model does."""
        writes = self._embedding_writes()
        resid = writes[0][1]
        for _, write in writes[1:]:
            resid = resid + write
        if self.norms is not None and self.norms.embed is not None:
            resid = self.norms.embed(resid, self.embed_norm_scale)[0]
        return resid

    def _add(self, resid: Tensor, record: AttnRecord | MLPRecord, norms: tuple[Norm, ...] | None,
             delta: Tensor | None = None) -> Tensor:
        """The residual after a sublayer's write: plus the write, then (post-LN) its frozen norm, then what an
        intervention on the residual site after it added (`delta`)."""
        resid = resid + record.out
        if norms is not None:
            resid = norms[record.layer](resid, record.resid_norm_scale)[0]
        return resid if delta is None else resid + delta

    def running(self, every: Every = "sublayer") -> Iterator[tuple[Site, Tensor]]:
        """(site, residual) in stream order, each residual the previous one plus the writes between them (one
        addition per write, never re-summed from the embeddings). The sites: layer 0's resid_pre (the
        embeddings); with every="sublayer", each layer's resid_mid (not for parallel blocks, which have none)
        and resid_cross (decoders of encoder-decoder models); each layer's resid_post. A later layer's resid_pre
        is the resid_post before it, and is yielded only where an intervention edited it (then it differs)."""
        if every not in EVERY:
            raise ResidError(f"every must be one of {EVERY}, got {every!r}.")
        sublayer = every == "sublayer"
        resid = self._embeddings()
        norms = self.norms
        attn_norms, mlp_norms = (None, None) if norms is None else (norms.attn, norms.mlp)
        for layer, record in enumerate(self.layers):
            deltas = record.deltas
            if "resid_pre" in deltas:
                resid = resid + deltas["resid_pre"]
            if layer == 0 or "resid_pre" in deltas:
                yield Site(layer, "resid_pre"), resid
            if self.parallel:
                resid = resid + record.attn.out + record.mlp.out
            else:
                resid = self._add(resid, record.attn, attn_norms, deltas.get("resid_mid"))
                if sublayer:
                    yield Site(layer, "resid_mid"), resid
                if record.cross is not None:
                    resid = self._add(resid, record.cross, None if norms is None else norms.cross,
                                      deltas.get("resid_cross"))
                    if sublayer:
                        yield Site(layer, "resid_cross"), resid
                resid = self._add(resid, record.mlp, mlp_norms)
            if "resid_post" in deltas:
                resid = resid + deltas["resid_post"]
            yield Site(layer, "resid_post"), resid

    def accumulated(self, every: Every = "layer") -> tuple[list[Site], Float[Tensor, "site batch pos d_model"]]:
        """The running residual at every site of `running(every)`, stacked, with the sites (Site(0, "resid_pre"),
        Site(3, "resid_mid"), ...; TransformerLens's accumulated_resid, in one pass)."""
        sites, sums = [], []
        for site, resid in self.running(every):
            sites.append(site)
            sums.append(resid)
        return sites, torch.stack(sums)

    def entering(self) -> Iterator[tuple[int, Tensor]]:
        """(layer, resid_pre(layer)) for every layer, in one pass."""
        for site, resid in self.running("layer"):
            if site.part == "resid_pre":
                yield site.layer, resid
            elif site.layer + 1 < len(self.layers) and "resid_pre" not in self.layers[site.layer + 1].deltas:
                yield site.layer + 1, resid

    def read(self, site: Site) -> Tensor:
        """The tensor at `site` (resid.sites; checked against this stream, positions not applied: use
        Run.read for those): the residual [batch pos d_model], an embedding or a write, a field of a sublayer's
        record, indexed by the site's head / key-value head / neuron / expert ([batch pos d_head], [batch pos],
        a head's pattern [batch pos key_pos], ...)."""
        if site.stack is not None:
            raise ResidError(f"{site.label} is a site of an encoder-decoder model's encoder, not of this stream: read "
                             "it from the EncoderDecoder's run (run.read(site)).")
        if self.config is not None:  # layer, head, kv_head, neuron, expert in range, said by the site's label
            ran = len(self.layers)  # fewer than the model's after run(stop_at_layer=...)
            site = site.resolve(self.config, None if ran == self.config.n_layers else ran)
        if site.of_dictionary:
            raise ResidError(f"{site.label} belongs to a learned dictionary, not to the stream: run the model with "
                             "dictionaries=[...] and read it with run.read(site) (or run.dictionaries).")
        if site.is_term:
            raise ResidError(f"{site.label} is a term of an attribution (a constant carried to the logit), not a "
                             "tensor of the run.")
        if site.part == "logits":
            raise ResidError(f"{site.label}: the logits are the run's, not the stream's: read them with "
                             "run.read(site) (or run.logits).")
        if site.part in RESID_PARTS:
            value = {"resid_pre": self.resid_pre, "resid_mid": self.resid_mid, "resid_cross": self.resid_cross,
                     "resid_post": self.resid_post}[site.part](site.layer)
            if value is None:
                raise ResidError(f"{site.label} does not exist in this model (no resid_mid in parallel blocks, no "
                                 "resid_cross without cross-attention).")
            return value
        if site.part in ("embed", "pos_embed", "type_embed"):
            value = getattr(self, site.part)
            if value is None:
                raise ResidError(f"{site.label}: this model has no such embedding write.")
            return value
        if site.part == "layer":
            raise ResidError(f"{site.label} is a whole layer (several writes): read Site(l, 'attn') and "
                             "Site(l, 'mlp').")
        record = getattr(self._layer(site.layer), site.part)
        if record is None:
            raise ResidError(f"{site.label}: this model has no cross-attention.")
        tensor = getattr(record, site.what)
        if site.what in ("pattern", "scores") and site.head is not None:  # [batch head pos key_pos]
            return tensor[:, site.head]
        if site.expert is not None:
            return tensor[:, :, site.expert, site.neuron] if site.neuron is not None else tensor[:, :, site.expert]
        return tensor if site.unit is None else tensor[:, :, site.unit]

    def _site(self, site: Site) -> Tensor:
        """The running residual at `site`, walking only as far as it lies."""
        if site.part == "resid_pre" and site.layer > 0 and "resid_pre" not in self.layers[site.layer].deltas:
            site = Site(site.layer - 1, "resid_post")
        for at, resid in self.running("sublayer"):
            if at == site:
                return resid
        raise ResidError(f"{site.label} is not a site of this stream.")

    def resid_pre(self, layer: int) -> Float[Tensor, "batch pos d_model"]:
        """The residual stream entering `layer` (layer == n_layers: the final residual)."""
        n = len(self.layers)
        if layer == n:
            return self.final()
        return self._site(Site(self._layer(layer).attn.layer, "resid_pre"))

    def resid_mid(self, layer: int) -> Float[Tensor, "batch pos d_model"] | None:
        """Between attention and MLP; None for parallel blocks, where both read resid_pre."""
        if self.parallel:
            return None
        return self._site(Site(self._layer(layer).attn.layer, "resid_mid"))

    def resid_cross(self, layer: int) -> Float[Tensor, "batch pos d_model"] | None:
        """After a decoder's cross-attention, what its MLP reads (encoder-decoder models); None for other models."""
        if self._layer(layer).cross is None:
            return None
        return self._site(Site(self._layer(layer).attn.layer, "resid_cross"))

    def resid_post(self, layer: int) -> Float[Tensor, "batch pos d_model"]:
        return self._site(Site(self._layer(layer).attn.layer, "resid_post"))

    def final(self) -> Float[Tensor, "batch pos d_model"]:
        """The residual stream entering the final norm."""
        return self.resid_post(len(self.layers) - 1)

    def components(self) -> tuple[list[Site], Float[Tensor, "component batch pos d_model"]]:
        """Every write, stacked, with its Site (Site(None, "embed"), Site(3, "attn"), ...; `site.label` prints
        it); they sum to final(). What interventions on residual sites added is a component too, at that site.
        Post-LN models: each write carried through the frozen norms after it, plus each norm's bias carried the
        same way (Site(None, "embed_norm_bias"), Site(3, "attn", field="resid_norm_bias"); float32 arithmetic,
        returned in the model dtype); they sum to final() up to rounding. Per-head and per-neuron contributions
        come from resid.analyses.attribution."""
        pieces = [(Site(None, part), write) for part, write in self._embedding_writes()]
        norms = self.norms
        dtype = pieces[0][1].dtype
        if norms is not None:
            pieces = [(site, write.float()) for site, write in pieces]
            if norms.embed is not None:
                pieces = _through(pieces, norms.embed, self.embed_norm_scale, Site(None, "embed_norm_bias"))
        by_part = None if norms is None else {"attn": norms.attn, "cross": norms.cross, "mlp": norms.mlp}
        after = {"attn": "resid_mid", "cross": "resid_cross", "mlp": None}
        for i, record in enumerate(self.layers):
            deltas = {part: (delta if norms is None else delta.float()) for part, delta in record.deltas.items()}
            if "resid_pre" in deltas:
                pieces.append((Site(i, "resid_pre"), deltas["resid_pre"]))
            for part in _sublayers(record):
                name = part._part
                pieces.append((Site(i, name), part.out if norms is None else part.out.float()))
                if norms is not None:
                    bias = Site(i, name, field="resid_norm_bias")
                    pieces = _through(pieces, by_part[name][i], part.resid_norm_scale, bias)
                if not self.parallel and after[name] in deltas:
                    pieces.append((Site(i, after[name]), deltas[after[name]]))
            if "resid_post" in deltas:
                pieces.append((Site(i, "resid_post"), deltas["resid_post"]))
        return [site for site, _ in pieces], torch.stack([write for _, write in pieces]).to(dtype)


def _sublayers(record: LayerRecord) -> list[AttnRecord | MLPRecord]:
    """A layer's sublayer records in stream order (a decoder's cross-attention between attn and mlp)."""
    return [record.attn, record.mlp] if record.cross is None else [record.attn, record.cross, record.mlp]


def _through(pieces: list[tuple[Site, Tensor]], norm: Norm, scale: Tensor, bias: Site) -> list[tuple[Site, Tensor]]:
    """Every piece carried through a norm with its scale frozen (s * g * centre(x)), and the norm's bias as a
    piece of its own (at `bias`): their sum is the norm of their sum."""
    carried = [(site, norm.frozen(write, scale, constants=False)) for site, write in pieces]
    constant = norm.constant()
    if constant is not None:
        carried.append((bias, constant.expand_as(carried[0][1])))
    return carried
