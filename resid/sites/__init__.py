"""Sites: the one address of every place of a run (resid.sites.site: the Site, its label grammar, its checks
against a model) and TransformerLens's names for them (resid.sites.transformerlens: the one table of hook names)."""

from resid.sites import transformerlens
from resid.sites.site import (
    ATTN_FIELDS,
    DICTIONARY_FIELDS,
    GLOBAL_PARTS,
    LAYER_PARTS,
    MLP_FIELDS,
    PARTS,
    RESID_PARTS,
    SUBLAYERS,
    TERMS,
    Site,
)

__all__ = ["ATTN_FIELDS", "DICTIONARY_FIELDS", "GLOBAL_PARTS", "LAYER_PARTS", "MLP_FIELDS", "PARTS", "RESID_PARTS",
           "SUBLAYERS", "TERMS", "Site", "transformerlens"]
