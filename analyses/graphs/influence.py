"""Influence on the logits, pruning and the graph scores, as circuit-tracer defines them (Ameisen et al. 2025).

With A the adjacency matrix (rows: targets, columns: sources) and Â its absolute values with each row scaled to
sum to 1, a node's influence is how much of the logits' probability mass reaches it along every path:

    influence = w Â + w Â² + ...      w: the logit nodes' probabilities (zero elsewhere)

The graph is a DAG, so the series ends after at most its depth in terms.

    prune            keep the nodes holding `node_threshold` of the total influence (tokens and logits always),
                     then the edges holding `edge_threshold` of the edge scores Â[t, s] * (influence + w)[t] of the
                     kept subgraph, then repeatedly drop features without kept incoming edges and features / errors
                     without kept outgoing ones
    replacement      the share of the influence reaching tokens rather than errors: tokens / (tokens + errors)
    completeness     the influence-weighted share of each node's (normalized) inputs that are not errors
"""

from typing import NamedTuple

import torch
from torch import Tensor

from resid.errors import ResidError

MAX_DEPTH = 1000


def normalized(adjacency: Tensor) -> Tensor:
    a = adjacency.abs()
    return a / a.sum(dim=1, keepdim=True).clamp(min=1e-10)


def series(matrix: Tensor, weights: Tensor) -> Tensor:
    """weights @ (M + M² + ...) for a nilpotent M (a DAG's matrix)."""
    term = weights @ matrix
    total = term.clone()
    for _ in range(MAX_DEPTH):
        if not bool(term.any()):
            return total
        term = term @ matrix
        total += term
    raise ResidError(f"The influence series did not end after {MAX_DEPTH} terms: the graph has a cycle.")


def influence(rows: Tensor, row_nodes: Tensor, probs: Tensor, n_sources: int) -> Tensor:
    """The influence on the logits of every source, from the rows computed so far ([r n_sources], each row the
    node `row_nodes[i]`: a feature index, or n_sources + i for logit i): the series above over those rows."""
    matrix = normalized(rows)
    weights = torch.zeros(n_sources + len(probs))
    weights[n_sources:] = probs
    total = torch.zeros(n_sources)
    for _ in range(MAX_DEPTH):
        term = weights[row_nodes] @ matrix
        if not bool(term.any()):
            return total
        total += term
        weights = torch.cat([term, torch.zeros(len(probs))])
    raise ResidError(f"The influence series did not end after {MAX_DEPTH} terms.")


def logit_weights(n_nodes: int, probs: Tensor) -> Tensor:
    weights = torch.zeros(n_nodes)
    weights[n_nodes - len(probs):] = probs
    return weights


def node_influence(adjacency: Tensor, probs: Tensor) -> Tensor:
    return series(normalized(adjacency), logit_weights(adjacency.shape[0], probs))


def threshold_of(scores: Tensor, fraction: float) -> Tensor:
    """The score above which the highest scores hold `fraction` of their total."""
    ordered = torch.sort(scores.flatten(), descending=True).values
    cumulative = torch.cumsum(ordered, dim=0) / ordered.sum()
    index = min(int(torch.searchsorted(cumulative, torch.tensor(fraction))), len(ordered) - 1)
    return ordered[index]


class Pruned(NamedTuple):
    node_mask: Tensor  # [n] kept nodes
    edge_mask: Tensor  # [n n] kept edges
    cumulative_scores: Tensor  # [n] each node's place in the influence ranking: the share of total influence
    # held by the nodes ranked up to it


def prune(adjacency: Tensor, probs: Tensor, n_features: int, n_tokens: int, node_threshold: float = 0.8,
          edge_threshold: float = 0.98) -> Pruned:
    for name, value in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
        if not 0.0 <= value <= 1.0:
            raise ResidError(f"{name}={value} is a fraction of the total influence: give a value in [0, 1].")
    n_logits = len(probs)
    weights = logit_weights(adjacency.shape[0], probs)
    influence_ = series(normalized(adjacency), weights)
    nodes = influence_ >= threshold_of(influence_, node_threshold)
    fixed = n_logits + n_tokens  # tokens and logits are always kept
    nodes[-fixed:] = True
    kept = adjacency.clone()
    kept[~nodes] = 0
    kept[:, ~nodes] = 0
    matrix = normalized(kept)
    edge_scores = matrix * (series(matrix, weights) + weights)[:, None]
    edges = edge_scores >= threshold_of(edge_scores, edge_threshold)
    previous = nodes.clone()
    _need_edges(nodes, edges, fixed, n_features)
    while not torch.equal(previous, nodes):  # each pass can leave more nodes without edges
        previous = nodes.clone()
        edges[~nodes] = False
        edges[:, ~nodes] = False
        _need_edges(nodes, edges, fixed, n_features)
    ordered, order = torch.sort(influence_, descending=True)
    cumulative = torch.zeros_like(influence_)
    cumulative[order] = torch.cumsum(ordered, dim=0) / ordered.sum()
    return Pruned(nodes, edges, cumulative)


def _need_edges(nodes: Tensor, edges: Tensor, fixed: int, n_features: int) -> None:
    nodes[:-fixed] &= edges[:, :-fixed].any(0)  # features and errors need a kept outgoing edge
    nodes[:n_features] &= edges[:n_features].any(1)  # features need a kept incoming edge


def scores(adjacency: Tensor, probs: Tensor, n_features: int, n_errors: int, n_tokens: int) -> tuple[float, float]:
    """(replacement score, completeness score)."""
    weights = logit_weights(adjacency.shape[0], probs)
    matrix = normalized(adjacency)
    influence_ = series(matrix, weights)
    errors = slice(n_features, n_features + n_errors)
    tokens = slice(n_features + n_errors, n_features + n_errors + n_tokens)
    from_tokens, from_errors = influence_[tokens].sum(), influence_[errors].sum()
    replacement = from_tokens / (from_tokens + from_errors)
    non_error = 1 - matrix[:, errors].sum(dim=1)
    output = influence_ + weights
    completeness = (non_error * output).sum() / output.sum()
    return float(replacement), float(completeness)
