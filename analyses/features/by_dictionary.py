"""Attribution to every feature of many dictionaries at once: `by_dictionary(model, prompts, dictionaries)`.

`attribution.direct(..., dictionaries=...)` gives one exact decomposition of the logit, so it takes at most one
dictionary on the residual stream. With a residual SAE at every layer (or any mix) each dictionary is its own
decomposition: here every dictionary gets its rows, one per feature active at the attributed position plus its
b_dec / skip / error terms (resid.analyses.features.attribution), read through the same frozen logit direction.
A dictionary's rows sum to the contribution of the tensor it reconstructs: for a residual SAE at S, the stream at
S (every write before it); for a sublayer's write, that write; for a z SAE, the heads' part of the attention's
write (the output bias and post-norm bias are the attention's own, left out here).

One pass captures only the attributed position, so the dictionaries encode one token per prompt.
"""

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from resid.analyses.features.attribution import capture_with, dictionaries_of, dictionary_rows, z_dictionary_rows
from resid.analyses.inputs import prediction_positions
from resid.analyses.inputs import prompts as as_prompts
from resid.analyses.vocab import Token, token_ids
from resid.capture import Capture
from resid.dictionaries import named
from resid.errors import ResidError
from resid.model import Inputs, Transformer
from resid.readout import Direction
from resid.selection import Padded
from resid.sites import RESID_PARTS, SUBLAYERS, Site

# dictionary: its name; site: the row's Site label (a feature, or the dictionary's b_dec / skip / error);
# feature / activation: <NA> / NaN on term rows; value: the row's contribution to the logit (difference)
COLUMNS = ("prompt_idx", "pos", "target_id", "dictionary", "site", "layer", "feature", "activation", "value")


@torch.no_grad()
def by_dictionary(model: Transformer, prompts: Inputs, dictionaries: Sequence,
                  target: Token | Sequence[Token | None] | None = None,
                  baseline: Token | Sequence[Token] | None = None, pos: int | None = None) -> pd.DataFrame:
    """Every dictionary's feature and term rows for the logit of `target` (minus `baseline`; None: each prompt's
    top prediction) at prompt position `pos` (default: the last token), all prompts in one pass."""
    given = as_prompts(model, prompts)
    n = len(given)
    found = dictionaries_of(model, dictionaries)
    if not found:
        raise ResidError("by_dictionary needs at least one dictionary.")
    positions = prediction_positions(model, given, pos, mask=False)
    tokens = given.tokens
    index = tokens.padded_index([[p] for p in positions])
    # a z dictionary's rows go through the attention's post-norm (Gemma 2/3, OLMo 2), which reads its scale
    capture = capture_with(Capture(positions=[[p] for p in positions]), model)
    run = model.run(tokens, capture=capture, logits_at=Padded(index),
                    dictionaries=found)
    logits = (run.uncapped_logits if run.uncapped_logits is not None else run.logits)[:, 0].float()
    wanted = [None] * n if target is None else token_ids(model, target, n, "target", optional=True)
    targets = [int(logits[b].argmax()) if t is None else t for b, t in enumerate(wanted)]
    baselines = None if baseline is None else token_ids(model, baseline, n, "baseline")
    at = model.readout.logit_direction(targets, run.stream.final_norm_scale[:, 0], baselines, run.hidden[:, 0])
    direction = Direction(at.vector[:, None], at.bias)
    frames = []
    for encoded in run.dictionaries.values():
        site = encoded.dictionary.point_out.site
        at, name = Site(site.layer, site.part), named(encoded.dictionary, found)
        if site.part in RESID_PARTS or (site.part in SUBLAYERS and site.what == "out"):
            groups = dictionary_rows(encoded, at, direction.project, direction, name)
        elif site.part == "attn" and site.what == "z" and encoded.dictionary.point_out.heads_flat:
            groups = [g for g in z_dictionary_rows(model, run, encoded, direction, at, name)
                      if g[0].sites[0].feature is not None
                      or g[0].sites[0].what in ("b_dec", "skip", "error")]
        else:
            raise ResidError(f"Dictionary {encoded.name!r} reconstructs {site.label}, which is not a write into the "
                             "residual stream (see resid.analyses.features.attribution).")
        frames += [_frame(encoded.name, group, acts, positions, targets) for group, acts in groups]
    return pd.DataFrame(pd.concat(frames, ignore_index=True), columns=list(COLUMNS))


def _frame(name: str, group, acts, positions: list[int], targets: list[int]) -> pd.DataFrame:
    values = group.values.double().cpu().numpy()  # [batch m]
    batch, m = values.shape
    activation = np.full((batch, m), np.nan) if acts is None else acts.double().cpu().numpy()
    keep = np.ones((batch, m), bool) if acts is None else activation != 0
    prompt, column = np.nonzero(keep)
    sites = group.sites
    return pd.DataFrame({
        "prompt_idx": prompt.astype(np.int64),
        "pos": np.asarray(positions, dtype=np.int64)[prompt],
        "target_id": np.asarray(targets, dtype=np.int64)[prompt],
        "dictionary": name,
        "site": [sites[c].label for c in column],
        "layer": pd.array([sites[c].layer for c in column], dtype="Int64"),
        "feature": pd.array([sites[c].feature for c in column], dtype="Int64"),
        "activation": activation[prompt, column],
        "value": values[prompt, column],
    })
