"""What `sites=` names, the same way in exact and attribution patching (patching.activation, patching.atp):

    sites="head"                                  a word: resid.analyses.site_words's, or "feature" (the features of
                                                  `dictionaries=` active in some pair: resid.analyses.patching.features)
    sites=["resid_pre", "head"]                   a list of words: the union of their sites, in this order
    sites=[Site(9, "attn", head=6), "layers[3].mlp"]   resid.Site values and their labels
    sites=["sublayer", Site(9, "attn", head=6)]   words, Sites and labels mixed

Each site once: a list that names a site twice (directly or through a word) is refused. Which words and sites a
method can patch is its own check (attribution patching estimates the sites it has a gradient for).
"""

from collections.abc import Callable, Sequence

from resid.analyses import site_words
from resid.analyses.patching.features import WORD
from resid.errors import ResidError, param
from resid.sites import Site

WORDS = (*site_words.WORDS, WORD)


def items(sites: str | Sequence[Site | str]) -> list[str | Site]:
    """`sites` as a list of words and Sites / labels (a word alone is a list of one)."""
    if isinstance(sites, str):
        return [sites]
    if isinstance(sites, Site) or not isinstance(sites, Sequence) or not sites:
        raise ResidError(f"{param('sites')} must be a word ({', '.join(WORDS)}) or a non-empty list of words, "
                         f"resid.Site values and their labels, got {sites!r}.")
    return list(sites)


def words(sites: str | Sequence[Site | str]) -> list[str]:
    """The words among `sites`, in order."""
    return [item for item in items(sites) if is_word(item)]


def is_word(item: object) -> bool:
    return isinstance(item, str) and item in WORDS


def expand(sites: str | Sequence[Site | str], word: Callable[[str], list[Site]],
           listed: Callable[[list], list[Site]]) -> list[Site]:
    """The Sites `sites` names, in order: each word's through `word`, each listed Site or label through `listed`
    (resolved against the model: resid.analyses.site_words.expand, or an encoder-decoder's seq2seq.expand)."""
    chosen: list[Site] = []
    for item in items(sites):
        if is_word(item):
            chosen += word(item)
            continue
        if isinstance(item, str):
            try:
                item = Site.parse(item)
            except ResidError as error:
                raise ResidError(f"{param('sites')}: {item!r} is neither a word ({', '.join(WORDS)}) nor a site "
                                 f"label. {error}") from None
        chosen += listed([item])
    labels = [site.label for site in chosen]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise ResidError(f"{param('sites')} names the same site twice ({', '.join(twice[:5])}); name each once.")
    return chosen
