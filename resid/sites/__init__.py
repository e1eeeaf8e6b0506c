"""Sites: the one address of every place of a run (resid.sites.site: the Site, its label grammar, its checks
against a model), the vocabulary of its parts and fields (resid.sites.vocabulary: the one list of them) and
TransformerLens's names for them (resid.sites.transformerlens: the one table of hook names)."""

from resid.sites import transformerlens, vocabulary
from resid.sites.site import Site
from resid.sites.vocabulary import (
    ATTN_FIELDS,
    DICTIONARY_FIELDS,
    GLOBAL_PARTS,
    LAYER_PARTS,
    MLP_FIELDS,
    PARTS,
    RESID_PARTS,
    SUBLAYERS,
    TERMS,
)

__all__ = ["ATTN_FIELDS", "DICTIONARY_FIELDS", "GLOBAL_PARTS", "LAYER_PARTS", "MLP_FIELDS", "PARTS", "RESID_PARTS",
           "SUBLAYERS", "TERMS", "Site", "transformerlens", "vocabulary"]
