"""A circuit measured in the real model: is it necessary, is it sufficient, and what does each supernode do, each
number beside the graph's prediction of it.

Every intervention edits feature activations inside the model's own run with every transcoder spliced, its error
kept (resid.dictionaries.Splice with an `edit`): the MLP's write becomes the real MLP's write plus what the edit
changes in the reconstruction, so an unedited row is the model's own run (to float32 rounding) and everything
downstream (attention, norms, the other features, the errors) is recomputed. All the interventions run as rows of
one batch: one forward pass.

    none             nothing edited: the target logit's value v (logit - mean logit, before a final soft cap)
    ablate circuit   the circuit's features set to 0 at their positions: necessity = (v - v_ablated) / v
    ablate outside   every other feature (any feature, at any position, active in the run or not) set to 0, the
                     circuit's features kept as they come: sufficiency = v_outside / v
    ablate all       every feature set to 0 (the errors, skip paths and biases alone): what the two compare to
    ablate <s>       supernode s's features set to 0
    steer <s>        supernode s's features times `steer`

Where the graph skips position 0 (skip_bos), its features are constants there and no intervention touches them.
The graph's prediction is the same edit in its local replacement model (patterns and norm scales frozen, a
downstream feature's activation following its pre-activation one for one, as graphs.validate predicts): with
s_t the scale of feature t (0, 1 or `steer`) and M[u, t] = A[u, t] / a_t (an edge per unit of activation),

    x = (s - 1) a + s * (M x)        over the graph's feature nodes (the series ends: features feed later layers)
    predicted change of the target = M[target, :] x

It knows only the graph's feature nodes, so it says nothing of features the edit switches on.
"""

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from resid.analyses.graphs.circuit import Circuit
from resid.analyses.graphs.graph import Graph
from resid.analyses.graphs.transcoders import Transcoders
from resid.analyses.graphs.validate import logit_values
from resid.analyses.io.provenance import describe
from resid.dictionaries import Splice
from resid.errors import ResidError

COLUMNS = ("intervention", "supernode", "scale", "n_features", "measured", "measured_change", "predicted",
           "predicted_change", "share")


def measure(model, circuit: Circuit, transcoders, steer: float = 2.0) -> pd.DataFrame:
    """One row per intervention of the module docstring (columns COLUMNS: the scale of the edited features, how many
    of the graph's feature nodes are edited, the target logit's value measured and predicted, their changes from
    the unedited run, and `share`: measured / the unedited value);
    `df.attrs["necessity"]`, `df.attrs["sufficiency"]`."""
    graph = circuit.graph
    found = Transcoders.of(model, transcoders)
    if found.per_layer is None:
        raise ResidError("graphs.measure edits feature activations inside the run, which resid splices for per-layer "
                         "transcoders only: measure a circuit of per-layer (or skip) transcoders.")
    n_f = graph.n_features
    inside = torch.zeros(n_f, dtype=torch.bool)
    inside[circuit.nodes] = True
    names, scales, defaults = [("none", "")], [torch.ones(n_f)], [1.0]
    names += [("ablate circuit", ""), ("ablate outside", ""), ("ablate all", "")]
    scales += [(~inside).float(), inside.float(), torch.zeros(n_f)]
    defaults += [1.0, 0.0, 0.0]
    for s in circuit.supernodes:
        for kind, value in (("ablate", 0.0), ("steer", float(steer))):
            scale = torch.ones(n_f)
            scale[list(s.nodes)] = value
            names.append((kind, s.name))
            scales.append(scale)
            defaults.append(1.0)
    scale = torch.stack(scales)
    measured = _run(model, graph, found, scale, torch.tensor(defaults))
    predicted = graph.logit_values[0] + predicted_changes(graph, scale)
    base = float(measured[0])
    rows = []
    for k, ((kind, supernode), default) in enumerate(zip(names, defaults, strict=True)):
        edited = int((scale[k] != 1).sum())
        value = scale[k][scale[k] != 1]
        rows.append({"intervention": kind, "supernode": supernode,
                     "scale": float(value[0]) if len(value) else 1.0,
                     "n_features": edited, "measured": float(measured[k]), "measured_change": float(measured[k]) - base,
                     "predicted": float(predicted[k]),
                     "predicted_change": float(predicted[k]) - float(graph.logit_values[0]),
                     "share": float(measured[k]) / base if base else float("nan")})
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    df.attrs["necessity"] = 1 - rows[1]["share"]
    df.attrs["sufficiency"] = rows[2]["share"]
    df.attrs["target"] = graph.logit_strs[0]
    df.attrs["provenance"] = describe(model, "graphs.measure", {
        "prompt_ids": graph.token_ids.tolist(), "transcoders": found.name, "steer": steer,
        "node_threshold": circuit.node_threshold, "edge_threshold": circuit.edge_threshold,
        "n_features": len(circuit.nodes), "supernodes": [s.name for s in circuit.supernodes]})
    return df


def predicted_changes(graph: Graph, scale: Float[Tensor, "k n_features"]) -> Float[Tensor, "k"]:
    """The graph's predicted change of the target logit node under each row of feature scales (module docstring)."""
    n_f = graph.n_features
    a = graph.rows.double()
    activation = graph.activations.double()
    per_unit = a[:, :n_f] / activation.clamp_min(1e-12)  # [rows features]: an edge per unit of activation
    block = per_unit[:n_f]  # among the features [target source]
    s = scale.double()
    first = (s - 1) * activation
    x = first
    for _ in range(graph.n_layers + 1):  # features feed later layers only: depth n_layers at most
        x = first + s * (x @ block.T)
    return (x @ per_unit[n_f]).float()  # the target logit's row: the first logit row


@torch.no_grad()
def _run(model, graph: Graph, found: Transcoders, scale: Tensor, default: Tensor) -> Tensor:
    """The target logit's value [k] with feature activations edited: row k's graph features times scale[k], every
    other feature times default[k] (position 0 kept where the graph skips it)."""
    k = len(scale)
    device = model.device
    keep = default[:, None].repeat(1, graph.n_pos)  # [k pos]: what a feature the graph does not list is multiplied by
    if graph.skip_bos:
        keep[:, 0] = 1.0
    splices = []
    for layer, d in enumerate(found.per_layer):
        mine = (graph.features[:, 0] == layer).nonzero().flatten()
        rows, nodes = torch.meshgrid(torch.arange(k), mine, indexing="ij")
        changed = scale[rows, nodes] != default[rows]  # the entries that differ from their row's default
        at = (rows[changed], graph.features[nodes[changed], 1], graph.features[nodes[changed], 2])
        splices.append(Splice(d, edit=_editor(keep.to(device), tuple(t.to(device) for t in at),
                                              scale[rows, nodes][changed].to(device))))
    ids = graph.token_ids[None].repeat(k, 1).to(device)
    run = model.run(ids, dictionaries=splices)
    return logit_values(run, graph)[:, 0].cpu()


def _editor(keep: Tensor, at: tuple[Tensor, Tensor, Tensor], values: Tensor):
    """fn(acts [k pos feature], tokens): every activation times keep[row, pos], then the entries `at` (row, pos,
    feature) their own activation times `values`; no value read back to the host."""
    rows, positions, features = at

    def edit(acts: Tensor, tokens) -> Tensor:
        out = acts * keep[:, :, None].to(acts.dtype)
        out[rows, positions, features] = acts[rows, positions, features] * values.to(acts.dtype)
        return out

    return edit
