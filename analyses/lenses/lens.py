"""Lenses: small classes over the model's one readout (resid.readout: final norm + unembedding), as in tuned-lens's
`nn/lenses.py`, never a string threaded through the analyses.

    LogitLens(model)                the residual at a site read as if it were the final one (nostalgebraist 2020)
    TunedLens(model, translators)   the residual first carried through the site's affine translator (Belrose et
                                    al. 2023; resid.analyses.lenses.translators): readout(T_s(h))

Both give `logits(resid, site, scale)` (scale: the final norm's, frozen from the run, or None to recompute
it) and `direction(d, site)`, which pulls a read-out of the translated residual back onto the residual at
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

from resid.analyses.lenses.translators import Translators
from resid.errors import ResidError, param
from resid.model import Transformer
from resid.readout import Direction
from resid.sites import RESID_PARTS, Site


class Lens:
    """What the lens analyses need of a lens; `name` goes into their tables ("logit", "tuned")."""

    name = "lens"

    def __init__(self, model: Transformer):
        if not isinstance(model, Transformer):
            raise ResidError(f"A lens reads a resid.Transformer's stream, got {type(model).__name__}; "
                             "encoder-decoder models: build the lens on model.decoder.")
        model.readout.unembed  # noqa: B018 -- raises for embedding models, which have no token logits to lens
        self.model = model

    def translate(self, resid: Float[Tensor, "*batch d_model"], site: Site) -> Float[Tensor, "*batch d_model"]:
        """The residual at `site` (a residual site of resid.analyses.logit_lens.site_list) as the lens hands it to
        the readout."""
        raise NotImplementedError

    def logits(
        self,
        resid: Float[Tensor, "*batch d_model"],
        site: Site,
        scale: Float[Tensor, "*batch 1"] | None = None,
    ) -> Float[Tensor, "*batch d_vocab"]:
        """The lens's logits of residuals at `site`: the final norm (its scale recomputed, or `scale` frozen) and
        the unembedding applied to `translate(resid, site)`."""
        return self.model.readout.logits(self.translate(resid, site), scale)

    def direction(self, direction: Direction, site: Site) -> tuple[Direction, Float[Tensor, "batch"]]:
        """A read-out of the translated residual as a read-out of the residual at the site: (the direction, the
        value the translator's bias adds, [batch])."""
        raise NotImplementedError

    def check(self, model: Transformer, every: str) -> None:
        """Raises unless this lens reads `model`'s stream at every site of ResidualStream.running(every)."""
        if model is not self.model:
            raise ResidError(f"This {self.name} lens was made for the model {self.model.name!r}, not for the "
                             f"model {model.name!r} given: make the lens from the model you analyse.")

    def is_final(self, site: Site) -> bool:
        """Whether `site` is the final residual (no translator: every lens is the model there)."""
        return site == Site(self.model.config.n_layers - 1, "resid_post")


class LogitLens(Lens):
    """The logit lens: every residual read through the final norm and unembedding as it is."""

    name = "logit"

    def translate(self, resid: Float[Tensor, "*batch d_model"], site: Site) -> Float[Tensor, "*batch d_model"]:
        return resid

    def direction(self, direction: Direction, site: Site) -> tuple[Direction, Float[Tensor, "batch"]]:
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
        bad = [s.label for s in translators.sites if not self._in_stream(s) or self.is_final(s)]
        if bad:
            raise ResidError(f"The translators have sites {bad} that {model.name}'s stream ({config.n_layers} layers, "
                             f"{config.block} blocks) does not have before its final residual: they were trained "
                             "for another model.")
        self.translators = translators.to(model.device)

    def _in_stream(self, site: Site) -> bool:
        config = self.model.config
        if site.part not in RESID_PARTS or site.positions is not None:
            return False
        if not 0 <= site.layer < config.n_layers:
            return False
        if site.part == "resid_pre":
            return site.layer == 0  # resid_pre of a later layer is the resid_post of the one before
        if site.part == "resid_mid":
            return config.block != "parallel"
        return site.part == "resid_post" or config.cross_attention

    def _index(self, site: Site) -> int | None:
        i = self.translators.index(site)
        if i is None and not self.is_final(site):
            every = self.translators.every
            raise ResidError(
                f"This tuned lens has no translator for {site.label}: it was trained with "
                f"{param('every', every)}. Read it with {param('every', every)}, or train one with "
                f"{param('every', 'sublayer')} to read every sublayer."
            )
        return i

    def check(self, model: Transformer, every: str) -> None:
        super().check(model, every)
        if every == "sublayer" and self.translators.every == "layer" and model.config.block != "parallel":
            self._index(Site(0, "resid_mid"))  # raises, naming the `every` to use

    def translate(self, resid: Float[Tensor, "*batch d_model"], site: Site) -> Float[Tensor, "*batch d_model"]:
        i = self._index(site)
        return resid if i is None else self.translators.apply(i, resid)

    def direction(self, direction: Direction, site: Site) -> tuple[Direction, Float[Tensor, "batch"]]:
        """T(h) . v = h . (v + v @ A) + b . v, row by row (v: [batch d_model] or [batch pos d_model])."""
        i = self._index(site)
        if i is None:
            return direction, torch.zeros_like(direction.bias)
        weight, bias = self.translators.weight[i], self.translators.bias_of(i)
        v = direction.vector.float()
        carried = v @ bias
        carried = carried.sum(1) if carried.ndim == 2 else carried
        return Direction(v + v @ weight, direction.bias), carried
