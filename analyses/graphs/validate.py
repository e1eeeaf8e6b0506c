"""The intervention check: does the graph predict what happens when the real model loses (or gains) a feature?

For each of the `top` most influential feature nodes, the real model is run with that feature's write scaled:
its activation times `factor` (0: ablated; 2: steered to twice its value), i.e. (factor - 1) * a * W_dec added to
every MLP write the feature writes into, at its position, everything downstream recomputed (attention, norms,
the real MLPs). The measured effect is the change of each logit node's value (logit - mean logit, before a final
soft cap).

The graph's prediction is the total effect in the local replacement model, where a downstream feature's
activation follows its pre-activation one for one (it stays active) and patterns and norm scales stay frozen:

    x = A[:, s] + M x   over feature targets (M[u, t] = A[u, t] / a_t: an edge per unit of activation)
    predicted change of a logit node = (factor - 1) * (A[logit, s] + sum_t A[logit, t] / a_t * x_t)

Where the two agree the graph's linear story holds for that feature; where they differ, attention or norm changes
or features switching off carry the effect. The report keeps both numbers and their correlation.
"""

import torch

from resid.analyses.graphs.graph import Graph
from resid.analyses.graphs.transcoders import Transcoders
from resid.interventions import Add
from resid.sites import Site


def predicted_effects(graph: Graph, sources: list[int]) -> torch.Tensor:
    """[len(sources) n_logits]: the total effect on each logit node of removing each feature node's whole write."""
    n_f = graph.n_features
    a = graph.rows.double()  # feature rows, then logit rows
    per_unit = a[:, :n_f] / graph.activations.double().clamp_min(1e-12)  # an edge per unit of activation
    feature_block = per_unit[:n_f]  # [target source] among features
    out = []
    for s in sources:
        direct = a[:n_f, s]
        total, term = direct.clone(), direct.clone()
        for _ in range(graph.n_layers * 2 + 2):  # features only feed later layers: the series ends
            term = feature_block @ term
            if not bool(term.any()):
                break
            total += term
        out.append(a[n_f:, s] + per_unit[n_f:] @ total)
    return torch.stack(out).float() if out else torch.zeros(0, graph.n_logits)


@torch.no_grad()
def validate(model, graph: Graph, transcoders, top: int = 10, factor: float = 0.0) -> dict:
    """Measured against predicted logit-node changes for the `top` most influential features; the report also
    goes into graph.metadata["validation"]."""
    found = Transcoders.of(model, transcoders)
    influence = graph.influence()[:graph.n_features]
    order = torch.argsort(influence, descending=True)[:top].tolist()
    ids = graph.token_ids[None]
    clean = _values(model.run(ids), graph)
    predicted = predicted_effects(graph, order) * (factor - 1)
    rows = []
    for k, node in enumerate(order):
        layer, pos, feature = graph.features[node].tolist()
        activation = float(graph.activations[node])
        edits = []
        for target in found.targets(layer):
            write = found.decoder(layer, target, torch.tensor([feature]))[0] * activation * (factor - 1)
            edits.append(Add(Site(target, "mlp", positions=(pos,)), write.to(model.dtype)))
        measured = _values(model.run(ids, interventions=edits), graph) - clean
        rows.append({"node": node, "layer": layer, "position": pos, "feature": feature, "activation": activation,
                     "predicted": predicted[k].tolist(), "measured": measured.tolist()})
    p = torch.tensor([r["predicted"][0] for r in rows], dtype=torch.float64)
    m = torch.tensor([r["measured"][0] for r in rows], dtype=torch.float64)
    correlation = float(torch.corrcoef(torch.stack([p, m]))[0, 1]) if len(rows) > 1 else float("nan")
    report = {"factor": factor, "features": rows, "target_logit_correlation": correlation,
              "target_logit_median_abs_error": float((p - m).abs().median()) if len(rows) else float("nan")}
    graph.metadata["validation"] = report
    return report


def logit_values(run, graph: Graph) -> torch.Tensor:
    """[batch n_logits]: each prompt's logit-node values at the last position (logit - mean logit, before a final
    soft cap), as the graph defines them."""
    logits = run.uncapped_logits if run.uncapped_logits is not None else run.logits
    last = logits[:, -1].float()
    return last[:, graph.logit_tokens.to(last.device)] - last.mean(-1, keepdim=True)


def _values(run, graph: Graph) -> torch.Tensor:
    return logit_values(run, graph)[0]
