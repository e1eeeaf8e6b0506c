"""From an attribution graph to a circuit: the features that carry the logits' influence, grouped into a few
supernodes a reader can name ("Texas", "say a capital", "say Austin"), each with the reasons it was grouped, and
the circuit's subgraph scores.

    circuit = graphs.circuit(graph, labels=graphs.labels(model, graph, transcoders))
    circuit.supernodes            # (Supernode(name, nodes, reasons), ...), most influential first
    circuit.scores                # {"graph": (replacement, completeness), "pruned": ..., "circuit": ...}
    circuit.to_frame()            # one row per feature of the circuit: its supernode, place, influence, label
    graphs.measure(model, circuit, transcoders)   # necessity, sufficiency, each supernode ablated and steered

1. Prune: the feature nodes Graph.prune keeps at (node_threshold, edge_threshold), the nodes that carry that share of
   the logits' influence (resid.analyses.graphs.influence).
2. Group: average-linkage clustering of those features into at most `max_supernodes` groups, on a distance that
   mixes (weights WEIGHTS)
       edges        1 - the cosine of their signed edge profiles among the kept nodes (what they read: their row;
                    what they write: their column), halved into [0, 1]
       position     0 at the same prompt position, 1 otherwise
       layer        |layer difference| / n_layers
       description  1 - the Jaccard overlap of their labels' top output and input tokens (graphs.labels), when
                    labels are given (its weight is shared out among the others otherwise)
   Ties go to the lower index, so the result is the same on every run.
3. Name and explain each group: 'say " X"' when most of its features promote the same top token, else the
   prompt token at its position ('" Texas"@5') or its layer span; its reasons say how many features, where, their
   mean edge cosine, and the shared tokens.
4. Score (resid.analyses.graphs.subgraph): the graph's scores, the pruned graph's and the circuit's (the features
   outside it merged into the error nodes).
"""

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from resid.analyses.graphs import influence as inf
from resid.analyses.graphs.graph import Graph
from resid.analyses.graphs.subgraph import subgraph_scores
from resid.errors import ResidError

WEIGHTS = {"edges": 0.4, "position": 0.3, "layer": 0.2, "description": 0.1}
MAX_SUPERNODES = 12


@dataclass(frozen=True)
class Supernode:
    name: str
    nodes: tuple[int, ...]  # feature node indices into graph.features, most influential first
    reasons: tuple[str, ...]
    influence: float  # the members' influence on the logits, summed


@dataclass(frozen=True)
class Circuit:
    graph: Graph
    nodes: Tensor  # [n] the circuit's feature node indices, sorted
    supernodes: tuple[Supernode, ...]
    scores: dict  # {"graph" | "pruned" | "circuit": (replacement, completeness)}
    node_threshold: float
    edge_threshold: float
    labels: dict  # {"L_F": label} of its features ({} without labels)

    def groups(self) -> list[tuple[str, list[str]]]:
        """The supernodes as (name, node ids "L_F_P"): export.graph_json's `supernodes`."""
        ids = self.graph.node_ids()
        return [(s.name, [ids[i] for i in s.nodes]) for s in self.supernodes]

    def node_ids(self) -> list[str]:
        ids = self.graph.node_ids()
        return [ids[i] for i in self.nodes.tolist()]

    def summary(self) -> dict:
        """The circuit as plain values (the JSON's metadata.resid.circuit)."""
        return {"node_threshold": self.node_threshold, "edge_threshold": self.edge_threshold,
                "n_features": len(self.nodes), "scores": {k: list(v) for k, v in self.scores.items()},
                "supernodes": [{"name": s.name, "n_features": len(s.nodes), "influence": s.influence,
                                "reasons": list(s.reasons)} for s in self.supernodes]}

    def to_frame(self) -> pd.DataFrame:
        """One row per feature of the circuit: node, node_id, supernode, layer, position, feature, token_str,
        influence, label."""
        of = {i: s.name for s in self.supernodes for i in s.nodes}
        ids, influence = self.graph.node_ids(), self.graph.influence()
        rows = []
        for i in self.nodes.tolist():
            layer, position, feature = self.graph.features[i].tolist()
            rows.append({"node": i, "node_id": ids[i], "supernode": of[i], "layer": layer, "position": position,
                         "feature": feature, "token_str": self.graph.token_strs[position],
                         "influence": float(influence[i]), "label": self.labels.get(f"{layer}_{feature}", "")})
        return pd.DataFrame(rows, columns=["node", "node_id", "supernode", "layer", "position", "feature",
                                           "token_str", "influence", "label"])

    def __repr__(self) -> str:
        r, c = self.scores["circuit"]
        return (f"Circuit({len(self.nodes)} features in {len(self.supernodes)} supernodes, replacement {r:.3f}, "
                f"completeness {c:.3f})")


