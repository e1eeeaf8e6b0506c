"""Which feature rows a graph computes, and in what order (resid.analyses.graphs.attribute).

    every_row              every active feature: batches sorted by (layer, position), so a batch's sweep only
                           spans the layers and positions below its highest target; rows written in place
    most_influential_rows  at most `limit` features: after the logit rows, repeatedly rank the unvisited features
                           by their influence on the logits as the rows computed so far tell it (the series of
                           resid.analyses.graphs.influence) and compute the next `update_interval` batches of the
                           top ones, as circuit-tracer's max_feature_nodes does

Both return (rows [n_selected + n_logits, N], the selected features' indices), N the graph's nodes: the selected
features, every error and token node, the logits; rows in that order, the logits' last.
"""

import torch
from torch import Tensor

from resid.analyses.graphs.edges import Sweeper, Targets
from resid.analyses.graphs.influence import influence_of_rows
from resid.analyses.graphs.replacement import Replacement


def _sweep_features(rep: Replacement, sweeper: Sweeper, index: Tensor) -> Tensor:
    """The rows [len(index) n_sources] of these features (one sweep)."""
    features = rep.features[index]
    layer = features[:, 0]
    vectors = torch.zeros(len(index), rep.inputs[0].shape[-1], device=rep.embed.device)
    for l in layer.unique().tolist():
        here = (layer == l).nonzero().flatten()
        vectors[here] = rep.transcoders.encoder(l, features[here, 2])
    return sweeper.sweep(Targets(layer, features[:, 1], vectors))


def every_row(rep: Replacement, sweeper: Sweeper, logit_rows: Tensor, batch_size: int) -> Tensor:
    n_features, n_sources, n_logits = sweeper.n_features, sweeper.n_sources, len(logit_rows)
    rows = torch.zeros(n_features + n_logits, n_sources + n_logits)
    rows[n_features:, :n_sources] = logit_rows
    order = torch.argsort(rep.features[:, 0] * rep.n_pos + rep.features[:, 1], stable=True)
    for chunk in order.split(batch_size):
        rows[chunk, :n_sources] = _sweep_features(rep, sweeper, chunk)
    return rows


def most_influential_rows(rep: Replacement, sweeper: Sweeper, logit_rows: Tensor, probs: Tensor, limit: int,
                          batch_size: int, update_interval: int) -> tuple[Tensor, Tensor]:
    n_features, n_sources = sweeper.n_features, sweeper.n_sources
    visited = torch.zeros(n_features, dtype=torch.bool)
    computed, nodes = [logit_rows], [torch.arange(len(probs)) + n_sources]  # logits: node indices past the sources
    count = 0
    while count < limit:
        scores = influence_of_rows(torch.cat(computed), torch.cat(nodes), probs, n_sources)[:n_features]
        ranked = torch.argsort(scores, descending=True)
        pending = ranked[~visited[ranked]][:min(update_interval * batch_size, limit - count)]
        for chunk in pending.split(batch_size):
            computed.append(_sweep_features(rep, sweeper, chunk))
            nodes.append(chunk)
        visited[pending] = True
        count += len(pending)
    index = torch.cat(nodes[1:]) if count else torch.zeros(0, dtype=torch.long)
    order = torch.argsort(index)
    selected = index[order]
    feature_rows = torch.cat(computed[1:])[order] if count else torch.zeros(0, n_sources)
    columns = torch.cat([selected, torch.arange(n_features, n_sources)])
    rows = torch.zeros(count + len(probs), len(columns) + len(probs))
    rows[:count, :len(columns)] = feature_rows[:, columns]
    rows[count:, :len(columns)] = logit_rows[:, columns]
    return rows, selected
