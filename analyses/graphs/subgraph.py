"""The graph scores of a part of a graph (a circuit): replacement and completeness as circuit-tracer defines them
(resid.analyses.graphs.influence), with every feature node outside the part merged into the error node of its layer
and position, the subgraph scores of circuit-tracer's pull request #42.

A feature left out of a circuit is, for the circuit, unexplained computation like an error term: its outgoing
edges (signed) are added to those of the error node at its (layer, position), its incoming edges are dropped (an
error node reads nothing), and the scores are taken as over the whole graph. So

    the whole graph as the circuit      the graph's own scores (nothing merged)
    no feature in the circuit           replacement = the share of the logits' influence the token nodes reach
                                        directly (every other path now starts at an error node): zero when no
                                        token writes into a logit directly
    completeness                        the influence-weighted share of the nodes' inputs that are not errors

`pruned_scores` are the scores of the pruned graph itself (its dropped nodes and edges zeroed, not merged), the
third number Neuronpedia shows beside these two.
"""

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from resid.analyses.graphs import influence as inf
from resid.analyses.graphs.graph import Graph
from resid.errors import ResidError


def merged_rows(graph: Graph, inside: Bool[Tensor, "n_features"]) -> Tensor:
    """The graph's rows [r N] with the features outside `inside` merged into their error nodes (module docstring)."""
    outside = (~inside).nonzero().flatten()
    rows = graph.rows.clone()
    layer, position = graph.features[outside, 0], graph.features[outside, 1]
    errors = graph.n_features + layer * graph.n_pos + position
    rows.index_add_(1, errors, graph.rows[:, outside])
    rows[:, outside] = 0
    rows[outside] = 0  # a feature's row is its node's: rows hold the features first
    return rows


def subgraph_scores(graph: Graph, features: Int[Tensor, "n"] | Bool[Tensor, "n_features"]) -> tuple[float, float]:
    """(replacement, completeness) of the circuit made of the feature nodes `features` (indices into
    graph.features, or a mask over them) with the graph's tokens, errors and logits."""
    inside = _mask(graph, features)
    return inf.scores(merged_rows(graph, inside), graph.row_nodes, graph.logit_probabilities, graph.n_features,
                      graph.n_errors, graph.n_pos)


def pruned_scores(graph: Graph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> tuple[float, float]:
    """(replacement, completeness) of the graph pruned at the thresholds (its dropped nodes and edges zeroed)."""
    return graph.pruned(node_threshold, edge_threshold).scores()


def _mask(graph: Graph, features: Tensor) -> Tensor:
    features = torch.as_tensor(features)
    if features.dtype == torch.bool:
        if features.shape != (graph.n_features,):
            raise ResidError(f"A mask of a circuit's features has one entry per feature node ({graph.n_features}), "
                             f"got shape {tuple(features.shape)}.")
        return features
    index = features.long().flatten()
    if len(index) and (int(index.min()) < 0 or int(index.max()) >= graph.n_features):
        raise ResidError(f"A circuit's features are feature node indices 0..{graph.n_features - 1} (Graph.to_frame's "
                         f"`node` of its features), got {index.tolist()[:10]}.")
    inside = torch.zeros(graph.n_features, dtype=torch.bool)
    inside[index] = True
    return inside
