"""Translators: the per-site affine maps of a tuned lens (Belrose et al. 2023, "Eliciting Latent Predictions from
Transformers with the Tuned Lens", arXiv:2303.08112).

    T_s(h) = h + h @ weight[s].T + bias[s]          one translator per site s, weight [d_model d_model]

Glossary: a *site* is a resid.Site of the residual stream as `ResidualStream.running(every)` walks it and
`resid.analyses.lenses.lens.site_list` lists it: `layers[0].resid_pre` is the embeddings, `layers[l].resid_mid` is
after layer l's attention, `layers[l].resid_post` is after layer l. The last site, the final residual, has no
translator: the lens there is the model itself. `weight` is stored as torch.nn.Linear stores it, [out in], as
tuned-lens does, so that a weight and bias of zero is the logit lens exactly (h + 0 + 0 == h) and weight decay pulls
the map towards the identity, not towards zero (tuned-lens parametrizes it the same way, for the same reason).

tuned-lens keeps one translator per layer input, hidden_states[i] for i < n_layers: that is every="layer" here,
translator i at `layers[0].resid_pre` for i = 0 and at `layers[i-1].resid_post` after (`tuned_lens_sites`). A lens
trained with every="sublayer" also has translators at each resid_mid (and resid_cross).
"""

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
from jaxtyping import Float
from torch import Tensor

from resid.errors import ResidError, param
from resid.sites import RESID_PARTS, Site
from resid.stream import EVERY


def translator_site(label: str) -> Site:
    """A residual site from its label ("layers[3].resid_post"), or from the "resid_post 3" spelling that files
    written before resid.Site still hold."""
    name, _, layer = label.partition(" ")
    if name in RESID_PARTS and layer.isdigit():
        return Site(int(layer), name)
    site = Site.parse(label)
    if site.part not in RESID_PARTS or site.positions is not None or site.layer < 0:
        raise ResidError(f"{label!r} is not a residual site with a layer counted from 0: translators sit at "
                         "layers[L].resid_pre | resid_mid | resid_cross | resid_post, e.g. 'layers[3].resid_post'.")
    return site


def tuned_lens_sites(n_layers: int) -> tuple[Site, ...]:
    """The sites of tuned-lens's translators 0..n_layers-1: the input of each layer."""
    return (Site(0, "resid_pre"), *(Site(layer, "resid_post") for layer in range(n_layers - 1)))


@dataclass(frozen=True)
class Translators:
    """The translators of a tuned lens, one per site (float32). A value: training returns new ones."""

    sites: tuple[Site, ...]  # in stream order; the final residual is never among them
    weight: Float[Tensor, "site d_model d_model"]  # [out in], as torch.nn.Linear
    bias: Float[Tensor, "site d_model"] | None  # None: translators without a bias (tuned-lens's bias=False)
    every: str = "layer"  # the sites of ResidualStream.running(every) the lens reads ("layer" | "sublayer")
    # What made them, for provenance and for the files: the model's name, tuned-lens's unembedding hash, the
    # training recipe and the tokens seen. JSON-ready values only.
    info: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        n, d = len(self.sites), self.weight.shape[-1]
        if self.weight.shape != (n, d, d):
            raise ResidError(f"Translator weights must be [site d_model d_model] = [{n} {d} {d}], got "
                             f"{list(self.weight.shape)}.")
        if self.bias is not None and self.bias.shape != (n, d):
            raise ResidError(f"Translator biases must be [site d_model] = [{n} {d}], got {list(self.bias.shape)}.")
        if len(set(self.sites)) != n:
            raise ResidError(f"Translator sites repeat: {[s.label for s in self.sites]}.")
        if self.every not in EVERY:
            raise ResidError(f"Translators' {param('every', self.every)} must be 'layer' or 'sublayer'.")

    @classmethod
    def zeros(cls, sites: Sequence[Site], d_model: int, every: str = "layer", bias: bool = True,
              info: dict | None = None) -> "Translators":
        """Translators that change nothing: the tuned lens they make is the logit lens, exactly."""
        n = len(sites)
        return cls(tuple(sites), torch.zeros(n, d_model, d_model), torch.zeros(n, d_model) if bias else None,
                   every, dict(info or {}))

    @property
    def d_model(self) -> int:
        return self.weight.shape[-1]

    def index(self, site: Site) -> int | None:
        """Position of the site's translator, or None if it has none."""
        try:
            return self.sites.index(site)
        except ValueError:
            return None

    def to(self, device: torch.device | str) -> "Translators":
        bias = None if self.bias is None else self.bias.to(device)
        return replace(self, weight=self.weight.to(device), bias=bias)

    def bias_of(self, i: int) -> Float[Tensor, "d_model"]:
        return self.bias[i] if self.bias is not None else torch.zeros_like(self.weight[i, 0])

    def apply(self, i: int, resid: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch d_model"]:
        """T_i(resid) in float32, returned in resid's dtype. With weight and bias zero it returns resid
        exactly: h @ 0 is 0 and h + 0 is h, in every float format."""
        h = resid.float()
        return (h + h @ self.weight[i].T + self.bias_of(i)).to(resid.dtype)

    def with_info(self, **info) -> "Translators":
        return replace(self, info={**self.info, **info})