def circuit(graph: Graph, node_threshold: float = 0.8, edge_threshold: float = 0.98,
            max_supernodes: int = MAX_SUPERNODES, labels: pd.DataFrame | dict | None = None) -> Circuit:
    """The circuit of `graph` (see the module docstring). `labels`: graphs.labels' table or its {"L_F": label}
    (graphs.labels.by_key); with a table, the descriptions join the distance."""
    if not isinstance(max_supernodes, int) or isinstance(max_supernodes, bool) or max_supernodes < 1:
        raise ResidError(f"max_supernodes={max_supernodes!r}: give a positive number of groups.")
    pruned = graph.prune(node_threshold, edge_threshold)
    nodes = pruned.node_mask[:graph.n_features].nonzero().flatten()
    table = labels if isinstance(labels, pd.DataFrame) else None
    by_key = dict(zip(table["key"], table["label"], strict=True)) if table is not None else dict(labels or {})
    influence = graph.influence()
    supernodes = _supernodes(graph, nodes, pruned.node_mask, influence, max_supernodes, table)
    sizes = (graph.n_features, graph.n_errors, graph.n_pos)
    # the pruned graph's scores: its rows with the dropped edges zeroed (Graph.pruned's nodes without edges, left
    # in, change no score), from the pruning already done
    scores = {"graph": inf.scores(graph.rows, graph.row_nodes, graph.logit_probabilities, *sizes, influence=influence),
              "pruned": inf.scores(graph.rows * pruned.edge_mask, graph.row_nodes, graph.logit_probabilities, *sizes),
              "circuit": subgraph_scores(graph, nodes)}
    kept = {f"{l}_{f}" for l, _, f in graph.features[nodes].tolist()}
    return Circuit(graph, nodes, supernodes, scores, node_threshold, edge_threshold,
                   {k: v for k, v in by_key.items() if k in kept})


def distances(graph: Graph, nodes: Tensor, kept: Tensor, table: pd.DataFrame | None = None) -> Float[Tensor, "n n"]:
    """The pairwise distances [n n] of the feature nodes `nodes` (module docstring, step 2) among the kept nodes
    `kept` (a mask over every node)."""
    n = len(nodes)
    layer, position = graph.features[nodes, 0].float(), graph.features[nodes, 1]
    parts = {"edges": _edge_part(graph, nodes, kept), "position": (position[:, None] != position[None, :]).float(),
             "layer": (layer[:, None] - layer[None, :]).abs() / max(graph.n_layers, 1)}
    if table is not None:
        parts["description"] = 1 - _jaccard(graph, nodes, table)
    total = sum(WEIGHTS[k] for k in parts)
    out = sum(WEIGHTS[k] / total * v for k, v in parts.items())
    return out.fill_diagonal_(0) if n else out


def average_linkage(d: Float[Tensor, "n n"], groups: int) -> list[list[int]]:
    """Agglomerative clustering with average linkage (Lance-Williams) down to `groups` clusters; the closest pair
    merges first, ties to the lower indices; each cluster's members sorted, clusters by their first member. Each
    row's nearest cluster is cached and recomputed only when a merge touches it: about n^2 work, not n^3."""
    n = len(d)
    dist = d.double().numpy().copy()
    np.fill_diagonal(dist, np.inf)
    size = np.ones(n)
    alive = np.ones(n, dtype=bool)
    nearest = dist.argmin(1) if n else np.zeros(0, dtype=np.int64)
    best = dist[np.arange(n), nearest] if n else np.zeros(0)
    members = {i: [i] for i in range(n)}
    while len(members) > max(groups, 1):
        a = int(np.argmin(np.where(alive, best, np.inf)))  # the first row holding the smallest distance
        b = int(nearest[a])
        a, b = min(a, b), max(a, b)
        merged = (size[a] * dist[a] + size[b] * dist[b]) / (size[a] + size[b])
        dist[a], dist[:, a] = merged, merged
        dist[a, a] = np.inf
        dist[b], dist[:, b] = np.inf, np.inf
        size[a] += size[b]
        alive[b], best[b] = False, np.inf
        members[a] = sorted(members[a] + members.pop(b))
        stale = alive & ((nearest == a) | (nearest == b))
        stale[a] = True
        for i in np.flatnonzero(stale):
            nearest[i] = int(np.argmin(dist[i]))
            best[i] = dist[i, nearest[i]]
        closer = alive & (dist[:, a] < best)  # rows whose nearest is now the merged cluster
        closer |= alive & (dist[:, a] == best) & (a < nearest)  # a tie goes to the lower index, as argmin's
        nearest[closer], best[closer] = a, dist[closer, a]
    return [members[k] for k in sorted(members)]


def _supernodes(graph: Graph, nodes: Tensor, kept: Tensor, influence: Tensor, most: int,
                table: pd.DataFrame | None) -> tuple[Supernode, ...]:
    if not len(nodes):
        return ()
    d = distances(graph, nodes, kept, table)
    clusters = average_linkage(d, most)
    outputs = _tokens_of(graph, nodes, table, "outputs")
    cosine = 1 - 2 * _edge_part(graph, nodes, kept)
    out = []
    for members in clusters:
        index = nodes[members]
        order = sorted(range(len(members)), key=lambda j: (-float(influence[index[j]]), int(index[j])))
        ordered = tuple(int(index[j]) for j in order)
        name, reasons = _explain(graph, [members[j] for j in order], nodes, outputs, cosine)
        out.append(Supernode(name, ordered, reasons, float(influence[index].sum())))
    out.sort(key=lambda s: (-s.influence, s.nodes[0]))
    return tuple(_unique_names(out))


