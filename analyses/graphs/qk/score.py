"""ScoreAttribution: one head's (contrasted) score at one query split into pairs (query-side term, key-side term),
the value QK.score returns (resid.analyses.graphs.qk). Each pair is the attention's own bilinear form,
Attention.score_rule's raw score, of one term's part of the query and one term's part of the key:

    pairs()[i, j]        = raw(Q_i, K_j) = scale * Q_i . K_j
    query_marginal()[i]  = raw(Q_i, sum_j K_j)          key_marginal()[j] = raw(K_j, sum_i Q_i)
"""

from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from resid.components.score_rule import ScoreRule
from resid.errors import ResidError, param
from resid.sites import Site

PAIR_BLOCK = 1 << 22  # pairs scored at once by `top`: bounds its memory whatever the number of terms


@dataclass
class ScoreAttribution:
    """One head's (contrasted) score at one query, split into pairs of terms: rule.raw(Q[i], K[j]) sums to `raw`."""

    layer: int
    head: int
    query: int
    weights: dict[int, float]  # key position -> its weight in the contrast
    query_sites: list[Site]
    key_sites: list[Site]
    Q: Float[Tensor, "n_q d_head"]  # each query-side term's part of the head's query
    K: Float[Tensor, "n_k d_head"]  # each key-side term's part of its key, times the key's weight
    rule: ScoreRule  # the layer's: its scale makes the pairs, its soft cap the run's scores from raw ones
    run_raw: float  # the weighted raw scores of the run itself (what `raw` must equal)
    run_scores: dict[int, float]  # the run's (capped) score at each weighted key
    pattern: dict[int, float]  # the run's pattern at each weighted key

    @property
    def head_site(self) -> Site:
        return Site(self.layer, "attn", head=self.head, positions=(self.query,))

    @property
    def raw(self) -> float:
        """The sum of every pair: the weighted raw score of the frozen bilinear form (in float64)."""
        return float(self.rule.raw(self.Q.double().sum(0, keepdim=True), self.K.double().sum(0, keepdim=True)))

    def pairs(self) -> Float[Tensor, "n_q n_k"]:
        """Every pair's part, [n_q n_k] (memory n_q * n_k: prefer `top` for contrasts over every key)."""
        return self.rule.raw(self.Q, self.K)

    def query_parts(self) -> Float[Tensor, "n_q"]:
        """Each query-side term's part summed over the key side."""
        return self.rule.raw(self.Q, self.K.sum(0, keepdim=True))[:, 0]

    def key_parts(self) -> Float[Tensor, "n_k"]:
        """Each key-side term's part summed over the query side."""
        return self.rule.raw(self.K, self.Q.sum(0, keepdim=True))[:, 0]

    def query_marginal(self, n: int | None = None) -> pd.DataFrame:
        """Each query-side term's part summed over the key side, largest magnitude first (the first n: None all)."""
        return _marginal(self.query_sites, self.query_parts(), n)

    def key_marginal(self, n: int | None = None) -> pd.DataFrame:
        """Each key-side term's part summed over the query side, largest magnitude first (the first n: None all)."""
        return _marginal(self.key_sites, self.key_parts(), n)

    def top(self, n: int = 10) -> pd.DataFrame:
        """The n pairs of largest magnitude: query (site label), key (site label), value, found block by block."""
        if n < 1:
            raise ResidError(f"{param('n', n)} must be at least 1.")
        values, rows, cols = self.top_pairs(n)
        return pd.DataFrame({"query": [self.query_sites[r].label for r in rows.tolist()],
                             "key": [self.key_sites[c].label for c in cols.tolist()],
                             "value": values.double().cpu().numpy()})

    def top_pairs(self, n: int) -> tuple[Tensor, Tensor, Tensor]:
        """(values, query rows, key rows) of the n largest pairs, scanning blocks of PAIR_BLOCK pairs."""
        best_values = torch.zeros(0, device=self.Q.device)
        best_index = torch.zeros(0, dtype=torch.long, device=self.Q.device)
        width = len(self.key_sites)
        step = max(1, PAIR_BLOCK // max(width, 1))
        for start in range(0, len(self.query_sites), step):
            block = self.rule.raw(self.Q[start:start + step], self.K).flatten()
            if n == 1 and not len(best_values):  # the largest alone: an argmax, no sort
                best = block.abs().argmax()
                best_values, best_index = block[best][None], (best + start * width)[None]
                continue
            values = torch.cat([best_values, block])
            index = torch.cat([best_index, torch.arange(len(block), device=block.device) + start * width])
            keep = values.abs().topk(min(n, len(values))).indices
            best_values, best_index = values[keep], index[keep]
        return best_values, best_index // width, best_index % width

    def __repr__(self) -> str:
        keys = ", ".join(f"{w:+.3g}*k{p}" for p, w in list(self.weights.items())[:4])
        more = ", ..." if len(self.weights) > 4 else ""
        return (f"ScoreAttribution({self.head_site.label} vs [{keys}{more}]: raw {self.raw:.4g} from "
                f"{len(self.query_sites)} x {len(self.key_sites)} terms)")


def _marginal(sites: list[Site], values: Tensor, n: int | None = None) -> pd.DataFrame:
    order = values.abs().argsort(descending=True)[:n].tolist()  # labels made for the rows kept only
    return pd.DataFrame({"site": [sites[i].label for i in order], "value": values[order].double().cpu().numpy()})
