"""The transcoders that replace every MLP of a model, behind one protocol (`MLPTranscoders`; docs/design.md, "The
transcoder protocol"): per-layer transcoders (`TranscoderSet`, one Dictionary per layer, reading that layer's MLP
input and reconstructing its write) and cross-layer transcoders (resid.dictionaries.CrossLayerTranscoder, whose
layer-l features write into the MLP writes of layers l..n-1) answer the same questions, so that what reads them
(attribution graphs, the replacement evaluation) never asks which kind it holds:

    name, n_layers
    dictionaries                  what a run attaches (model.run(dictionaries=[Splice(d) for d in ...]))
    points_in / points_out        per layer, the HookPoint the layer's features read / the MLP write it rebuilds
    encoder(layer)                [d_in feature]: what layer's features read (pre = x @ encoder + b)
    pre_activations(layer, x)     [... feature] in float32 (x: [... d_in], layer's input)
    decoder(source, target)       [feature d_out]: what source's features write into target's MLP write
    targets(source)               the layers source's features write into (source alone for per-layer ones)
    decoder_bias(target) / skip(target)   target's b_dec [d_out] and skip path W_skip [d_in d_out] (or None)
    layer_record(run, layer)      LayerRecord: layer's activations, reconstruction, error and input in a run

`replacing_mlps(model, transcoders)` takes what a user passes (per-layer transcoders in any order, or one CLT),
checks it against the model (every MLP replaced exactly once, each transcoder reading its MLP's input) and
returns the checked MLPTranscoders.

Axes: `feature` the features of one layer, `d_in` / `d_out` the widths read and written (d_model).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from jaxtyping import Float
from torch import Tensor

from resid.dictionaries.check import ensure
from resid.dictionaries.crosslayer import CrossLayerTranscoder
from resid.dictionaries.dictionary import Dictionary
from resid.dictionaries.encoded import LayerRecord
from resid.dictionaries.hooks import HookPoint
from resid.errors import ResidError, param
from resid.sites import Site


@runtime_checkable
class MLPTranscoders(Protocol):
    """Transcoders replacing every MLP of a model (see the module docstring)."""

    name: str
    n_layers: int
    points_in: tuple[HookPoint, ...]
    points_out: tuple[HookPoint, ...]

    @property
    def dictionaries(self) -> tuple: ...
    def encoder(self, layer: int) -> Tensor: ...
    def pre_activations(self, layer: int, x: Tensor) -> Tensor: ...
    def decoder(self, source: int, target: int) -> Tensor: ...
    def targets(self, source: int) -> range: ...
    def decoder_bias(self, target: int) -> Tensor: ...
    def skip(self, target: int) -> Tensor | None: ...
    def layer_record(self, run, layer: int) -> LayerRecord: ...


@dataclass(frozen=True)
class TranscoderSet:
    """Per-layer transcoders, one per layer in layer order, each checked against the model (point_in / point_out
    set): MLPTranscoders where a source layer writes into itself alone."""

    items: tuple[Dictionary, ...]

    @property
    def name(self) -> str:
        return ",".join(d.name for d in self.items)

    @property
    def n_layers(self) -> int:
        return len(self.items)

    @property
    def dictionaries(self) -> tuple[Dictionary, ...]:
        return self.items

    @property
    def points_in(self) -> tuple[HookPoint, ...]:
        return tuple(d.point_in for d in self.items)

    @property
    def points_out(self) -> tuple[HookPoint, ...]:
        return tuple(d.point_out for d in self.items)

    def encoder(self, layer: int) -> Float[Tensor, "d_in feature"]:
        return self.items[layer].W_enc

    def pre_activations(self, layer: int, x: Float[Tensor, "*batch d_in"]) -> Float[Tensor, "*batch feature"]:
        return self.items[layer].pre_activations(x)

    def decoder(self, source: int, target: int) -> Float[Tensor, "feature d_out"]:
        if target != source:
            raise ResidError(f"Transcoder {self.items[source].name!r} of layer {source} writes into layer {source} "
                             f"alone, not {target}.")
        return self.items[source].W_dec

    def targets(self, source: int) -> range:
        return range(source, source + 1)

    def decoder_bias(self, target: int) -> Float[Tensor, "d_out"]:
        return self.items[target].b_dec

    def skip(self, target: int) -> Float[Tensor, "d_in d_out"] | None:
        return self.items[target].W_skip

    def layer_record(self, run, layer: int) -> LayerRecord:
        found = run.dictionaries[self.items[layer].name]
        return LayerRecord(found.acts, found.reconstruction, found.error, found.input)


def replacing_mlps(model, transcoders) -> MLPTranscoders:
    """`transcoders` (one CLT, or per-layer transcoders in any order: a list or one Dictionary) checked against
    `model` (resid.dictionaries.check) as the MLPTranscoders that replace every MLP; a ResidError says what is
    missing or misplaced."""
    found = _checked(model, _given(transcoders))
    for layer, (p_in, p_out) in enumerate(zip(found.points_in, found.points_out, strict=True)):
        _check_points(model, layer, p_in, p_out)
    return found


def _given(transcoders) -> CrossLayerTranscoder | list[Dictionary]:
    """What the user passed, as one CLT or a list of per-layer transcoders (the one place that tells them apart)."""
    if isinstance(transcoders, CrossLayerTranscoder):
        return transcoders
    if isinstance(transcoders, Dictionary):
        return [transcoders]
    if isinstance(transcoders, Sequence) and len(transcoders) == 1 and isinstance(transcoders[0],
                                                                                  CrossLayerTranscoder):
        return transcoders[0]
    if not isinstance(transcoders, Sequence) or not all(isinstance(d, Dictionary) for d in transcoders):
        raise ResidError("transcoders= takes per-layer transcoders (resid.dictionaries.Dictionary, one per layer) or "
                         "one cross-layer transcoder (resid.dictionaries.CrossLayerTranscoder).")
    return list(transcoders)


def _checked(model, given: CrossLayerTranscoder | list[Dictionary]) -> MLPTranscoders:
    config = model.config
    if isinstance(given, CrossLayerTranscoder):
        return ensure(given, model)  # its layer count is checked there
    by_layer: dict[int, Dictionary] = {}
    for d in (ensure(d, model) for d in given):
        layer = _replaced_layer(d.point_out, d.name)
        if layer in by_layer:
            raise ResidError(f"Two transcoders replace layer {layer}'s MLP ({by_layer[layer].name!r} and {d.name!r}); "
                             "pass one per layer.")
        by_layer[layer] = d
    missing = [l for l in range(config.n_layers) if l not in by_layer]
    if missing:
        raise ResidError(f"An attribution graph replaces every MLP, but no transcoder replaces layer(s) {missing} of "
                         f"{model.name}; pass one transcoder per layer ({param('transcoders', '[...]')}) or a "
                         "cross-layer transcoder.")
    return TranscoderSet(tuple(by_layer[l] for l in range(config.n_layers)))


def _replaced_layer(point: HookPoint, name: str) -> int:
    site = point.site
    if site.part != "mlp" or site.what != "out":
        raise ResidError(f"Dictionary {name!r} reconstructs {site.label}, not an MLP's write: attribution graphs "
                         "replace MLPs with transcoders (hook_mlp_out or mlp.hook_out).")
    return site.layer


def _check_points(model, layer: int, p_in: HookPoint, p_out: HookPoint) -> None:
    site_in, site_out = p_in.site, p_out.site
    if site_out.layer != layer or site_out.part != "mlp" or site_out.what != "out":
        raise ResidError(f"The transcoder of layer {layer} reconstructs {site_out.label}; it must reconstruct "
                         f"{Site(layer, 'mlp').label} (the MLP's write).")
    residual = model.blocks[layer].reads("mlp")
    normalized = Site(layer, "mlp", field="normalized")
    ok = site_in.layer == layer and ((site_in.part == "mlp" and site_in.what == "normalized")
                                     or site_in.part == residual.part)
    if not ok or p_in.heads_flat:
        raise ResidError(f"The transcoder of layer {layer} reads {site_in.label}; a transcoder replacing the MLP "
                         f"must read the MLP's input ({normalized.label} or {residual.label}).")


__all__ = ["LayerRecord", "MLPTranscoders", "TranscoderSet", "replacing_mlps"]
