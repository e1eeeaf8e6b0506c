"""Causal analyses: activation patching (exact) and attribution patching (AtP, a gradient estimate of every
site's patching effect at once), checked against each other with `compare`.

    exact = patching.activation(model, clean, corrupt, targets, baselines, sites="head")
    estimate = patching.attribution(model, clean, corrupt, targets, baselines, sites=("head",))
    patching.compare(estimate, exact, k=20)     # rank correlation, top-k overlap, false negatives

Pairs of different token lengths take an alignment (align="end", or explicit positions; resid.analyses.patching.pairs)
for the residual stream and for attribution patching.
"""

from resid.analyses.patching.compare import compare, site_effects
from resid.analyses.patching.exact import COLUMNS, activation
from resid.analyses.patching.gradient import attribution
from resid.analyses.patching.path import path

__all__ = ["COLUMNS", "activation", "attribution", "compare", "path", "site_effects"]
