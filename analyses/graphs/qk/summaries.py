"""QK attribution summed up for many heads (resid.analyses.graphs.qk): one row per head with its strongest pair and
terms (QK.heads, `resid qk` without --head), and the plain-JSON summaries an attribution graph's viewer shows for
the heads that carry its edges (QK.summaries, the graph JSON's "qk" key). Every number is a ScoreAttribution's."""

from collections.abc import Iterable

import pandas as pd
import torch

from resid.sites import Site


@torch.no_grad()
def head_rows(qk, query: int = -1, versus: int | str | None = None,
              layers: Iterable[int] | None = None) -> pd.DataFrame:
    """Every head of `layers` (None: all) of `qk` (a QK) at position `query`: its score at the key it attends to
    most (or its contrast `versus`, as in QK.score), with the strongest query-side term, key-side term and pair.
    One row per head: head (site), key, pattern, score, raw, query_term, query_value, key_term, key_value,
    pair_query, pair_key, pair_value. Layer by layer, so memory holds one layer's projected terms."""
    config = qk.model.config
    layers = range(config.n_layers) if layers is None else [Site(l, "attn").resolve(config).layer for l in layers]
    rows = []
    for layer in layers:
        for head in range(config.n_heads):
            result = qk.score(layer, head, query=query, versus=versus)
            key = next(iter(result.weights))
            q_side, k_side = result.query_parts(), result.key_parts()
            i, j = int(q_side.abs().argmax()), int(k_side.abs().argmax())
            value, row, col = result.top_pairs(1)
            rows.append({"head": result.head_site.label, "key": key, "pattern": result.pattern[key],
                         "score": result.run_scores[key], "raw": result.raw,
                         "query_term": result.query_sites[i].label, "query_value": float(q_side[i]),
                         "key_term": result.key_sites[j].label, "key_value": float(k_side[j]),
                         "pair_query": result.query_sites[int(row[0])].label,
                         "pair_key": result.key_sites[int(col[0])].label, "pair_value": float(value[0])})
        qk.forget(layer)
    return pd.DataFrame(rows)


@torch.no_grad()
def summarize(qk, triples: Iterable[tuple[Site, int]], top: int = 6) -> dict[str, dict]:
    """For each (head Site at a query position, key position) in `triples`: the score, the pattern, its top pairs
    and terms, and the contrast with the pattern-weighted mean (what a viewer shows for a head that carries an
    edge). Keyed "<head site>-><key>", e.g. "layers[3].attn.head[5]@7->2"; plain JSON values."""
    out = {}
    for site, key in triples:
        name = f"{site.label}->{int(key)}"
        if name in out:
            continue
        entry = {}
        for versus in (None, "mean"):
            result = qk.score(site, key=int(key), versus=versus)
            queries, keys = result.query_marginal(top), result.key_marginal(top)
            part = {"raw": result.raw, "run_raw": result.run_raw,
                    "pairs": [[r.query, r.key, float(r.value)] for r in result.top(top).itertuples()],
                    "query_terms": [[r.site, float(r.value)] for r in queries.itertuples()],
                    "key_terms": [[r.site, float(r.value)] for r in keys.itertuples()]}
            if versus is None:
                entry.update(score=result.run_scores[int(key)], pattern=result.pattern[int(key)], **part)
            else:
                entry["versus_mean"] = part
        out[name] = entry
    return out
