"""Lenses: small classes over the model's one readout (resid.readout: final norm + unembedding), as in tuned-lens's
`nn/lenses.py`, never a string threaded through the analyses.

    LogitLens(model)                the residual at a site read as if it were the final one (nostalgebraist 2020)
    TunedLens(model, translators)   the residual first carried through the site's affine translator (Belrose et
                                    al. 2023; resid.analyses.lenses.translators): readout(T_s(h))

Both give `logits(resid, layer, site, scale)` (scale: the final norm's, frozen from the run, or None to recompute
it) and `direction(d, layer, site)`, which pulls a read-out of the translated residual back onto the residual at
the site. A translator is affine, so with the final norm's scale frozen the tuned lens's logit of a token is still
a linear read-out of the writes up to the site plus one constant:

    logit = T(h) . v + c = h . (v + v @ A) + (b . v + c)        h = the sum of the writes before the site

so every write's contribution is `write . (v + v @ A)` and the translator's bias adds `b . v` as a component of its
own; the sum is exact (tests/analyses/test_tuned_lens.py). At the final site both lenses are the model itself, so
resid.analyses.attribution.direct, which decomposes the final prediction, is the same for either lens.
"""

import torch
from jaxtyping import Float
from torch import Tensor

from resid.analyses.lenses.translators import Translators, site_text
from resid.errors import ResidError
from resid.model import Transformer
from resid.readout import Direction


class Lens:
    """What the lens analyses need of a lens; `name` goes into their tables ("logit", "tuned")."""

    name = "lens"

    def __init__(self, model: Transformer):
        if not isinstance(model, Transformer):
            raise ResidError(f"A lens reads a resid.Transformer's stream, got {type(model).__name__}; "
                             "encoder-decoder models: build the lens on model.decoder.")
        model.readout.unembed  # noqa: B018 -- raises for embedding models, which have no token logits to lens
        self.model = model

    def translate(
        self, resid: Float[Tensor, "*batch d_model"], layer: int, site: str
    ) -> Float[Tensor, "*batch d_model"]:
        """The residual at (layer, site) as the lens hands it to the readout."""
        raise NotImplementedError

    def logits(
        self,
        resid: Float[Tensor, "*batch d_model"],
        layer: int,
        site: str,
        scale: Float[Tensor, "*batch 1"] | None = None,
    ) -> Float[Tensor, "*batch d_vocab"]:
        """The lens's logits of residuals at (layer, site): the final norm (its scale recomputed, or `scale`
        frozen) and the unembedding applied to `translate(resid, layer, site)`."""
        return self.model.readout.logits(self.translate(resid, layer, site), scale)

    def direction(self, direction: Direction, layer: int, site: str) -> tuple[Direction, Float[Tensor, "batch"]]:
        """A read-out of the translated residual as a read-out of the residual at the site: (the direction, the
        value the translator's bias adds, [batch])."""
        raise NotImplementedError

    def check(self, model: Transformer, level: str) -> None:
        """Raises unless this lens reads `model`'s stream at every site of `level`."""
        if model is not self.model:
            raise ResidError(f"This {self.name} lens was made for the model {self.model.name!r}, not for the "
                             f"model {model.name!r} given: make the lens from the model you analyse.")

    def is_final(self, layer: int, site: str) -> bool:
        return (layer, site) == (self.model.config.n_layers - 1, "resid_post")


class LogitLens(Lens):
    """The logit lens: every residual read through the final norm and unembedding as it is."""

    name = "logit"

    def translate(
        self, resid: Float[Tensor, "*batch d_model"], layer: int, site: str
    ) -> Float[Tensor, "*batch d_model"]:
        return resid

    def direction(self, direction: Direction, layer: int, site: str) -> tuple[Direction, Float[Tensor, "batch"]]:
        return direction, torch.zeros_like(direction.bias)


class TunedLens(Lens):
    """The tuned lens: the residual at each site carried through that site's translator, then read out. The
    final site has no translator (the lens there is the model)."""

    name = "tuned"

    def __init__(self, model: Transformer, translators: Translators):
        super().__init__(model)
        config = model.config
        if translators.d_model != config.d_model:
            raise ResidError(f"These translators are {translators.d_model} wide but {model.name} has d_model="
                             f"{config.d_model}: they were trained for another model.")
        bad = [site_text(s) for s in translators.sites if not self._in_stream(*s) or self.is_final(*s)]
        if bad:
            raise ResidError(f"The translators have sites {bad} that {model.name}'s stream ({config.n_layers} layers, "
                             f"{config.block} blocks) does not have before its final residual: they were trained "
                             "for another model.")
        self.translators = translators.to(model.device)

    def _in_stream(self, layer: int, site: str) -> bool:
        config = self.model.config
        if not 0 <= layer < config.n_layers:
            return False
        if site == "resid_pre":
            return layer == 0  # resid_pre of a later layer is the resid_post of the one before
        if site == "resid_mid":
            return config.block != "parallel"
        return site == "resid_post" or (site == "resid_cross" and config.cross_attention)

    def _index(self, layer: int, site: str) -> int | None:
        i = self.translators.index(layer, site)
        if i is None and not self.is_final(layer, site):
            raise ResidError(
                f"This tuned lens has no translator for {site_text((layer, site))}: it was trained at "
                f"level={self.translators.level!r}. Read it at level='{self.translators.level}', or train one with "
                "level='sublayer' to read every sublayer."
            )
        return i

    def check(self, model: Transformer, level: str) -> None:
        super().check(model, level)
        if level == "sublayer" and self.translators.level == "layer" and model.config.block != "parallel":
            self._index(0, "resid_mid")  # raises, naming the level to use

    def translate(
        self, resid: Float[Tensor, "*batch d_model"], layer: int, site: str
    ) -> Float[Tensor, "*batch d_model"]:
        i = self._index(layer, site)
        return resid if i is None else self.translators.apply(i, resid)

    def direction(self, direction: Direction, layer: int, site: str) -> tuple[Direction, Float[Tensor, "batch"]]:
        """T(h) . v = h . (v + v @ A) + b . v, row by row (v: [batch d_model] or [batch pos d_model])."""
        i = self._index(layer, site)
        if i is None:
            return direction, torch.zeros_like(direction.bias)
        weight, bias = self.translators.weight[i], self.translators.bias_of(i)
        v = direction.vector.float()
        carried = v @ bias
        carried = carried.sum(1) if carried.ndim == 2 else carried
        return Direction(v + v @ weight, direction.bias), carried
