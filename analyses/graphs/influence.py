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

Only feature and logit nodes have inputs, so A is kept as its non-zero rows: `rows` [r N] with `row_nodes` [r],
the node each row is (memory linear in the nodes, not quadratic); the results equal those over the square matrix.
"""

from typing import NamedTuple

import torch
from torch import Tensor

from resid.errors import ResidError

MAX_DEPTH = 1000
CHUNK_FLOATS = 1 << 24  # influence_of_rows's rows per pass: this many floats (64 MiB) of |A| at a time


def normalized(rows: Tensor) -> Tensor:
    a = rows.abs()
    return a / a.sum(dim=1, keepdim=True).clamp(min=1e-10)


def series(matrix: Tensor, row_nodes: Tensor, weights: Tensor) -> Tensor:
    """weights @ (Â + Â² + ...) over the nodes, Â given by its rows `matrix` [r N] (node `row_nodes[i]` each)."""
    total = torch.zeros(matrix.shape[1])
    for _ in range(MAX_DEPTH):
        term = weights[row_nodes] @ matrix
        if not bool(term.any()):
            return total
        total += term
        weights = term
    raise ResidError(f"The influence series did not end after {MAX_DEPTH} terms: the graph has a cycle.")


def logit_weights(n_nodes: int, probs: Tensor) -> Tensor:
    weights = torch.zeros(n_nodes)
    weights[n_nodes - len(probs):] = probs
    return weights


def node_influence(rows: Tensor, row_nodes: Tensor, probs: Tensor) -> Tensor:
    return series(normalized(rows), row_nodes, logit_weights(rows.shape[1], probs))


def threshold_of(scores: Tensor, fraction: float) -> Tensor:
    """The score above which the highest scores hold `fraction` of their total."""
    ordered = torch.sort(scores.flatten(), descending=True).values
    cumulative = torch.cumsum(ordered, dim=0) / ordered.sum()
    index = min(int(torch.searchsorted(cumulative, torch.tensor(fraction))), len(ordered) - 1)
    return ordered[index]


class Pruned(NamedTuple):
    node_mask: Tensor  # [N] kept nodes
    edge_mask: Tensor  # [r N] kept edges, by row (as the graph's rows)
    cumulative_scores: Tensor  # [N] each node's place in the influence ranking: the share of total influence
    # held by the nodes ranked up to it
    edge_scores: Tensor  # [r N] each edge's influence score among the kept nodes' edges, as a share of their total
    # (the ranking the edge threshold cuts)


def prune(rows: Tensor, row_nodes: Tensor, probs: Tensor, n_features: int, n_tokens: int,
          node_threshold: float = 0.8, edge_threshold: float = 0.98) -> Pruned:
    for name, value in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
        if not 0.0 <= value <= 1.0:
            raise ResidError(f"{name}={value} is a fraction of the total influence: give a value in [0, 1].")
    n_nodes, n_logits = rows.shape[1], len(probs)
    weights = logit_weights(n_nodes, probs)
    influence = series(normalized(rows), row_nodes, weights)
    nodes = influence >= threshold_of(influence, node_threshold)
    fixed = n_logits + n_tokens  # tokens and logits are always kept
    nodes[-fixed:] = True
    kept = rows * nodes[row_nodes, None] * nodes[None, :]
    matrix = normalized(kept)
    edge_scores = matrix * (series(matrix, row_nodes, weights) + weights)[row_nodes, None]
    edges = edge_scores >= threshold_of(edge_scores, edge_threshold)
    previous = nodes.clone()
    _need_edges(nodes, edges, row_nodes, fixed, n_features)
    while not torch.equal(previous, nodes):  # each pass can leave more nodes without edges
        previous = nodes.clone()
        edges &= nodes[row_nodes, None] & nodes[None, :]
        _need_edges(nodes, edges, row_nodes, fixed, n_features)
    ordered, order = torch.sort(influence, descending=True)
    cumulative = torch.zeros_like(influence)
    cumulative[order] = torch.cumsum(ordered, dim=0) / ordered.sum()
    edge_scores /= edge_scores.sum().clamp_min(torch.finfo(edge_scores.dtype).tiny)  # its own tensor: no copy
    return Pruned(nodes, edges, cumulative, edge_scores)


def _need_edges(nodes: Tensor, edges: Tensor, row_nodes: Tensor, fixed: int, n_features: int) -> None:
    nodes[:-fixed] &= edges[:, :-fixed].any(0)  # features and errors need a kept outgoing edge
    has_input = torch.zeros_like(nodes)
    has_input[row_nodes] = edges.any(1)
    nodes[:n_features] &= has_input[:n_features]  # features need a kept incoming edge


def scores(rows: Tensor, row_nodes: Tensor, probs: Tensor, n_features: int, n_errors: int,
           n_tokens: int, influence: Tensor | None = None) -> tuple[float, float]:
    """(replacement score, completeness score); `influence`: node_influence of these rows, when already known."""
    weights = logit_weights(rows.shape[1], probs)
    matrix = normalized(rows)
    influence = series(matrix, row_nodes, weights) if influence is None else influence
    errors = slice(n_features, n_features + n_errors)
    tokens = slice(n_features + n_errors, n_features + n_errors + n_tokens)
    from_tokens, from_errors = influence[tokens].sum(), influence[errors].sum()
    replacement = from_tokens / (from_tokens + from_errors)
    output = influence + weights
    # nodes without inputs (errors, tokens) count as wholly not from errors, as in the square matrix's zero rows
    from_error_inputs = (matrix[:, errors].sum(dim=1) * output[row_nodes]).sum()
    completeness = (output.sum() - from_error_inputs) / output.sum()
    return float(replacement), float(completeness)


def influence_of_rows(rows: Tensor, row_nodes: Tensor, probs: Tensor, n_sources: int) -> Tensor:
    """The influence of every source from the rows computed so far while features are visited ([r n_sources],
    logit rows' nodes n_sources + i, which nothing reaches): `series`, without a normalized copy of the rows.
    Only the rows' own nodes pass influence on, so the series runs over the [r r] block of Â between the rows and
    the nodes they are (w_{k+1} = w_k Â[:, row_nodes], w_0 the logit rows' probabilities), and the sources take one
    pass over the rows: influence = (w_0 + w_1 + ...) Â, computed a chunk of rows at a time. Memory: [r r] and a
    chunk, where `series` would hold three copies of [r n_sources] (on a 4,096-token prompt, gigabytes each)."""
    chunk = max(1, CHUNK_FLOATS // max(n_sources, 1))
    scale = torch.cat([part.abs().sum(1) for part in rows.split(chunk)]).clamp(min=1e-10)  # row sums of |A|
    inside = row_nodes < n_sources  # feature rows; the logit rows' nodes are no sources
    block = torch.zeros(len(rows), len(rows))  # Â among the rows: row i is node i of this block
    block[:, inside] = rows[:, row_nodes[inside]].abs() / scale[:, None]
    w = torch.zeros(len(rows))
    w[~inside] = probs[row_nodes[~inside] - n_sources]
    total = w + series(block, torch.arange(len(rows)), w)  # w_0 + w_1 + ...
    influence = torch.zeros(n_sources)
    for part, weight in zip(rows.split(chunk), (total / scale).split(chunk), strict=True):
        influence += weight @ part.abs()
    return influence
