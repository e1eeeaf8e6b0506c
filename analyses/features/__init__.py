"""Learned dictionaries' features as components (resid.dictionaries): exact attribution to features, a feature's
decoder and encoder directions read through the model's unembedding."""
