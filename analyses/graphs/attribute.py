"""`attribute(model, prompt, transcoders)`: the attribution graph of a prompt's next-token prediction.

    1. replace   run the prompt with every MLP replaced by its transcoder (error kept), freeze patterns and norm
                 scales (resid.analyses.graphs.replacement)
    2. logits    the logit nodes: the most likely next tokens until their probabilities sum to
                 `desired_logit_prob`, at most `max_n_logits`; each reads logit - mean logit
    3. rows      the direct effect of every source on each logit, then on each active feature, in batches of
                 `batch_size` targets per backward sweep (resid.analyses.graphs.edges). With `max_feature_nodes`
                 below the number of active features, features are visited in order of their influence on the
                 logits as far as the rows computed so far tell it (recomputed every `update_interval` batches),
                 and the graph keeps the visited ones, as circuit-tracer does.

Every edge is exact for the local replacement model: with the freezes the model is linear in the node writes, and
the rows are computed through its transposed maps, not estimated.
"""

import time

import torch

from resid.analyses.graphs.edges import Sweeper, Targets
from resid.analyses.graphs.graph import Graph
from resid.analyses.graphs.influence import influence_of_rows
from resid.analyses.graphs.replacement import Replacement, replace
from resid.errors import ResidError, param


@torch.no_grad()
def attribute(model, prompt, transcoders, *, max_n_logits: int = 10, desired_logit_prob: float = 0.95,
              batch_size: int = 64, max_feature_nodes: int | None = None, update_interval: int = 4,
              skip_bos: bool | None = None) -> Graph:
    """The attribution graph of `prompt`'s prediction at its last position through `transcoders` (per-layer
    transcoders, one per layer in any order, or a cross-layer transcoder). skip_bos: position 0's features and
    errors are no nodes (their writes are constants), as circuit-tracer's zero_bos; None (default): when the
    prompt starts with the tokenizer's BOS token, as circuit-tracer decides it."""
    if max_n_logits < 1:
        raise ResidError(f"{param('max_n_logits', max_n_logits)} must be at least 1.")
    if not 0 < desired_logit_prob <= 1:
        raise ResidError(f"{param('desired_logit_prob', desired_logit_prob)} is a probability in (0, 1].")
    if batch_size < 1:
        raise ResidError(f"{param('batch_size', batch_size)} must be at least 1.")
    started = time.perf_counter()
    rep = replace(model, prompt, transcoders, skip_bos=skip_bos)
    tokens, probs, vectors = salient_logits(model, rep, max_n_logits, desired_logit_prob)
    sweeper = Sweeper(rep)
    n_features, n_logits, last = sweeper.n_features, len(tokens), rep.n_pos - 1
    layers = rep.n_layers
    logit_rows = torch.cat([sweeper.sweep(Targets(torch.full((len(chunk),), layers), torch.full((len(chunk),), last),
                                                  chunk)) for chunk in vectors.split(batch_size)])
    limit = n_features if max_feature_nodes is None else min(max_feature_nodes, n_features)
    if limit < 0:
        raise ResidError(f"{param('max_feature_nodes', max_feature_nodes)} must be at least 0.")
    order = _visit_order(rep, sweeper, logit_rows, probs, limit, batch_size, update_interval)
    feature_rows = order.rows
    selected = order.visited
    # columns: the selected features, then every error and token node; rows in node order
    columns = torch.cat([selected, torch.arange(n_features, sweeper.n_sources)])
    rows = torch.zeros(len(selected) + n_logits, len(columns) + n_logits)
    rows[:len(selected), :len(columns)] = feature_rows[:, columns]
    rows[len(selected):, :len(columns)] = logit_rows[:, columns]
    del feature_rows, order
    uncapped = rep.uncapped
    return Graph(
        model_name=model.name, token_ids=rep.token_ids.cpu(), token_strs=_token_strs(model, rep.token_ids),
        n_layers=layers, features=rep.features[selected].cpu(), activations=rep.activations[selected].cpu(),
        pre_activations=rep.pre_activations[selected].cpu(), active_features=rep.features.cpu(),
        logit_tokens=tokens.cpu(), logit_probabilities=probs.cpu(),
        logit_values=(uncapped[tokens] - uncapped.mean()).cpu(), logit_strs=_token_strs(model, tokens),
        rows=rows,
        transcoders=rep.transcoders.name, skip_bos=rep.skip_bos,
        metadata={"seconds": time.perf_counter() - started, "n_active_features": n_features,
                  "batch_size": batch_size, "max_feature_nodes": max_feature_nodes},
    )


