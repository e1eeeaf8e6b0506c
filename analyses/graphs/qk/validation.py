"""QK attribution checked on the real model (resid.analyses.graphs.qk): remove a term's write from the residual the
head reads and measure the head's score and pattern, beside what the frozen bilinear form predicts.

The prediction is exact for the frozen form: with the term t at position p removed, the head's query at q is
q - [p == q] Q_t and its key at k is k - [p == k] K_t, scored by the layer's own rule (Attention.score_rule: scale,
soft cap) and normalized by the forward's softmax. The real model also re-normalizes the edited residual (its
pre-norm and q/k norm scales move), which is what the comparison measures.
"""

import dataclasses

import pandas as pd
import torch
from torch import Tensor

from resid.analyses.graphs.qk.score import ScoreAttribution
from resid.capture import Capture
from resid.components.score_rule import softmax
from resid.interventions import Add
from resid.sites import Site


@torch.no_grad()
def validate(qk, result: ScoreAttribution, top: int = 5) -> pd.DataFrame:
    """For the `top` query-side and key-side terms of largest marginal (bias terms aside), remove the term's write
    from the residual the head reads (Block.reads("attn") at its position) in the real model of `qk` (a QK) and put
    the measured score and pattern at the (first) key beside the frozen model's prediction."""
    layer, head, query = result.layer, result.head, result.query
    key = next(iter(result.weights))
    chosen = []
    for side, marginal in (("query", result.query_marginal()), ("key", result.key_marginal())):
        ranked = [s for s in marginal["site"] if not Site.parse(s).is_term]
        chosen += [(side, label) for label in ranked[:top]]
    model = qk.model
    ids = qk.rep.token_ids[None]
    capture = Capture(layers=[layer], attn={"scores", "pattern"}, mlp=frozenset(), embed=False, final_norm_scale=False)
    splices = qk.rep.transcoders.splices()
    reads = model.blocks[layer].reads("attn")
    rows = []
    for side, label in chosen:
        position = Site.parse(label).positions[0]
        terms = qk.terms(layer, position)
        vector = terms.vectors[[s.label for s in terms.sites].index(label)]
        predicted_scores = _predicted_scores(qk, layer, head, query, position, label)
        edit = Add(dataclasses.replace(reads, positions=(position,)), (-vector).to(model.dtype))
        run = model.run(ids, interventions=[edit], capture=capture, dictionaries=splices)
        record = run.stream.layers[layer].attn
        measured_scores = record.scores[0, head, query].float()
        rows.append({"side": side, "term": label, "position": position,
                     "predicted_score": float(predicted_scores[key]), "measured_score": float(measured_scores[key]),
                     "predicted_pattern": float(softmax(predicted_scores, torch.float32)[key]),
                     "measured_pattern": float(record.pattern[0, head, query, key])})
    out = pd.DataFrame(rows)
    out.attrs.update({"head": result.head_site.label, "key": key, "score": result.run_scores[key],
                      "pattern": result.pattern[key]})
    return out


def _predicted_scores(qk, layer: int, head: int, query: int, position: int, label: str) -> Tensor:
    """The head's scores at `query` over every key [key_pos] in the frozen model, the term `label` (at `position`)
    removed from the residual its layer reads there: rule.capped(rule.raw(q - [p == q] Q_t, k - [p == k] K_t))."""
    rule = qk.model.blocks[layer].attn.score_rule
    kv = rule.kv_head(head)
    scores = qk.run.stream.layers[layer].attn.scores[0, head, query].float()
    q_terms, q_vectors = qk.projected("q", layer, query)
    q = q_vectors[:, head].sum(0)
    if position == query:
        q = q - q_vectors[[s.label for s in q_terms.sites].index(label), head]
    raw = torch.full_like(scores, float("-inf"))
    for k in range(query + 1):
        if not bool(torch.isfinite(scores[k])):
            continue
        k_terms, k_vectors = qk.projected("k", layer, k)
        kk = k_vectors[:, kv].sum(0)
        if position == k:
            kk = kk - k_vectors[[s.label for s in k_terms.sites].index(label), kv]
        raw[k] = rule.raw(q[None], kk[None])[0, 0]
    return rule.capped(raw)
