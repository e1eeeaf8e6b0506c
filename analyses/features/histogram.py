"""Activation histograms of dictionary features over a corpus, on fixed bins so that shards merge by adding counts.

Glossary: a feature's activation a at a token falls in one *bin*: the zero bin (a == 0: the feature is off, most
tokens), or a bin of BINS_PER_OCTAVE per power of two of |a| between 2**LOW and 2**HIGH, on the side of its sign
(|a| beyond the range counts in the end bins). Bins that do not depend on the data are what lets every shard of a
scan count on its own and the driver add the counts, exact in any order (resid.analyses.neurons.scan tallies);
the geometric bins show activations spread over orders of magnitude, as activation densities are usually read.
Counting works from the non-zero activations alone, so a batch costs O(non-zero), never O(tokens x features).
"""

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

BINS_PER_OCTAVE = 4
LOW, HIGH = -16, 16  # 2**-16 .. 2**16: far wider than SAE activations (about 0.01 to 1000)
SIDE = (HIGH - LOW) * BINS_PER_OCTAVE  # bins per sign
N_BINS = 2 * SIDE + 1  # negative bins (most negative first), the zero bin, positive bins
ZERO = SIDE  # the zero bin's index
# one row per (dictionary, feature, non-empty bin): low / high the bin's edges (both 0 for the zero bin)
COLUMNS = ("dictionary", "feature", "low", "high", "count")


def counts(values: Float[Tensor, "batch pos n"], valid: Bool[Tensor, "batch pos"]) -> Int[Tensor, "n bin"]:
    """How many of the `valid` tokens fall in each bin, per column of `values`."""
    n = values.shape[-1]
    flat = values.reshape(-1, n)[valid.reshape(-1)]  # [tokens n]
    token, column = flat.nonzero(as_tuple=True)
    found = flat[token, column].float()
    octave = ((found.abs().log2() - LOW) * BINS_PER_OCTAVE).floor().clamp(0, SIDE - 1).long()
    index = torch.where(found > 0, ZERO + 1 + octave, ZERO - 1 - octave)
    out = torch.zeros(n * N_BINS, dtype=torch.int64, device=values.device)
    out.index_add_(0, column * N_BINS + index, torch.ones_like(index))
    out = out.view(n, N_BINS)
    out[:, ZERO] = flat.shape[0] - torch.bincount(column, minlength=n)
    return out


def edges() -> tuple[np.ndarray, np.ndarray]:
    """Each bin's (low, high) edges [N_BINS]: the zero bin is (0, 0), a negative bin has low < high < 0."""
    positive = 2.0 ** (LOW + np.arange(SIDE + 1) / BINS_PER_OCTAVE)
    low = np.concatenate([-positive[:0:-1], [0.0], positive[:-1]])
    high = np.concatenate([-positive[-2::-1], [0.0], positive[1:]])
    low[0], high[-1] = -np.inf, np.inf  # the end bins hold everything beyond the range
    low[SIDE + 1] = 0.0  # the first positive bin holds everything in (0, 2**(LOW + 1 / BINS_PER_OCTAVE))
    high[SIDE - 1] = 0.0
    return low, high


def frame(names: list[str], features: list[np.ndarray], tallies: list[np.ndarray]) -> pd.DataFrame:
    """The non-empty bins of each dictionary's features as rows of COLUMNS; tallies[i] is [n N_BINS] counts of
    dictionary names[i]'s features features[i]."""
    low, high = edges()
    frames = []
    for name, ids, tally in zip(names, features, tallies, strict=True):
        row, column = np.nonzero(tally)
        frames.append(pd.DataFrame({
            "dictionary": [name] * len(row),
            "feature": np.asarray(ids, dtype=np.int64)[row],
            "low": low[column],
            "high": high[column],
            "count": tally[row, column].astype(np.int64),
        }))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(COLUMNS))
