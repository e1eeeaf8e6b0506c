"""Circuits from edge scores: the top k edges (or those above a threshold) by |score| (or by score), pruned to what
lies on a path from the embeddings to the logits (MIB's pruning: an edge whose writer no kept path reaches from the
embeddings, or whose reader reaches the logits by no kept path, cannot change the logits; Mueller et al. 2025).

A circuit is a [writer reader] bool mask over the edge graph (resid.analyses.circuits.graph). Reader -> node: a
head's q feeds that head; a key/value head's k and v feed every query head of its group; an MLP's input its MLP
(EdgeGraph.fed: latent readers feed every head of their layer, and under post-norms every attention reader feeds
the layer's attention node).
"""

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from resid.analyses.circuits.graph import LOGITS
from resid.analyses.circuits.seq2seq import Graph
from resid.errors import ResidError, param


def top_k(graph: Graph, scores: Float[Tensor, "writer reader"], k: int, absolute: bool = True,
          prune: bool = True) -> Bool[Tensor, "writer reader"]:
    """The k edges of highest |score| (absolute) or score, ties broken by edge order; pruned if `prune`."""
    return top_ks(graph, scores, [k], absolute, prune)[0]


def top_ks(graph: Graph, scores: Float[Tensor, "writer reader"], ks: list[int], absolute: bool = True,
           prune: bool = True) -> list[Bool[Tensor, "writer reader"]]:
    """top_k for each k of `ks`, the edges ranked once."""
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= graph.n_edges:
            raise ResidError(f"{param('k')} must be a whole number of edges from 0 to {graph.n_edges}, got {k!r}.")
    writers, readers = (torch.as_tensor(a) for a in graph.edges)
    values = scores.double()[writers, readers]
    values = values.abs() if absolute else values
    order = torch.argsort(-values.nan_to_num(float("-inf")), stable=True)
    masks = []
    for k in ks:
        mask = graph.empty()
        mask[writers[order[:k]], readers[order[:k]]] = True
        masks.append(pruned(graph, mask) if prune else mask)
    return masks


def threshold(graph: Graph, scores: Float[Tensor, "writer reader"], value: float, absolute: bool = True,
              prune: bool = True) -> Bool[Tensor, "writer reader"]:
    """The edges whose |score| (absolute) or score is at least `value`; pruned if `prune`."""
    s = scores.double().abs() if absolute else scores.double()
    mask = graph.valid & (s >= value)
    return pruned(graph, mask) if prune else mask


def pruned(graph: Graph, mask: Bool[Tensor, "writer reader"]) -> Bool[Tensor, "writer reader"]:
    """The edges of `mask` on a path from the embeddings (both stacks' in an encoder-decoder) to the logits."""
    mask = mask & graph.valid
    feeds = graph.feeds  # [reader writer]: the writer node a reader's input feeds
    stages = graph.stages()  # writer nodes in stream order, with the readers that feed them
    reached = torch.tensor([site.part == "embed" for site in graph.writers])
    for writers, columns in stages:  # forward, in stream order: a node is reached if one of its inputs is
        read = (mask[:, columns] & reached[:, None]).any(0)  # [readers of this node group]
        reached[writers] = (feeds[columns][:, writers] & read[:, None]).any(0)
    alive = torch.zeros(len(graph.readers), dtype=torch.bool)  # backward: a reader whose node reaches the logits
    alive[graph.readers.index(LOGITS)] = True
    useful = torch.zeros(len(graph.writers), dtype=torch.bool)
    for writers, columns in reversed(stages):
        useful[writers] = (mask[writers] & alive[None, :]).any(1)
        alive[columns] = (feeds[columns][:, writers] & useful[None, writers]).any(1)
    return mask & reached[:, None] & alive[None, :]