def salient_logits(model, rep: Replacement, max_n_logits: int, desired_logit_prob: float):
    """(token ids, probabilities, read-out vectors [k d_model] after the final norm: W_U[:, t] - mean_v W_U)."""
    probs = torch.softmax(rep.logits, dim=-1)
    top_p, top = torch.topk(probs, min(max_n_logits, probs.shape[0]))
    cutoff = int(torch.searchsorted(torch.cumsum(top_p, 0), torch.tensor(desired_logit_prob))) + 1
    top_p, top = top_p[:cutoff], top[:cutoff]
    weight = model.readout.unembed.weight.detach().float()  # [d_vocab d_model]
    return top, top_p, weight[top] - weight.mean(0)


class _Visited:
    def __init__(self, rows: torch.Tensor, visited: torch.Tensor):
        self.rows, self.visited = rows, visited


def _visit_order(rep: Replacement, sweeper: Sweeper, logit_rows: torch.Tensor, probs: torch.Tensor, limit: int,
                 batch_size: int, update_interval: int) -> _Visited:
    """The rows of the features visited (all of them, or the `limit` most influential as the rows computed so far
    rank them), in feature order."""
    n_features = sweeper.n_features
    features = rep.features

    def rows_of(index: torch.Tensor) -> torch.Tensor:
        out = []
        for chunk in index.split(batch_size):
            layer = features[chunk, 0]
            vectors = torch.zeros(len(chunk), rep.inputs[0].shape[-1])
            for l in layer.unique().tolist():
                here = (layer == l).nonzero().flatten()
                vectors[here] = rep.transcoders.encoder(l, features[chunk[here], 2])
            out.append(sweeper.sweep(Targets(layer, features[chunk, 1], vectors)))
        return torch.cat(out) if out else torch.zeros(0, sweeper.n_sources)

    if limit == n_features:  # every feature: batches by layer (top down) keep each sweep short
        order = torch.argsort(features[:, 0] * rep.n_pos + features[:, 1], stable=True)
        rows = torch.zeros(n_features, sweeper.n_sources)
        if n_features:
            rows[order] = rows_of(order)
        return _Visited(rows, torch.arange(n_features))
    visited = torch.zeros(n_features, dtype=torch.bool)
    computed_rows = [logit_rows]
    computed_index = [torch.arange(len(probs)) + sweeper.n_sources]  # logits as node indices past the sources
    done: list[torch.Tensor] = []
    while int(visited.sum()) < limit:
        rows_so_far = torch.cat(computed_rows)
        index_so_far = torch.cat(computed_index)
        scores = influence_of_rows(rows_so_far, index_so_far, probs, sweeper.n_sources)[:n_features]
        ranked = torch.argsort(scores, descending=True)
        pending = ranked[~visited[ranked]][:min(update_interval * batch_size, limit - int(visited.sum()))]
        new = rows_of(pending)
        visited[pending] = True
        computed_rows.append(new)
        computed_index.append(pending)
        done.append(pending)
    index = torch.cat(done) if done else torch.zeros(0, dtype=torch.long)
    rows = torch.cat(computed_rows[1:]) if len(computed_rows) > 1 else torch.zeros(0, sweeper.n_sources)
    order = torch.argsort(index)
    return _Visited(rows[order], index[order])


def _token_strs(model, ids: torch.Tensor) -> list[str]:
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        return [str(int(i)) for i in ids]
    return [tokenizer.decode([int(i)]) for i in ids]
