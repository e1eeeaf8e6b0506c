"""What a sweep ablates: "layer" (both sublayers of each layer together), "sublayer" (each attention and
MLP write), "head" (each head's z), "expert" (each expert's weighted write, mixture-of-experts models only; the
other experts keep their router weights), or an explicit list of resid.Site (sublayers, heads, experts or
neurons, one ablation each). Plus the sweep's signature, which tells a resumed sweep from a different one."""

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.interventions import Site
from resid.model import Transformer

SiteKind = Literal["layer", "sublayer", "head", "expert"]  # the granularity words of attribution's `level` and
# the lens, plus the experts of a mixture-of-experts MLP
SITE_KINDS: tuple[str, ...] = ("layer", "sublayer", "head", "expert")


@dataclass(frozen=True)
class Ablation:
    label: str  # the `site` column: "layers[3]", "layers[3].attn", "layers[3].attn head 2", ...
    layer: int
    part: str  # "layer", "attn" or "mlp"
    head: int | None
    neuron: int | None
    sites: tuple[Site, ...]  # the writes replaced together
    expert: int | None = None  # mixture-of-experts MLPs: the expert (whose write, or whose neuron)

    @property
    def start_layer(self) -> int:
        """The first layer whose computation changes: a resumed run starts here."""
        return min(site.layer for site in self.sites)


def expand_sites(sites: SiteKind | Sequence[Site], config: ModelConfig) -> list[Ablation]:
    n = config.n_layers
    if isinstance(sites, str):
        if sites == "layer":
            return [Ablation(f"layers[{l}]", l, "layer", None, None, (Site(l, "attn"), Site(l, "mlp"))) for l in range(n)]
        if sites == "sublayer":
            return [
                Ablation(f"layers[{l}].{part}", l, part, None, None, (Site(l, part),))
                for l in range(n)
                for part in ("attn", "mlp")
            ]
        if sites == "head":
            return [
                Ablation(f"layers[{l}].attn head {h}", l, "attn", h, None, (Site(l, "attn", head=h),))
                for l in range(n)
                for h in range(config.n_heads)
            ]
        if sites == "expert":
            if not config.n_experts:
                raise ResidError("sites='expert' needs a mixture-of-experts model; this model's MLPs are dense. Use "
                                 "sites='sublayer' for the MLP writes.")
            return [
                Ablation(f"layers[{l}].mlp expert {e}", l, "mlp", None, None, (Site(l, "mlp", expert=e),), e)
                for l in range(n)
                for e in range(config.n_experts)
            ]
        raise ResidError(f"Unknown sites {sites!r}: use one of {SITE_KINDS} or a list of resid.Site.")
    out = []
    for site in sites:
        if not isinstance(site, Site):
            raise ResidError(f"sites must be one of {SITE_KINDS} or a list of resid.Site, got an item {site!r}.")
        site.validate(config)
        site = dataclasses.replace(site, layer=site.layer % n)
        out.append(Ablation(site.describe(), site.layer, site.part, site.head, site.neuron, (site,), site.expert))
    labels = [a.label for a in out]
    if len(set(labels)) != len(labels):
        raise ResidError("sites lists the same site twice; each ablation must be unique.")
    if not out:
        raise ResidError("sites is an empty list: give at least one resid.Site.")
    return out


def signature(
    model: Transformer, prompts, target_ids, baseline_ids, ablations, reference, donors, settings: dict
) -> dict:
    """A JSON-able fingerprint of everything that determines the results."""

    def digest(value) -> str:
        return hashlib.sha256(json.dumps(value, default=str).encode()).hexdigest()[:16]

    if isinstance(reference, (str, Path)) and Path(reference).is_file():
        reference = hashlib.sha256(Path(reference).read_bytes()).hexdigest()
    return {
        "model": model.name,
        "weights": [Path(f).name for f in model.weight_files],
        "dtype": str(model.dtype),
        "prompts": digest([prompts, target_ids, baseline_ids]),
        "sites": digest([a.label for a in ablations]),
        "reference": digest(reference if reference is None or isinstance(reference, str) else list(reference)),
        "donors": digest(donors),
        **settings,
    }
