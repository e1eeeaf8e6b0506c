"""Lenses: small classes over the model's one readout (resid.readout: final norm + unembedding), as in tuned-lens's
`nn/lenses.py`, never a string threaded through the analyses. A lens maps the residual at a site to a residual the
readout reads; every lens here is that map and nothing else:

    LogitLens(model)                the identity: the residual read as if it were the final one (nostalgebraist 2020)
    TunedLens(model, translators)   an affine map per site, T_s(h) = h + h A_s^T + b_s (Belrose et al. 2023;
                                    resid.analyses.lenses.translators)
    JacobianLens(model, jacobians)  a linear map per site, h J_s^T with J_s the expected Jacobian of the final
                                    residual with respect to the site's (Gurnee et al. 2026; resid.analyses.lenses
                                    .jacobian fits it)

How the lens treats the final norm is part of the lens, not an argument beside it: `frozen_norm=False` (the usual
lens) recomputes the final norm's scale on the mapped residual; `frozen_norm=True` uses the scale the final norm had
in the full forward pass (`scale`, stream.final_norm_scale), which keeps the lens linear in the writes. Both equal
the model's output at the final site. `lens.with_frozen_norm(True)` is the same lens the other way.

Every lens gives `logits(resid, site, scale)` and `direction(d, site)`, which pulls a read-out of the mapped
residual back onto the residual at the site. The map is affine, so with the final norm's scale frozen a lens's
logit of a token is still a linear read-out of the writes up to the site plus one constant (the J-lens has no
constant: its map is linear):

    logit = T(h) . v + c = h . (v + v @ A) + (b . v + c)        h = the sum of the writes before the site

so every write's contribution is `write . (v + v @ A)` and the translator's bias adds `b . v` as a component of its
own; the sum is exact (tests/analyses/test_tuned_lens.py). At the final site every lens is the model itself, so
resid.analyses.attribution.direct, which decomposes the final prediction, is the same for any lens.

The sites a lens reads are those of ResidualStream.running(every), in stream order (`site_list`):

    resid_pre  (layer 0)   the embeddings
    resid_mid  (layer l)   after layer l's attention (every="sublayer" only; absent for parallel blocks)
    resid_cross (layer l)  after a decoder's cross-attention (encoder-decoder models, every="sublayer")
    resid_post (layer l)   after layer l; resid_post of the last layer is the final residual
"""

import copy
import functools
from collections.abc import Callable, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from resid.analyses.lenses.translators import Translators
from resid.errors import ResidError, param
from resid.model import Transformer
from resid.readout import Direction
from resid.sites import RESID_PARTS, Site


def site_list(model: Transformer, every: str) -> list[Site]:
    """The residual sites in stream order, as ResidualStream.running(every) yields them (without interventions)."""
    result = [Site(0, "resid_pre")]
    for layer in range(model.config.n_layers):
        if every == "sublayer" and model.config.block != "parallel":
            result.append(Site(layer, "resid_mid"))
            if model.config.cross_attention:
                result.append(Site(layer, "resid_cross"))
        result.append(Site(layer, "resid_post"))
    return result


def short_label(site: Site) -> str:
    """A short name for a residual site (plots): "embed" for layer 0's resid_pre, else e.g. "L3 mid"."""
    if site.part == "resid_pre" and site.layer == 0:
        return "embed"
    return f"L{site.layer} {site.part.removeprefix('resid_')}"


def in_stream(model: Transformer, site: Site) -> bool:
    """Whether `site` is a residual site of `model`'s stream that site_list names (with either `every`)."""
    config = model.config
    if site.part not in RESID_PARTS or site.positions is not None:
        return False
    if not 0 <= site.layer < config.n_layers:
        return False
    if site.part == "resid_pre":
        return site.layer == 0  # resid_pre of a later layer is the resid_post of the one before
    if site.part == "resid_mid":
        return config.block != "parallel"
    return site.part == "resid_post" or config.cross_attention


