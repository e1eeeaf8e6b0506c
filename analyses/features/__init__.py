"""Learned dictionaries' features as components (resid.dictionaries): exact attribution to features, a feature's
decoder and encoder directions read through the model's unembedding, its top-activating examples over a corpus and
its card.

    features.top_activating(model, sae, corpus.demo(), features=[3, 7], k=20)   # examples (+ histograms)
    features.card(model, sae, 3, table)                                           # one feature's figure
"""

import importlib

# Lazy, so that importing resid.analyses.features.attribution loads neither the scan nor plotly.
_LAZY = {"top_activating": "resid.analyses.features.examples", "card": "resid.analyses.features.cards"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'resid.analyses.features' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = ["card", "top_activating"]
