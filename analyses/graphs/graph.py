"""An attribution graph: nodes, the adjacency matrix of direct effects, and what is computed from it.

Nodes, in circuit-tracer's order (so its tools read the matrix as is):

    features   the visited active features (layer, position, feature), sorted      site layers[L].mlp.feature[F]@P
    errors     one per layer and position, layer by layer                          site layers[L].mlp.error@P
    tokens     one per position                                                    site embed@P
    logits     the salient next tokens, most likely first                          site logits.token[T]@P

`adjacency[t, s]` is the direct effect of node s on node t: on a feature's pre-activation, or on a logit node's
value (logit - mean logit). Rows of errors and tokens are zero (nothing writes into them), so the graph keeps only
the rows of features and logits (`rows`, [n_features + n_logits, N]; `row_nodes` says which node each is) and builds
the square `adjacency` only when asked: memory linear in the number of nodes.
"""

import dataclasses
from dataclasses import dataclass, field

import pandas as pd
import torch
from torch import Tensor

from resid.analyses.graphs import influence as inf
from resid.sites import Site


@dataclass
class Graph:
    model_name: str
    token_ids: Tensor  # [pos]
    token_strs: list[str]
    n_layers: int
    features: Tensor  # [n 3] (layer, position, feature) of the feature nodes
    activations: Tensor  # [n]
    pre_activations: Tensor  # [n]: each feature node's value
    active_features: Tensor  # [m 3]: every active feature (the feature nodes are these or a subset)
    logit_tokens: Tensor  # [k]
    logit_probabilities: Tensor  # [k]
    logit_values: Tensor  # [k]: logit - mean logit (before a final soft cap)
    logit_strs: list[str]
    rows: Tensor  # [n_features + n_logits, N]: the feature nodes' rows, then the logit nodes'

    transcoders: str
    skip_bos: bool = False
    metadata: dict = field(default_factory=dict)

    # --- sizes and slices -----------------------------------------------------------------------------------
    @property
    def n_pos(self) -> int:
        return len(self.token_ids)

    @property
    def n_features(self) -> int:
        return len(self.features)

    @property
    def n_errors(self) -> int:
        return self.n_layers * self.n_pos

    @property
    def n_logits(self) -> int:
        return len(self.logit_tokens)

    @property
    def n_nodes(self) -> int:
        return self.rows.shape[1]

    @property
    def row_nodes(self) -> Tensor:
        """The node of each row: the feature nodes, then the logit nodes."""
        return torch.cat([torch.arange(self.n_features), torch.arange(self.n_nodes - self.n_logits, self.n_nodes)])

    @property
    def adjacency(self) -> Tensor:
        """The square [N N] matrix (zero rows for errors and tokens): N^2 floats, for small graphs."""
        square = torch.zeros(self.n_nodes, self.n_nodes)
        square[self.row_nodes] = self.rows
        return square

    @property
    def n_edges(self) -> int:
        return int((self.rows != 0).sum())

    def kinds(self) -> list[str]:
        return (["feature"] * self.n_features + ["error"] * self.n_errors + ["token"] * self.n_pos
                + ["logit"] * self.n_logits)

    def values(self) -> Tensor:
        """Each node's value: a feature's pre-activation, a logit node's logit - mean logit, NaN for errors and
        tokens (sources only)."""
        nan = torch.full((self.n_errors + self.n_pos,), float("nan"))
        return torch.cat([self.pre_activations, nan, self.logit_values])

    def sites(self) -> list[Site]:
        """The Site of every node: a feature of the transcoder at its layer's MLP, an error term there, a token's
        embedding, a logit (its token's, at the last position)."""
        out = [Site(int(l), "mlp", feature=int(f), positions=(int(p),)) for l, p, f in self.features.tolist()]
        out += [Site(l, "mlp", field="error", positions=(p,)) for l in range(self.n_layers) for p in range(self.n_pos)]
        out += [Site(None, "embed", positions=(p,)) for p in range(self.n_pos)]
        last = self.n_pos - 1
        return out + [Site(None, "logits", token=int(t), positions=(last,)) for t in self.logit_tokens.tolist()]

    # --- analyses -------------------------------------------------------------------------------------------
    def influence(self) -> Tensor:
        """Each node's influence on the logits (resid.analyses.graphs.influence)."""
        return inf.node_influence(self.rows, self.row_nodes, self.logit_probabilities)

    def prune(self, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> inf.Pruned:
        return inf.prune(self.rows, self.row_nodes, self.logit_probabilities, self.n_features, self.n_pos,
                         node_threshold, edge_threshold)

    def scores(self) -> tuple[float, float]:
        """(replacement score, completeness score)."""
        return inf.scores(self.rows, self.row_nodes, self.logit_probabilities, self.n_features, self.n_errors,
                          self.n_pos)

    def pruned(self, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> "Graph":
        """The graph with only the kept feature nodes and edges (every error, token and logit node stays, so the
        layout is unchanged; pruned errors keep their node with no edges)."""
        result = self.prune(node_threshold, edge_threshold)
        keep = result.node_mask[:self.n_features]
        index = torch.cat([keep.nonzero().flatten(), torch.arange(self.n_features, self.n_nodes)])
        kept_rows = torch.cat([keep.nonzero().flatten(), torch.arange(self.n_features, len(self.rows))])
        rows = (self.rows * result.edge_mask)[kept_rows][:, index]
        return dataclasses.replace(self, features=self.features[keep], activations=self.activations[keep],
                                   pre_activations=self.pre_activations[keep], rows=rows,
                                   metadata={**self.metadata, "node_threshold": node_threshold,
                                             "edge_threshold": edge_threshold})

    # --- tables ---------------------------------------------------------------------------------------------
    def node_ids(self) -> list[str]:
        """Each node's id in circuit-tracer's and Neuronpedia's JSON (resid.analyses.graphs.export): a feature
        "L_F_P", an error "0_L_P", a token embedding "E_T_P", a logit "{n_layers + 1}_T_P" (T a token id)."""
        last = self.n_pos - 1
        return ([f"{l}_{f}_{p}" for l, p, f in self.features.tolist()]
                + [f"0_{l}_{p}" for l in range(self.n_layers) for p in range(self.n_pos)]
                + [f"E_{t}_{p}" for p, t in enumerate(self.token_ids.tolist())]
                + [f"{self.n_layers + 1}_{t}_{last}" for t in self.logit_tokens.tolist()])

    def to_frame(self) -> pd.DataFrame:
        """One row per node: node (its index), node_id (its id in the JSON), kind, site, layer, position, feature,
        token (the prompt's token at the node's position; a logit's own token), token_str, activation, value,
        probability, influence."""
        kinds = self.kinds()
        layers = (self.features[:, 0].tolist() + [l for l in range(self.n_layers) for _ in range(self.n_pos)]
                  + [None] * (self.n_pos + self.n_logits))
        positions = (self.features[:, 1].tolist() + list(range(self.n_pos)) * self.n_layers
                     + list(range(self.n_pos)) + [self.n_pos - 1] * self.n_logits)
        prompt = self.token_ids.tolist()
        tokens = [prompt[p] for p in positions[:self.n_nodes - self.n_logits]] + self.logit_tokens.tolist()
        strs = [self.token_strs[p] for p in positions[:self.n_nodes - self.n_logits]] + list(self.logit_strs)
        activation = torch.cat([self.activations, torch.full((self.n_nodes - self.n_features,), float("nan"))])
        logit_prob = torch.cat([torch.full((self.n_nodes - self.n_logits,), float("nan")), self.logit_probabilities])
        return pd.DataFrame({
            "node": range(self.n_nodes), "node_id": self.node_ids(), "kind": kinds,
            "site": [s.label for s in self.sites()],
            "layer": pd.array(layers, dtype="Int64"), "position": positions,
            "feature": pd.array(self.features[:, 2].tolist() + [None] * (self.n_nodes - self.n_features),
                                dtype="Int64"),
            "token": pd.array(tokens, dtype="Int64"), "token_str": strs, "activation": activation.double().numpy(),
            "value": self.values().double().numpy(), "probability": logit_prob.double().numpy(),
            "influence": self.influence().double().numpy(),
        })

    def edges(self, min_abs: float = 0.0) -> pd.DataFrame:
        """One row per non-zero edge (|weight| > min_abs): source, target (node indices), weight."""
        row, source = (self.rows.abs() > min_abs).nonzero(as_tuple=True)
        return pd.DataFrame({"source": source.numpy(), "target": self.row_nodes[row].numpy(),
                             "weight": self.rows[row, source].double().numpy()})

    def __repr__(self) -> str:
        return (f"Graph({self.model_name}, {self.n_pos} tokens, {self.n_features} features, {self.n_logits} logits, "
                f"{self.n_edges} edges)")
