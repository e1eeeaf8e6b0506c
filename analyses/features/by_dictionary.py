"""Attribution to every feature of many dictionaries at once: `by_dictionary(model, prompts, dictionaries)`.

`attribution.direct(..., dictionaries=...)` gives one exact decomposition of the logit, so it takes at most one
dictionary on the residual stream. With a residual SAE at every layer (or any mix) each dictionary is its own
decomposition: here every dictionary gets its rows, one per feature active at the attributed position plus its
b_dec / skip / error terms (resid.analyses.features.attribution), read through the same frozen logit direction.
A dictionary's rows sum to the contribution of the tensor it reconstructs: for a residual SAE at S, the stream at
S (every write before it); for a sublayer's write, that write; for a z SAE, the heads' part of the attention's
write (the output bias and post-norm bias are the attention's own, left out here).

One pass captures only the attributed position, so the dictionaries encode one token per prompt. The table is read
back from the device at once: one reading of every dictionary's count of active features, then one copy of all the
rows' values (no host reading per dictionary).
"""

import dataclasses
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from resid.analyses.checks import renamed
from resid.analyses.features.attribution import (
    attributed_dictionaries,
    capture_with,
    dictionary_values,
    z_dictionary_values,
)
from resid.analyses.inputs import prediction_positions
from resid.analyses.inputs import prompts as as_prompts
from resid.analyses.vocab import Token, token_ids
from resid.capture import Capture
from resid.dictionaries import Observe, named
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
                  targets: Token | Sequence[Token | None] | None = None,
                  baselines: Token | Sequence[Token] | None = None, position: int | None = None, *,
                  target: Token | Sequence[Token | None] | None = None,
                  baseline: Token | Sequence[Token] | None = None, pos: int | None = None) -> pd.DataFrame:
    """Every dictionary's feature and term rows for the logit of `targets` (minus `baselines`; None: each prompt's
    top prediction) at prompt-relative `position` (default: the last token), all prompts in one pass. target,
    baseline, pos: the old names of targets, baselines, position (deprecated)."""
    targets = renamed("targets", targets, "target", target)
    baselines = renamed("baselines", baselines, "baseline", baseline)
    position = renamed("position", position, "pos", pos)
    given = as_prompts(model, prompts)
    n = len(given)
    found = attributed_dictionaries(model, dictionaries)
    if not found:
        raise ResidError("by_dictionary needs at least one dictionary.")
    positions = prediction_positions(model, given, position, mask=False)
    tokens = given.tokens
    index = tokens.padded_index([[p] for p in positions])
    # a z dictionary's rows go through the attention's post-norm (Gemma 2/3, OLMo 2), which reads its scale
    capture = capture_with(Capture(positions=[[p] for p in positions]), model)
    run = model.run(tokens, capture=capture, logits_at=Padded(index),
                    dictionaries=[Observe(d, storage="dense") for d in found])  # read back dense right away
    logits = (run.uncapped_logits if run.uncapped_logits is not None else run.logits)[:, 0].float()
    wanted = [None] * n if targets is None else token_ids(model, targets, n, "target", optional=True)
    top = logits.argmax(-1).tolist() if None in wanted else []
    target_ids = [top[b] if t is None else t for b, t in enumerate(wanted)]
    baseline_ids = None if baselines is None else token_ids(model, baselines, n, "baseline")
    at = model.readout.logit_direction(target_ids, run.stream.final_norm_scale[:, 0], baseline_ids, run.hidden[:, 0])
    direction = Direction(at.vector[:, None], at.bias)
    read = []
    for encoded in run.dictionaries.values():
        site = encoded.dictionary.point_out.site
        if site.part in RESID_PARTS or (site.part in SUBLAYERS and site.what == "out"):
            values = dictionary_values(encoded, direction.project, direction)
        elif site.part == "attn" and site.what == "z" and encoded.dictionary.point_out.heads_flat:
            values = z_dictionary_values(model, run, encoded, direction)
        else:
            raise ResidError(f"Dictionary {encoded.name!r} reconstructs {site.label}, which is not a write into the "
                             "residual stream (see resid.analyses.features.attribution).")
        read.append((encoded, Site(site.layer, site.part), values))
    return _table(read, found, positions, target_ids)


def _table(read: list, found: list, positions: list[int], targets: list[int]) -> pd.DataFrame:
    """The rows of every dictionary (its active features, prompt by prompt, then its terms), with two readings of
    the device for all of them: the counts of active features, then one float64 block of every row's numbers."""
    keep = [acts != 0 for _, _, (acts, _, _) in read]
    counts = torch.stack([k.sum() for k in keep]).tolist()
    blocks = []
    for k, count, (_, _, (acts, features, terms)) in zip(keep, counts, read):
        prompt, feature = torch.nonzero_static(k, size=count).T
        blocks += [torch.stack([prompt, feature]).double(), acts[prompt, feature].double()[None],
                   features[prompt, feature].double()[None], torch.stack(list(terms.values())).double()]
    numbers = torch.cat([b.flatten() for b in blocks]).cpu().numpy()
    frames, start = [], 0
    batch = len(positions)
    for count, (encoded, at, (_, _, terms)) in zip(counts, read):
        name = named(encoded.dictionary, found)
        rows = numbers[start:start + 4 * count].reshape(4, count)
        start += 4 * count
        prompt, feature = rows[0].astype(np.int64), rows[1].astype(np.int64)
        labels = {f: dataclasses.replace(at, feature=int(f), dictionary=name).label for f in np.unique(feature)}
        frames.append(_frame(encoded.name, at.layer, prompt, [labels[f] for f in feature], feature, rows[2], rows[3],
                             positions, targets))
        values = numbers[start:start + batch * len(terms)].reshape(len(terms), batch)
        start += batch * len(terms)
        for term, value in zip(terms, values):
            label = dataclasses.replace(at, field=term, dictionary=name).label
            frames.append(_frame(encoded.name, at.layer, np.arange(batch), [label] * batch, None,
                                 np.full(batch, np.nan), value, positions, targets))
    return pd.DataFrame(pd.concat(frames, ignore_index=True), columns=list(COLUMNS))


def _frame(name: str, layer: int | None, prompt: np.ndarray, sites: list[str], feature: np.ndarray | None,
           activation: np.ndarray, value: np.ndarray, positions: list[int], targets: list[int]) -> pd.DataFrame:
    return pd.DataFrame({
        "prompt_idx": prompt,
        "pos": np.asarray(positions, dtype=np.int64)[prompt],
        "target_id": np.asarray(targets, dtype=np.int64)[prompt],
        "dictionary": name,
        "site": sites,
        "layer": pd.array([layer] * len(prompt), dtype="Int64"),
        "feature": pd.array(feature if feature is not None else [None] * len(prompt), dtype="Int64"),
        "activation": activation,
        "value": value,
    })
