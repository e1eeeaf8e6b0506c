"""Which feature rows a graph computes, and in what order (resid.analyses.graphs.attribute).

    every_row              every active feature: batches sorted by (layer, position), so a batch's sweep only
                           spans the layers and positions below its highest target; rows written in place
    most_influential_rows  at most `limit` features: after the logit rows, repeatedly rank the unvisited features
                           by their influence on the logits as the rows computed so far tell it (the series of
                           resid.analyses.graphs.influence) and compute the next `update_interval` batches of the
                           top ones, as circuit-tracer's max_feature_nodes does

Both return (rows [n_selected + n_logits, N], the selected features' indices), N the graph's nodes: the selected
features, every error and token node, the logits; rows in that order, the logits' last. most_influential_rows
holds the rows it computes once, [visited + logits, n_sources] (every active feature a column until the ranking
ends), and ranks from them in place (influence_of_rows): its memory is that buffer, linear in the prompt.

The batches are computed by resid.analyses.graphs.rows.RowSweeps, through the driver, in process or on the
executor's workers: every_row's, the logits' with them, in one drive; most_influential_rows's logit rows first, then
each round in one drive (the ranking between rounds stays here, on the driver).
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

    def write(index: int, found: Tensor) -> None:  # as they arrive: no second copy of the rows
        if index < len(batches):
            rows[batches[index].features, :n_sources] = found
        else:
            at = n_features + starts[index - len(batches)]
            rows[at:at + len(found), :n_sources] = found

    sweeps.each([*batches, *logits], write)
    return rows


def most_influential_rows(sweeps: RowSweeps, logit_rows: Tensor, probs: Tensor, limit: int,
                          batch_size: int, update_interval: int) -> tuple[Tensor, Tensor]:
    n_features, n_sources, n_logits = sweeps.sweeper.n_features, sweeps.sweeper.n_sources, len(probs)
    # every row computed, in one buffer: the logits' first, then the features' in visiting order, so the rows so
    # far are one view (found[:n_logits + count]) and are never copied; unwritten rows are never touched (empty)
    found = torch.empty(n_logits + limit, n_sources)
    found[:n_logits] = logit_rows
    visits = torch.zeros(limit, dtype=torch.long)  # the feature of each visited row, in visiting order
    visited = torch.zeros(n_features, dtype=torch.bool)
    logit_nodes = torch.arange(n_logits) + n_sources  # logits: node indices past the sources
    count = 0
    while count < limit:
        nodes = torch.cat([logit_nodes, visits[:count]])
        scores = influence_of_rows(found[:n_logits + count], nodes, probs, n_sources)[:n_features]
        ranked = torch.argsort(scores, descending=True)
        pending = ranked[~visited[ranked]][:min(update_interval * batch_size, limit - count)]
        batches = feature_batches(pending, batch_size)
        starts = torch.cumsum(torch.tensor([0] + [len(b) for b in batches]), 0).tolist()

        def write(index: int, rows: Tensor, count: int = count) -> None:  # one round: written as they arrive
            at = n_logits + count + starts[index]
            found[at:at + len(rows)] = rows

        sweeps.each(batches, write)
        visits[count:count + len(pending)] = pending
        visited[pending] = True
        count += len(pending)
    order = torch.argsort(visits)
    selected = visits[order]
    columns = torch.cat([selected, torch.arange(n_features, n_sources)])
    rows = torch.zeros(count + n_logits, len(columns) + n_logits)
    rows[:count, :len(columns)] = found[n_logits:][:, columns][order]
    rows[count:, :len(columns)] = found[:n_logits][:, columns]
    return rows, selected
