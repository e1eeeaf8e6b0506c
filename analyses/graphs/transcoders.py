"""The transcoders that replace a model's MLPs in an attribution graph, behind one interface: per-layer
transcoders (one resid.dictionaries.Dictionary per layer, reading the MLP's input and reconstructing its write)
or one cross-layer transcoder (resid.dictionaries.CrossLayerTranscoder, whose layer-l features write into the MLP
writes of layers l..n-1).

    Transcoders.of(model, transcoders)   checked against the model: every layer replaced exactly once
    .encoder(layer, features)            [n d_in]: what each feature reads (its pre-activation is x . column + b)
    .decoder(source, target, features)   [n d_out]: what each feature of `source` writes into `target`'s MLP write
    .targets(source)                     the layers a source layer's features write into
"""

import torch
from torch import Tensor

from resid.dictionaries import CrossLayerTranscoder, Dictionary, Splice, check
from resid.dictionaries.hooks import HookPoint
from resid.errors import ResidError, param
from resid.sites import Site


class Transcoders:
    def __init__(self, model, items: list[Dictionary] | CrossLayerTranscoder):
        self.model = model
        self.clt = items if isinstance(items, CrossLayerTranscoder) else None
        self.per_layer = None if self.clt is not None else items
        n = model.config.n_layers
        if self.clt is not None:
            self.points_in = list(self.clt.points_in)
            self.points_out = list(self.clt.points_out)
        else:
            self.points_in = [d.point_in for d in items]
            self.points_out = [d.point_out for d in items]
        self.n_layers = n

    @classmethod
    def of(cls, model, transcoders) -> "Transcoders":
        """Check `transcoders` (a CLT, or per-layer transcoders in any order) against `model`; raise a ResidError
        saying what is missing or misplaced."""
        config = model.config
        if config.post_ln or config.cross_attention or model.readout.head is not None:
            raise ResidError(f"{model.name} is not a decoder-only pre-norm model (post-LN blocks, cross-attention or "
                             "an MLM head): attribution graphs are built for decoder-only models.")
        if isinstance(transcoders, (Dictionary, CrossLayerTranscoder)):
            transcoders = transcoders if isinstance(transcoders, CrossLayerTranscoder) else [transcoders]
        elif len(transcoders) == 1 and isinstance(transcoders[0], CrossLayerTranscoder):
            transcoders = transcoders[0]
        if not isinstance(transcoders, CrossLayerTranscoder) and not all(
                isinstance(d, Dictionary) for d in transcoders):
            raise ResidError("transcoders= takes per-layer transcoders (resid.dictionaries.Dictionary, one per layer) "
                             "or one cross-layer transcoder (resid.dictionaries.CrossLayerTranscoder).")
        if isinstance(transcoders, CrossLayerTranscoder):
            clt = transcoders if transcoders.points_in is not None else check(transcoders, model)
            if clt.n_layers != config.n_layers:
                raise ResidError(f"Cross-layer transcoder {clt.name!r} spans {clt.n_layers} layers; {model.name} has "
                                 f"{config.n_layers}.")
            found = cls(model, clt)
        else:
            items = [d if d.point_in is not None else check(d, model) for d in transcoders]
            by_layer: dict[int, Dictionary] = {}
            for d in items:
                layer = _replaced_layer(d.point_out, d.name)
                if layer in by_layer:
                    raise ResidError(f"Two transcoders replace layer {layer}'s MLP ({by_layer[layer].name!r} and "
                                     f"{d.name!r}); pass one per layer.")
                by_layer[layer] = d
            missing = [l for l in range(config.n_layers) if l not in by_layer]
            if missing:
                raise ResidError(f"An attribution graph replaces every MLP, but no transcoder replaces layer(s) "
                                 f"{missing} of {model.name}; pass one transcoder per layer "
                                 f"({param('transcoders', '[...]')}) or a cross-layer transcoder.")
            found = cls(model, [by_layer[l] for l in range(config.n_layers)])
        for layer, (p_in, p_out) in enumerate(zip(found.points_in, found.points_out, strict=True)):
            _check_points(model, layer, p_in, p_out)
        return found

    @property
    def name(self) -> str:
        return self.clt.name if self.clt is not None else ",".join(d.name for d in self.per_layer)

    def splices(self) -> list[Splice]:
        return [Splice(self.clt)] if self.clt is not None else [Splice(d) for d in self.per_layer]

    def read(self, layer: int) -> str:
        """What layer's transcoder reads: "normalized" (the MLP's input norm's output), "standardized" (before the
        norm's gain and bias) or "residual"."""
        point = self.points_in[layer]
        if point.site.what == "normalized":
            return "standardized" if point.standardized else "normalized"
        return "residual"

    def d_sae(self, layer: int) -> int:
        return self.clt.d_sae if self.clt is not None else self.per_layer[layer].d_sae

    def encoder(self, layer: int, features: Tensor) -> Tensor:
        w = self.clt.W_enc[layer] if self.clt is not None else self.per_layer[layer].W_enc
        return w.detach().float()[:, features].T

    def pre_activations(self, layer: int, x: Tensor) -> Tensor:
        """The pre-activations [... feature] of layer's features from the input x [... d_in] (float32)."""
        if self.clt is not None:
            return x.float() @ self.clt.W_enc[layer].detach().float() + self.clt.b_enc[layer].detach().float()
        d = self.per_layer[layer]
        if d.activation == "gated":
            raise ResidError(f"Transcoder {d.name!r} is gated: its firing and its magnitude read different "
                             "directions, so a feature has no single pre-activation to attribute.")
        with torch.no_grad():
            return d.pre_activations(x)

    def decoder(self, source: int, target: int, features: Tensor) -> Tensor:
        if self.clt is not None:
            return self.clt.W_dec[source].detach().float()[features, target - source]
        return self.per_layer[source].W_dec.detach().float()[features]

    def targets(self, source: int) -> range:
        return range(source, self.n_layers) if self.clt is not None else range(source, source + 1)

    def b_dec(self, layer: int) -> Tensor:
        d = self.clt.b_dec[layer] if self.clt is not None else self.per_layer[layer].b_dec
        return d.detach().float()

    def skip(self, layer: int) -> Tensor | None:
        w = (self.clt.W_skip[layer] if self.clt.W_skip is not None else None) if self.clt is not None else \
            self.per_layer[layer].W_skip
        return None if w is None else w.detach().float()

    def record(self, run) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        """From a run with `splices()`: per layer the activations [pos feature], the error [pos d_out] and the
        input [pos d_in] (first prompt)."""
        if self.clt is not None:
            encoded = run.dictionaries[self.clt.name]
            return ([encoded.layer_acts(l)[0].float() for l in range(self.n_layers)],
                    [e[0].float() for e in encoded.error], [x[0].float() for x in encoded.input])
        records = [run.dictionaries[d.name] for d in self.per_layer]
        return [e.acts[0].float() for e in records], [e.error[0].float() for e in records], \
            [e.input[0].float() for e in records]


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
    parallel = model.config.block == "parallel"
    residual = Site(layer, "resid_pre" if parallel else "resid_mid")
    normalized = Site(layer, "mlp", field="normalized")
    ok = site_in.layer == layer and ((site_in.part == "mlp" and site_in.what == "normalized")
                                     or site_in.part == residual.part)
    if not ok or p_in.heads_flat:
        raise ResidError(f"The transcoder of layer {layer} reads {site_in.label}; a transcoder replacing the MLP "
                         f"must read the MLP's input ({normalized.label} or {residual.label}).")
