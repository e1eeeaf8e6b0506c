"""Causal analyses: activation patching (exact), attribution patching (AtP, a gradient estimate of every site's
patching effect at once) and path patching, checked against each other with `compare`.

    exact = patching.activation(model, clean, corrupt, targets, baselines, sites="head")
    estimate = patching.atp(model, clean, corrupt, targets, baselines, sites=("head",))
    patching.compare(estimate, exact, k=20)     # rank correlation, top-k overlap, false negatives

Every table's `site` column is a resid.Site label, so estimate and exact tables (and attribution tables) join on
it. Pairs of different token lengths take an alignment (align="end", or explicit positions;
resid.analyses.patching.pairs) for the residual stream and for attribution patching. Every method runs on the one
driver (resid.analyses.distributed.driver): batched, backing off on out-of-memory, resumable with `out=`, on Ray
workers with `executor="ray"`. Encoder-decoder models take source= and corrupt_source= (activation patching and
AtP; resid.analyses.patching.sources), with sites on the decoder and the encoder ("encoder.<label>").
"""

from resid.analyses.patching.atp import atp
from resid.analyses.patching.compare import compare, site_effects
from resid.analyses.patching.exact import COLUMNS, activation
from resid.analyses.patching.path import path

__all__ = ["COLUMNS", "activation", "atp", "compare", "path", "site_effects"]
