"""The transcoders that replace a model's MLPs in an attribution graph: the graph's view of the transcoder protocol
(resid.dictionaries.transcoders.MLPTranscoders), which per-layer transcoders and cross-layer transcoders both
answer, so that nothing here asks which kind it holds. The view gives the weights as the graph computes with
them, float32 and detached, rows picked by feature:

    Transcoders.of(model, transcoders)   checked against the model: every layer replaced exactly once
    .encoder(layer, features)            [n d_in]: what each feature reads (its pre-activation is x . column + b)
    .decoder(source, target, features)   [n d_out]: what each feature of `source` writes into `target`'s MLP write
    .targets(source)                     the layers a source layer's features write into
"""

import torch
from torch import Tensor

from resid.dictionaries import Splice
from resid.dictionaries.transcoders import MLPTranscoders, TranscoderSet, replacing_mlps
from resid.errors import ResidError


class Transcoders:
    def __init__(self, model, replacing: MLPTranscoders):
        self.model = model
        self.replacing = replacing
        self.n_layers = replacing.n_layers
        self.points_in = list(replacing.points_in)
        self.points_out = list(replacing.points_out)

    @classmethod
    def of(cls, model, transcoders) -> "Transcoders":
        """Check `transcoders` (a CLT, or per-layer transcoders in any order) against `model`; raise a ResidError
        saying what is missing or misplaced."""
        config = model.config
        if config.post_ln or config.cross_attention or model.readout.head is not None:
            raise ResidError(f"{model.name} is not a decoder-only pre-norm model (post-LN blocks, cross-attention or "
                             "an MLM head): attribution graphs are built for decoder-only models.")
        replacing = replacing_mlps(model, transcoders)
        gated = next((d for d in replacing.dictionaries if d.activation == "gated"), None)
        if gated is not None:
            raise ResidError(f"Transcoder {gated.name!r} is gated: its firing and its magnitude read different "
                             "directions, so a feature has no single pre-activation to attribute.")
        return cls(model, replacing)

    @property
    def name(self) -> str:
        return self.replacing.name

    @property
    def dictionaries(self) -> tuple:
        """The checked dictionaries a run attaches (and a worker is sent)."""
        return tuple(self.replacing.dictionaries)

    @property
    def per_layer(self) -> tuple | None:
        """The per-layer transcoders in layer order (a splice edits their features one dictionary per layer), or
        None where one cross-layer transcoder replaces every MLP: the one question the protocol leaves to this
        view, for the feature edits of graphs.measure and the encoder views of graphs.labels."""
        return self.dictionaries if isinstance(self.replacing, TranscoderSet) else None

    def splices(self) -> list[Splice]:
        return [Splice(d) for d in self.replacing.dictionaries]

    def encoder(self, layer: int, features: Tensor) -> Tensor:
        return self.replacing.encoder(layer).detach().float()[:, features].T

    def pre_activations(self, layer: int, x: Tensor) -> Tensor:
        """The pre-activations [... feature] of layer's features from the input x [... d_in] (float32)."""
        with torch.no_grad():
            return self.replacing.pre_activations(layer, x)

    def decoder(self, source: int, target: int, features: Tensor) -> Tensor:
        return self.replacing.decoder(source, target).detach().float()[features]

    def targets(self, source: int) -> range:
        return self.replacing.targets(source)

    def b_dec(self, layer: int) -> Tensor:
        return self.replacing.decoder_bias(layer).detach().float()

    def skip(self, layer: int) -> Tensor | None:
        w = self.replacing.skip(layer)
        return None if w is None else w.detach().float()

    def record(self, run) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        """From a run with `splices()`: per layer the activations [pos feature], the error [pos d_out] and the
        input [pos d_in] (first prompt)."""
        records = [self.replacing.layer_record(run, layer) for layer in range(self.n_layers)]
        return ([r.acts[0].float() for r in records], [r.error[0].float() for r in records],
                [r.input[0].float() for r in records])
