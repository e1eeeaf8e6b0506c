"""Top-activating examples of dictionary features over a corpus: the tokens where a feature fires most, with their
contexts, and each feature's activation histogram, through the neuron scan's engine.

Glossary: feature i of a dictionary has, at each token, an *activation* a_i (what the dictionary encodes from the
tensor its hook reads, resid.dictionaries); its *examples* are the corpus tokens with the k largest a_i (by a_i,
-a_i or |a_i| with `sign`), shown in their *context* with the token marked ⟦like this⟧. A token where the feature is
off (a_i == 0) is never an example: a feature that fires on fewer than k tokens gets fewer rows.

    sae = resid.dictionaries.load("path/to/sae", model)
    df = features.top_activating(model, sae, corpus.demo(), features=[3, 7], k=20)
    df = features.top_activating(model, [sae_0, sae_1], texts, execution=Execution(executor="ray", workers=2))

The scan is neurons.top_activating's (resid.analyses.neurons.scan): windows of at most `window` tokens
(resid.analyses.corpus_windows) in padded batches, shards merged associatively (ties to the earlier token) on the
one driver, so the table is the same in process and on any number of Ray workers; only the reader differs:
`FeatureReader` runs each dictionary's encoder on the tensor its hook reads (captured for the batch, then dropped).
Padding and BOS positions are never scanned. The table has the columns of COLUMNS, like neurons.top_activating's
with `site` (the feature's Site label, Site(layer, part, feature=i): the site the dictionary reconstructs, as
attribution and interventions name it), `feature` for `neuron` and `activation` for `coefficient`.
`df.attrs["histogram"]` holds every scanned feature's activation histogram over every scanned token
(resid.analyses.features.histogram; its counts sum to the number of scanned tokens,
`df.attrs["provenance"]["parameters"]["tokens"]`), which features.card draws. A feature that never fired (0 at every
scanned token) has no rows: `df.attrs["never_fired"]` lists their Site labels and `df.attrs["notes"]` says so.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from resid.analyses.checks import check_choice, check_k
from resid.analyses.corpus_windows import cut_windows
from resid.analyses.distributed.execution import Execution
from resid.analyses.features import histogram
from resid.analyses.io import corpus as corpora
from resid.analyses.io.provenance import describe
from resid.analyses.neurons.keys import SIGNS, Sign, examples_frame
from resid.analyses.neurons.scan import Reader, scan_with
from resid.capture import Capture
from resid.dictionaries import CrossLayerTranscoder, Dictionary, check, feature_site
from resid.dictionaries.check import on_device
from resid.dictionaries.hooks import read
from resid.errors import ResidError, param
from resid.model import Transformer
from resid.sites import RESID_PARTS

NAMED = 10  # features the note on never-fired ones names before "and N more"
COLUMNS = ("dictionary", "site", "layer", "feature", "rank", "activation", "token_id", "token", "doc", "pos",
           "context")


@dataclass(frozen=True)
class FeatureReader(Reader):
    """The activations of the chosen features (None: all) of each dictionary (key: its index in `dictionaries`),
    ranked where non-zero, and their histograms."""

    dictionaries: tuple[Dictionary, ...]  # checked against the model (their hook points resolved)
    features: tuple[list[int] | None, ...]  # per dictionary

    def keys(self) -> list:
        return list(range(len(self.dictionaries)))

    def columns(self, model: Transformer, key: object) -> int:
        chosen = self.features[key]
        return self.dictionaries[key].d_sae if chosen is None else len(chosen)

    def kept_bytes(self, model: Transformer, width: int) -> int:
        # The residual writes the hooks read, and every dictionary's activations with their rank masks.
        stream = (2 * model.config.n_layers + 1) * model.config.d_model * model.dtype.itemsize
        return width * (stream + sum(5 * d.d_sae for d in self.dictionaries))

    def setup(self, model: Transformer) -> tuple:
        index = tuple(None if f is None else torch.tensor(f, device=model.device) for f in self.features)
        return model, on_device(self.dictionaries, model), index

    def capture(self) -> Capture:
        fields: dict[str, set[str]] = {"attn": set(), "mlp": set(), "cross": set()}
        residual = False
        for d in self.dictionaries:
            point = d.point_in
            residual |= point.site.part in RESID_PARTS or point.standardized
            if point.site.part in fields:
                fields[point.site.part] |= {point.site.what, *(["norm_scale"] if point.standardized else [])}
        if residual:  # a residual site is the sum of the writes before it
            for found in fields.values():
                found.add("out")
        return Capture(attn=fields["attn"], mlp=fields["mlp"], cross=fields["cross"], embed=residual,
                       final_norm_scale=False)

    def read(self, state: tuple, run, valid: Tensor) -> dict:
        model, dictionaries, index = state
        found = {}
        for key, d in enumerate(dictionaries):
            with torch.no_grad():
                acts = d.encode(read(run, model, d.point_in))
            if index[key] is not None:
                acts = acts.index_select(-1, index[key])
            _check_finite(d, acts, valid, index[key], model)
            found[key] = (acts, valid[..., None] & (acts != 0))
        return found

    def tally(self, state: tuple, values: Tensor, valid: Tensor) -> Tensor:
        return histogram.counts(values, valid)


def _check_finite(d: Dictionary, acts: Tensor, valid: Tensor, index: Tensor | None, model: Transformer) -> None:
    """Refuse NaN or infinite activations at scanned tokens: they have no rank and no histogram bin, so counting
    them would misplace them and ranking them would put them first or nowhere."""
    bad = (~torch.isfinite(acts) & valid[..., None]).flatten(0, -2).any(0)
    if not bool(bad.any()):
        return
    columns = bad.nonzero().flatten()
    shown = (columns if index is None else index[columns]).tolist()
    more = f" and {len(shown) - 5} more" if len(shown) > 5 else ""
    raise ResidError(
        f"Dictionary {d.name!r} gives non-finite activations (NaN or infinity) for feature(s) {shown[:5]}{more} on "
        f"the scanned tokens: its weights hold non-finite values, or its encoder overflows in {model.dtype}. Check "
        "the dictionary's files (re-export or re-download them), or load the model in float32."
    )


def top_activating(
    model: Transformer,
    dictionary: Dictionary | CrossLayerTranscoder | Sequence,  # items checked here, with a clear error
    corpus: corpora.Source,
    features: int | Sequence[int] | None = None,
    k: int = 20,
    context: int = 12,
    after: int = 4,
    sign: Sign = "positive",
    window: int = 256,
    skip_first: bool = False,
    execution: Execution | None = None,
) -> pd.DataFrame:
    """The k corpus tokens with the largest activations of each chosen feature of `dictionary` (a Dictionary or a
    list of them, e.g. resid.dictionaries.load of a per-layer set), see the module docstring.

    features: None for all, an index or a list (the same features of each dictionary). corpus, k, context, after,
    sign, window and execution (resid.analyses.Execution) as for neurons.top_activating. skip_first: leave each
    window's first position out of the ranking and the histograms. A BOS the model prepends is always left out; a
    model without one (SmolLM2) reads its first token as an attention sink, whose activations are often the largest
    of the window and say little about the feature (dictionary training leaves it out too, unless keep_bos). One row
    per (dictionary, feature, rank) with the columns of COLUMNS; `df.attrs["histogram"]`: the features' activation
    histograms."""
    check_choice(sign, "sign", SIGNS)
    found = dictionaries(model, dictionary)
    chosen = tuple(select_features(d, features) for d in found)
    k = check_k(k, "k")
    for name, value in (("context", context), ("after", after)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ResidError(f"{param(name)} must be a non-negative number of tokens, got {value!r}.")
    texts = corpora.load(corpus)
    pieces = cut_windows(model, texts, window)
    reader = FeatureReader(found, chosen)
    if not isinstance(skip_first, bool):
        raise ResidError(f"{param('skip_first')} must be True or False, got {skip_first!r}.")
    best, tallies = scan_with(model, pieces, reader, k, sign, skip_first, execution)
    df = _table(model, pieces, best, found, chosen, context, after)
    ids = [np.arange(d.d_sae) if f is None else np.asarray(f) for d, f in zip(found, chosen)]
    df.attrs["histogram"] = histogram.frame([d.name for d in found], ids, [tallies[i] for i in range(len(found))])
    scanned = int(tallies[0][0].sum())  # every scanned token is in one bin of every feature
    parameters = {"dictionaries": [d.name for d in found], "features": [None if f is None else list(f) for f in chosen],
                  "k": k, "context": context, "after": after, "sign": sign, "window": window,
                  "documents": len(texts), "windows": len(pieces), "tokens": scanned}
    df.attrs["provenance"] = describe(model, "features.top_activating", parameters)
    df.attrs["never_fired"] = never_fired(found, ids, tallies)
    if df.attrs["never_fired"]:
        silent = df.attrs["never_fired"]
        shown = ", ".join(silent[:NAMED]) + (f" and {len(silent) - NAMED} more" if len(silent) > NAMED else "")
        df.attrs["notes"] = [f"{len(silent)} of the {sum(map(len, ids))} features scanned never fired (activation 0 "
                             f"at all {scanned} scanned tokens), so the table has no rows for them: {shown} "
                             "(df.attrs['never_fired'] lists them all)."]
    return df


def never_fired(found: tuple[Dictionary, ...], ids: list[np.ndarray], tallies: Mapping[int, np.ndarray]) -> list[str]:
    """The Site labels of the scanned features whose activation was 0 at every scanned token (only the zero bin of
    their histogram is filled; `tallies` by the dictionary's index): the examples table has no row for them."""
    silent = []
    for d, features, tally in zip(found, ids, (tallies[i] for i in range(len(found))), strict=True):
        tally = np.asarray(tally)
        off = tally.sum(axis=1) == tally[:, histogram.ZERO]
        silent += [feature_site(d, int(f), found).label for f in np.asarray(features)[off]]
    return silent


def dictionaries(model: Transformer, given: Dictionary | CrossLayerTranscoder | Sequence) -> tuple[Dictionary, ...]:
    """`given` as a tuple of dictionaries checked against `model`, with distinct names."""
    found = (given,) if isinstance(given, (Dictionary, CrossLayerTranscoder)) else tuple(given)
    if not found:
        raise ResidError(f"No dictionary given: pass a resid.dictionaries.Dictionary or a non-empty list as "
                         f"{param('dictionary')}.")
    for d in found:
        if isinstance(d, CrossLayerTranscoder):
            raise ResidError(f"Cross-layer transcoder {d.name!r}: feature scans take per-layer dictionaries (a CLT's "
                             "features read every layer's MLP input).")
        if not isinstance(d, Dictionary):
            raise ResidError(f"{param('dictionary')} takes resid.dictionaries.Dictionary values, got "
                             f"{type(d).__name__}.")
    names = [d.name for d in found]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ResidError(f"Two dictionaries are named {twice[0]!r}: the table tells them apart by name, so give each "
                         "its own (dictionary.name = '...').")
    return tuple(d if d.point_in is not None else check(d, model) for d in found)


def select_features(d: Dictionary, features: int | Sequence[int] | None) -> list[int] | None:
    """Feature indices of `d`, checked and sorted (None: every feature)."""
    if features is None:
        return None
    chosen = [features] if isinstance(features, (int, np.integer)) else list(features)
    bad = [f for f in chosen if not isinstance(f, (int, np.integer)) or isinstance(f, bool) or not 0 <= f < d.d_sae]
    if bad or not chosen:
        raise ResidError(f"Features {bad or chosen} are not valid {param('features')}: dictionary {d.name!r} has "
                         f"{d.d_sae} features (0..{d.d_sae - 1}); pass None for all, an index or a non-empty list.")
    return sorted({int(f) for f in chosen})


def _table(model, pieces, best, found, chosen, context: int, after: int) -> pd.DataFrame:
    """neurons.top_activating's frame of the scan (a dictionary's index as its `layer`; the chosen features are the
    same for every dictionary, or all of each), in the features' columns."""
    df = examples_frame(model, pieces, best, list(range(len(found))), chosen[0], context, after)
    df = df.rename(columns={"neuron": "feature", "coefficient": "activation"})
    key = df.pop("layer").to_numpy()
    df.insert(0, "dictionary", np.asarray([d.name for d in found], dtype=object)[key])
    df.insert(1, "site", [feature_site(found[i], f, found).label for i, f in zip(key, df["feature"])])
    df.insert(2, "layer", np.asarray([d.point_out.site.layer for d in found], dtype=np.int64)[key])
    return pd.DataFrame(df, columns=list(COLUMNS))
