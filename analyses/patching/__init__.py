"""Causal analyses: activation patching (exact), attribution patching (AtP, a gradient estimate of every site's
patching effect at once) and path patching, checked against each other with `compare`.

    pairs = patching.Pairs(clean, corrupt, targets, baselines)
    exact = patching.activation(model, pairs, sites="head")
    estimate = patching.atp(model, pairs, sites="head")
    patching.compare(estimate, exact, k=20)     # rank correlation, top-k overlap, false negatives

What the three methods share is one value, `Pairs` (resid.analyses.patching.pairs), as how they run is one
Execution; their other parameters come in one order, with one type and one default each:

    model, pairs                     the model and the Pairs: (clean, corrupt) prompts, each pair's target token,
                                     baselines=None (a baseline token per pair: metric "logit_diff", else
                                     "target_prob"), metric=None (or a function of the logits), align=None (pairs of
                                     different token lengths, activation and atp: "end", or explicit positions)
    sites="resid_pre"                what is patched (activation, atp): a word of resid.analyses.site_words (or
                                     "feature"), or a list of words, resid.Site values and their labels
                                     (resid.analyses.patching.selection); path patching names senders and
                                     receivers here instead
    direction="denoise"              the corrupt prompt is run and the clean activation patched in; "noise": the
                                     reverse (path patching as Wang et al. ran it: pass direction="noise")
    dictionaries=(), source=None, corrupt_source=None   features of learned dictionaries; encoder-decoder sources
    execution=None                   how the job runs (resid.analyses.Execution: executor, workers, batch_size
                                     "auto", progress None = a bar on a terminal, out = a resumable .parquet / .csv)

The separate arguments of before (model, clean, corrupt, targets, baselines, ..., metric=, align=) still work for
one release, with a DeprecationWarning.

Every table's `site` column is a resid.Site label, so estimate and exact tables (and attribution tables) join on
it. Pairs of different token lengths take an alignment (resid.analyses.patching.pairs) for the residual stream and
for attribution patching. Every method runs on the one driver (resid.analyses.distributed.driver): batched,
backing off on out-of-memory, resumable, in process or on Ray workers; exact patching is a job of the
intervention-sweep engine (resid.analyses.sweeps). Encoder-decoder models take source= and corrupt_source=
(activation patching and AtP; resid.analyses.patching.sources), with sites on the decoder and the encoder
("encoder.<label>").
"""

from resid.analyses.patching.atp import atp
from resid.analyses.patching.compare import compare, site_effects
from resid.analyses.patching.exact import COLUMNS, activation
from resid.analyses.patching.pairs import Pairs
from resid.analyses.patching.path import path

__all__ = ["COLUMNS", "Pairs", "activation", "atp", "compare", "path", "site_effects"]