class Lens:
    """What the lens analyses need of a lens; `name` goes into their tables ("logit", "tuned", "jacobian"), and
    `norm` ("recompute" or "frozen", from frozen_norm) too."""

    name = "lens"

    def __init__(self, model: Transformer, frozen_norm: bool = False):
        if not isinstance(model, Transformer):
            raise ResidError(f"A lens reads a resid.Transformer's stream, got {type(model).__name__}; "
                             "encoder-decoder models: build the lens on model.decoder.")
        if not isinstance(frozen_norm, bool):
            raise ResidError(f"frozen_norm is True (the final norm's scale frozen from the run) or False "
                             f"(recomputed on each residual), not {frozen_norm!r}.")
        model.readout.unembed  # noqa: B018 -- raises for embedding models, which have no token logits to lens
        self.model = model
        self.frozen_norm = frozen_norm

    @property
    def norm(self) -> str:
        """How the final norm's scale is had: "frozen" (from the run) or "recompute" (the tables' `norm`)."""
        return "frozen" if self.frozen_norm else "recompute"

    def with_frozen_norm(self, frozen_norm: bool = True) -> "Lens":
        """This lens with the final norm's scale frozen from the run (True) or recomputed (False): a new value."""
        if not isinstance(frozen_norm, bool):
            raise ResidError(f"frozen_norm is True or False, not {frozen_norm!r}.")
        other = copy.copy(self)
        other.frozen_norm = frozen_norm
        return other

    def remake(self) -> Callable[[Transformer], "Lens"]:
        """How to make this lens again on another copy of its model (a Ray worker's): a picklable function of the
        model, carrying the lens's own tensors but not the model."""
        raise NotImplementedError

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
        """The lens's logits of residuals at `site`: the final norm and the unembedding applied to
        `translate(resid, site)`. `scale`: the final norm's scale in the run, which a frozen_norm lens uses (and
        needs); a lens that recomputes the norm ignores it."""
        if self.frozen_norm and scale is None:
            raise ResidError(f"This {self.name} lens freezes the final norm's scale (frozen_norm=True) but no scale "
                             "was given: pass the run's stream.final_norm_scale at these positions.")
        return self.model.readout.logits(self.translate(resid, site), scale if self.frozen_norm else None)

    def direction(self, direction: Direction, site: Site) -> tuple[Direction, Float[Tensor, "batch"]]:
        """A read-out of the translated residual as a read-out of the residual at the site: (the direction, the
        value the translator's bias adds, [batch])."""
        raise NotImplementedError

    def check(self, model: Transformer, every: str) -> None:
        """Raises unless this lens reads `model`'s stream at every site of ResidualStream.running(every)."""
        if model is not self.model:
            raise ResidError(f"This {self.name} lens was made for the model {self.model.name!r}, not for the "
                             f"model {model.name!r} given: make the lens from the model you analyse.")

    def check_site(self, site: Site) -> None:
        """Raises unless this lens reads the residual at `site` (a residual site of its model's stream)."""
        if not in_stream(self.model, site):
            raise ResidError(f"{site.label} is not a residual site of {self.model.name}'s stream: a lens reads "
                             f"{', '.join(s.label for s in site_list(self.model, 'sublayer')[:3])}, ...")

    def is_final(self, site: Site) -> bool:
        """Whether `site` is the final residual (no translator: every lens is the model there)."""
        return site == Site(self.model.config.n_layers - 1, "resid_post")


class LogitLens(Lens):
    """The logit lens: every residual read through the final norm and unembedding as it is."""

    name = "logit"

    def remake(self) -> Callable[[Transformer], Lens]:
        return functools.partial(LogitLens, frozen_norm=self.frozen_norm)

    def translate(self, resid: Float[Tensor, "*batch d_model"], site: Site) -> Float[Tensor, "*batch d_model"]:
        return resid

    def direction(self, direction: Direction, site: Site) -> tuple[Direction, Float[Tensor, "batch"]]:
        return direction, torch.zeros_like(direction.bias)


class TunedLens(Lens):
    """The tuned lens: the residual at each site carried through that site's translator, then read out. The
    final site has no translator (the lens there is the model)."""

    name = "tuned"

    def __init__(self, model: Transformer, translators: Translators, frozen_norm: bool = False):
        super().__init__(model, frozen_norm)
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

    def remake(self) -> Callable[[Transformer], Lens]:
        return functools.partial(TunedLens, translators=self.translators.to("cpu"), frozen_norm=self.frozen_norm)

    def _in_stream(self, site: Site) -> bool:
        return in_stream(self.model, site)

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

    def check_site(self, site: Site) -> None:
        super().check_site(site)
        self._index(site)

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



