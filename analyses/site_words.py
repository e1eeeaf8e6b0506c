"""Site words and site columns: the one place the analyses turn `sites=` arguments into resid.Site values, and
Sites into the columns of a table. Every table's `site` column is `Site.label` (resid.sites), so tables of
different analyses join on it, and `Site.parse` reads it back.

Words (what `sites=` takes besides a list of Sites or of labels):

    "layer"       each layer's writes together (Site(l, "layer"))
    "sublayer"    each attention (cross-attention) and MLP write
    "head"        each head's z (a decoder's cross-attention heads too)
    "expert"      each expert's weighted write (mixtures of experts)
    "q", "pattern"  each head's query / attention pattern;  "k", "v": each key/value head's key / value
    "resid_pre", "resid_mid", "resid_post"   the residual stream at each layer and each position (one site per
                  (layer, position), positions 0..n_positions-1; patching's layer x position map)
"""

from collections.abc import Callable, Sequence

import pandas as pd

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.errors import param as spell
from resid.sites import RESID_PARTS, Site

WORDS = ("layer", "sublayer", "head", "expert", "q", "k", "v", "pattern", "resid_pre", "resid_mid", "resid_post")
# The columns a table of sites carries beside `site` (read off each Site; <NA> where a site has no such index)
COLUMNS = ("layer", "part", "head", "kv_head", "expert", "neuron")


def expand(sites: str | Sequence[Site | str], config: ModelConfig, n_positions: int | None = None,
           name: str = "sites", resolve: Callable[[Site], Site] | None = None) -> list[Site]:
    """The Sites of a word (see the module docstring) or of a list of Sites / labels, resolved against the model
    (indices non-negative), each once. Residual words need `n_positions` (the longest prompt's token count).
    resolve: how a listed Site is resolved (EncoderDecoder.resolve: against the stack it names); default
    Site.resolve(config)."""
    if isinstance(sites, str):
        return _word(sites, config, n_positions, name)
    if not isinstance(sites, Sequence) or not sites:
        raise ResidError(f"{spell(name)} must be one of {', '.join(WORDS)}, or a non-empty list of resid.Site, got "
                         f"{sites!r}.")
    out = []
    for site in sites:
        if isinstance(site, str):
            site = Site.parse(site)
        if not isinstance(site, Site):
            raise ResidError(f"{spell(name)} must be one of {', '.join(WORDS)} or a list of resid.Site, got an item "
                             f"{site!r}.")
        if site.is_term:
            raise ResidError(f"{spell(name)}: {site.label} is a term of an attribution, "
                             "not something a run can change.")
        out.append(site.resolve(config) if resolve is None else resolve(site))
    labels = [site.label for site in out]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ResidError(f"{spell(name)} lists the same site twice ({', '.join(repeated)}); each must be unique.")
    return out


def _word(word: str, config: ModelConfig, n_positions: int | None, name: str) -> list[Site]:
    layers = range(config.n_layers)
    if word == "layer":
        return [Site(l, "layer") for l in layers]
    if word == "sublayer":
        parts = ("attn", "cross", "mlp") if config.cross_attention else ("attn", "mlp")
        return [Site(l, part) for l in layers for part in parts]
    if word == "head":  # a decoder with cross-attention: its cross-attention heads too
        parts = ("attn", "cross") if config.cross_attention else ("attn",)
        return [Site(l, part, head=h) for l in layers for part in parts for h in range(config.n_heads)]
    if word == "expert":
        if not config.n_experts:
            raise ResidError(f"{spell(name, 'expert')} needs a mixture-of-experts model; "
                             "this model's MLPs are dense. Use "
                             f"{spell(name, 'sublayer')} for the MLP writes.")
        # the layers with experts (DeepSeek's first layers are dense)
        return [Site(l, "mlp", expert=e) for l in layers if config.has_experts(l) for e in range(config.n_experts)]
    if word in ("q", "pattern"):
        return [Site(l, "attn", head=h, field=word) for l in layers for h in range(config.n_heads)]
    if word in ("k", "v"):
        return [Site(l, "attn", kv_head=h, field=word) for l in layers for h in range(config.n_kv_heads)]
    if word in ("resid_pre", "resid_mid", "resid_post"):
        if word == "resid_mid" and config.block == "parallel":
            raise ResidError(f"{spell(name, 'resid_mid')}: parallel blocks have no resid_mid (both sublayers read "
                             "resid_pre).")
        assert n_positions is not None, "residual words need the number of positions"
        return [Site(l, word, positions=(p,)) for l in layers for p in range(n_positions)]
    raise ResidError(f"Unknown {spell(name)} {word!r}: use one of {', '.join(WORDS)}, or a list of resid.Site.")


def columns(sites: Sequence[Site]) -> dict[str, object]:
    """The site columns of a table, one entry per site: site (its label), layer, part, head, kv_head, expert,
    neuron (nullable integers, <NA> where a site has none)."""
    def ints(name: str) -> pd.arrays.IntegerArray:
        return pd.array([getattr(site, name) for site in sites], dtype="Int64")

    return {"site": [site.label for site in sites], "layer": ints("layer"), "part": [site.part for site in sites],
            "head": ints("head"), "kv_head": ints("kv_head"), "expert": ints("expert"), "neuron": ints("neuron")}


def position(site: Site) -> int | None:
    """The one position of a residual site of a layer x position map (None for a site over every position)."""
    return site.positions[0] if site.part in RESID_PARTS and site.positions is not None else None
