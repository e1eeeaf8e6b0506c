"""Which feature rows a graph computes, and in what order (resid.analyses.graphs.attribute).

    every_row              every active feature: batches sorted by (layer, position), so a batch's sweep only
                           spans the layers and positions below its highest target; rows written in place
    most_influential_rows  at most `limit` features: after the logit rows, repeatedly rank the unvisited features
                           by their influence on the logits as the rows computed so far tell it (the series of
                           resid.analyses.graphs.influence) and compute the next `update_interval` batches of the
                           top ones, as circuit-tracer's max_feature_nodes does

Both return (rows [n_selected + n_logits, N], the selected features' indices), N the graph's nodes: the selected
features, every error and token node, the logits; rows in that order, the logits' last. The batches are computed
by resid.analyses.graphs.rows.RowSweeps, in process or on the executor's workers: every_row's, the logits' with
them, in one map; most_influential_rows's logit rows first, then each round in one map (the ranking between rounds
stays here, on the driver).
"""

import torch
from torch import Tensor

from resid.analyses.graphs.influence import influence_of_rows
from resid.analyses.graphs.rows import Batch, RowSweeps, feature_batches


def every_row(sweeps: RowSweeps, logits: list[Batch], batch_size: int) -> Tensor:
    """Every feature's rows and the logits' (`logits`: their batches), all in one map."""
    rep, sweeper = sweeps.rep, sweeps.sweeper
    n_features, n_sources, n_logits = sweeper.n_features, sweeper.n_sources, sum(len(b) for b in logits)
    rows = torch.zeros(n_features + n_logits, n_sources + n_logits)
    order = torch.argsort(rep.features[:, 0] * rep.n_pos + rep.features[:, 1], stable=True)
    batches = feature_batches(order, batch_size)
    starts = torch.cumsum(torch.tensor([0] + [len(b) for b in logits]), 0).tolist()
    for index, found in sweeps.each([*batches, *logits]):  # written as they arrive: no second copy of the rows
        if index < len(batches):
            rows[batches[index].features, :n_sources] = found
        else:
            at = n_features + starts[index - len(batches)]
            rows[at:at + len(found), :n_sources] = found
    return rows


def most_influential_rows(sweeps: RowSweeps, logit_rows: Tensor, probs: Tensor, limit: int,
                          batch_size: int, update_interval: int) -> tuple[Tensor, Tensor]:
    n_features, n_sources = sweeps.sweeper.n_features, sweeps.sweeper.n_sources
    visited = torch.zeros(n_features, dtype=torch.bool)
    computed, nodes = [logit_rows], [torch.arange(len(probs)) + n_sources]  # logits: node indices past the sources
    count = 0
    while count < limit:
        scores = influence_of_rows(torch.cat(computed), torch.cat(nodes), probs, n_sources)[:n_features]
        ranked = torch.argsort(scores, descending=True)
        pending = ranked[~visited[ranked]][:min(update_interval * batch_size, limit - count)]
        batches = feature_batches(pending, batch_size)
        computed.extend(sweeps.all(batches))  # one round: its batches at once, in order
        nodes.extend(batch.features for batch in batches)
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