class JacobianLens(Lens):
    """The Jacobian lens (J-lens; Gurnee et al. 2026): the residual at each fitted site s carried through J_s, the
    expected Jacobian of the final residual with respect to the site's (resid.analyses.lenses.jacobian fits it),
    then read out: readout(h J_s^T). J = I is the logit lens. The final site has no J (the lens there is the model).

    jacobians [site d_model d_model] float32, J_s[i, j] = E d h_final[i] / d h_s[j] (TransformerLens's layout)."""

    name = "jacobian"

    def __init__(self, model: Transformer, sites: Sequence[Site], jacobians: Float[Tensor, "site d_model d_model"],
                 info: dict | None = None, frozen_norm: bool = False):
        super().__init__(model, frozen_norm)
        sites = tuple(sites)
        d = model.config.d_model
        if jacobians.ndim != 3 or jacobians.shape[1:] != (d, d) or len(jacobians) != len(sites):
            raise ResidError(f"A J-lens of {model.name} has one [{d} {d}] matrix per site: got {len(sites)} sites and "
                             f"matrices of shape {list(jacobians.shape)} (fitted for another model?).")
        if len(set(sites)) != len(sites):
            raise ResidError(f"The J-lens names a site twice: {[s.label for s in sites]}.")
        bad = [s.label for s in sites if not in_stream(model, s) or self.is_final(s)]
        if bad:
            raise ResidError(f"The J-lens has sites {bad} that {model.name}'s stream ({model.config.n_layers} layers, "
                             f"{model.config.block} blocks) does not have before its final residual: it was fitted "
                             "for another model.")
        if not bool(jacobians.isfinite().all()):
            raise ResidError("The J-lens's matrices hold NaN or infinite values: the fit overflowed (fit in float32).")
        self.sites = sites
        self.jacobians = jacobians.detach().to(model.device, torch.float32)
        self.info = dict(info or {})

    @classmethod
    def identity(cls, model: Transformer, every: str = "layer") -> "JacobianLens":
        """J = I at every site: the logit lens, exactly (h @ I^T adds only exact zeros)."""
        sites = site_list(model, every)[:-1]
        eye = torch.eye(model.config.d_model).expand(len(sites), -1, -1).contiguous()
        return cls(model, sites, eye, {"model": model.name, "estimator": "identity"})

    def remake(self) -> Callable[[Transformer], Lens]:
        return functools.partial(JacobianLens, sites=self.sites, jacobians=self.jacobians.cpu(), info=self.info,
                                 frozen_norm=self.frozen_norm)

    def _index(self, site: Site) -> int | None:
        if self.is_final(site):
            return None
        if site not in self.sites:
            raise ResidError(f"This J-lens has no Jacobian for {site.label}: it was fitted at "
                             f"{[s.label for s in self.sites]}. Read it at those sites (every='layer' for a lens of "
                             "block outputs), or fit one there (resid.analyses.lenses.fit_jacobian(sites=...)).")
        return self.sites.index(site)

    def check_site(self, site: Site) -> None:
        super().check_site(site)
        self._index(site)

    def check(self, model: Transformer, every: str) -> None:
        super().check(model, every)
        for site in site_list(model, every):
            self._index(site)  # raises, naming the sites it has

    def translate(self, resid: Float[Tensor, "*batch d_model"], site: Site) -> Float[Tensor, "*batch d_model"]:
        i = self._index(site)
        return resid if i is None else (resid.float() @ self.jacobians[i].T).to(resid.dtype)

    def direction(self, direction: Direction, site: Site) -> tuple[Direction, Float[Tensor, "batch"]]:
        """(J h) . v = h . (J^T v): the pulled-back vector is v @ J, and J adds no constant."""
        i = self._index(site)
        if i is None:
            return direction, torch.zeros_like(direction.bias)
        return Direction(direction.vector.float() @ self.jacobians[i], direction.bias), torch.zeros_like(direction.bias)


def zeros(model: Transformer, every: str = "layer", bias: bool = True) -> TunedLens:
    """A tuned lens whose translators are all zero: the logit lens, exactly (a start for training, or a test)."""
    translators = Translators.zeros(site_list(model, every)[:-1], model.config.d_model, every, bias,
                                    {"model": model.name})
    return TunedLens(model, translators)
