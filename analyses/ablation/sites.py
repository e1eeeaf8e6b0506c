"""What a sweep ablates: "layer" (both sublayers of each layer together), "sublayer" (each attention and
MLP write), "head" (each head's z), or an explicit list of resid.Site (sublayers, heads or neurons, one
ablation each). Plus the sweep's signature, which tells a resumed sweep from a different one."""

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

SiteKind = Literal["layer", "sublayer", "head"]  # the granularity words of attribution's `level` and the lens
SITE_KINDS: tuple[str, ...] = ("layer", "sublayer", "head")


@dataclass(frozen=True)
class Ablation:
    label: str  # the `site` column: "layers[3]", "layers[3].attn", "layers[3].attn head 2", ...
    layer: int
    part: str  # "layer", "attn" or "mlp"
    head: int | None
    neuron: int | None
    sites: tuple[Site, ...]  # the writes replaced together

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
        raise ResidError(f"Unknown sites {sites!r}: use one of {SITE_KINDS} or a list of resid.Site.")
    out = []
    for site in sites:
        if not isinstance(site, Site):
            raise ResidError(f"sites must be one of {SITE_KINDS} or a list of resid.Site, got an item {site!r}.")
        site.validate(config)
        site = Site(site.layer % n, site.part, site.head, site.neuron, site.positions)
        out.append(Ablation(site.describe(), site.layer, site.part, site.head, site.neuron, (site,)))
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