def _edge_part(graph: Graph, nodes: Tensor, kept: Tensor) -> Tensor:
    """The edge term alone ((1 - cosine) / 2), for the reasons."""
    kept_nodes = kept.nonzero().flatten()
    row_of = torch.full((graph.n_nodes,), -1, dtype=torch.long)
    row_of[graph.row_nodes] = torch.arange(len(graph.row_nodes))
    reads = graph.rows[row_of[nodes]][:, kept_nodes]
    targets = row_of[kept_nodes]
    writes = graph.rows[targets[targets >= 0]][:, nodes].T
    profile = torch.cat([_unit(reads), _unit(writes)], dim=1) / 2**0.5
    return (1 - (profile @ profile.T).clamp(-1, 1)) / 2


def _explain(graph: Graph, members: list[int], nodes: Tensor, outputs: list[list[str]],
             cosine: Tensor) -> tuple[str, tuple[str, ...]]:
    index = nodes[members]
    layers, positions = graph.features[index, 0].tolist(), graph.features[index, 1].tolist()
    span = f"L{min(layers)}" if min(layers) == max(layers) else f"L{min(layers)}-{max(layers)}"
    where = Counter(positions).most_common()
    place = ", ".join(f"{p} ({graph.token_strs[p]!r}) x{c}" for p, c in where[:3]) + (
        f" and {len(where) - 3} more positions" if len(where) > 3 else "")
    reasons = [f"{len(members)} feature{'s' if len(members) > 1 else ''} at layers {span[1:]}, positions {place}"]
    if len(members) > 1:
        within = cosine[members][:, members]
        mean = float((within.sum() - within.diagonal().sum()) / (len(members) * (len(members) - 1)))
        reasons.append(f"edge profiles: mean cosine {mean:.2f} within the group")
    top = Counter(o[0] for o in (outputs[m] for m in members) if o)
    name = None
    if top:
        token, count = top.most_common(1)[0]
        shared = Counter(t for m in members for t in set(outputs[m]))
        common = [t for t, c in shared.most_common(3) if c > 1]
        if common:
            reasons.append("shared output tokens: " + ", ".join(f"{t!r} x{shared[t]}" for t in common))
        if 2 * count > len(members) or len(members) == 1:
            name = f'say "{token.strip() or token}"'
            reasons.append(f"{count} of {len(members)} promote {token!r} most")
    if name is None:
        position, count = where[0]
        if 2 * count > len(members) or len(members) == 1:
            name = f'"{graph.token_strs[position].strip() or graph.token_strs[position]}"@{position}'
            reasons.append(f"{count} of {len(members)} sit at position {position}")
        else:
            name = f"{span} mixed"
    return f"{name} {span}" if not name.endswith("mixed") else name, tuple(reasons)


def _unique_names(supernodes: list[Supernode]) -> list[Supernode]:
    """Numbered where two groups share a name ('... #2'), so that qParams.supernodes' names stay apart."""
    seen: Counter = Counter()
    out = []
    for s in supernodes:
        seen[s.name] += 1
        name = s.name if seen[s.name] == 1 else f"{s.name} #{seen[s.name]}"
        out.append(Supernode(name, s.nodes, s.reasons, s.influence))
    return out


def _tokens_of(graph: Graph, nodes: Tensor, table: pd.DataFrame | None, column: str) -> list[list[str]]:
    if table is None:
        return [[] for _ in range(len(nodes))]
    found = dict(zip(table["key"], table[column], strict=True))
    return [list(found.get(f"{l}_{f}", [])) for l, _, f in graph.features[nodes].tolist()]


def _jaccard(graph: Graph, nodes: Tensor, table: pd.DataFrame) -> Tensor:
    """[n n] the Jaccard overlap of each pair's label tokens (top outputs, and top inputs marked apart)."""
    words = [set(o) | {"in:" + t for t in i} for o, i in zip(_tokens_of(graph, nodes, table, "outputs"),
                                                             _tokens_of(graph, nodes, table, "inputs"), strict=True)]
    vocabulary = {w: j for j, w in enumerate(sorted(set().union(*words)))} if words else {}
    x = torch.zeros(len(words), len(vocabulary))
    for i, w in enumerate(words):
        x[i, [vocabulary[t] for t in w]] = 1.0
    inter = x @ x.T
    counts = x.sum(1)
    union = counts[:, None] + counts[None, :] - inter
    return torch.where(union > 0, inter / union.clamp_min(1), torch.zeros_like(inter))


def _unit(x: Tensor) -> Tensor:
    return x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)
