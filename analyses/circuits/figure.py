"""A circuit drawn, in the graph viewer's conventions (resid.analyses.graphs.viewer): rows are layers (the
embeddings at the bottom, the logits at the top), each layer's heads in columns and its MLP at the right; an edge
is a line from its writer to the node its reader feeds (a q input to its head, a shared key/value input to the
first query head of its group, marked k or v in the hover), its width following |score|, blue where the score is
positive and red where it is negative. `page` writes it with the circuit's edge table as one self-contained HTML
file (plotly's own page: no script of ours)."""

import html
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from resid.analyses.circuits.graph import EMBED, LOGITS, EdgeGraph
from resid.analyses.plots import save_html
from resid.sites import Site

POSITIVE, NEGATIVE = "#2563eb", "#dc2626"  # the viewer's edge colours


def _place(graph: EdgeGraph, site: Site) -> tuple[float, float]:
    """(x, y) of a node: heads at columns 0..n_heads-1 of their layer's row, the MLP at column n_heads + 1 half a
    row above (it reads after the heads), the embeddings below layer 0 and the logits above the last layer."""
    middle = graph.n_heads / 2
    if site == EMBED:
        return middle, -1.0
    if site == LOGITS:
        return middle, float(graph.n_layers)
    if site.part == "mlp":
        return graph.n_heads + 1.0, site.layer + 0.5
    return (middle if site.head is None else float(site.head)), float(site.layer)  # a whole attention: centred


def _target(graph: EdgeGraph, reader: Site) -> Site:
    """The node a reader's input feeds (its head, the first head of a key/value group or of a latent's layer, the
    whole attention under post-norms, its MLP, the logits)."""
    if reader == LOGITS or reader.part == "mlp":
        return reader
    return graph.writers[graph.fed(reader).start]


def circuit_figure(graph: EdgeGraph, mask: Bool[Tensor, "writer reader"], scores: Float[Tensor, "writer reader"],
                   title: str = "circuit") -> go.Figure:
    """The edges of `mask`, drawn with their scores."""
    w_index, r_index = torch.nonzero(mask & graph.valid, as_tuple=True)
    values = scores.double()[w_index, r_index]
    biggest = float(values.abs().max()) if len(values) else 1.0
    fig = go.Figure()
    nodes: dict[Site, None] = {EMBED: None, LOGITS: None}
    for w, r, value in zip(w_index.tolist(), r_index.tolist(), values.tolist()):
        writer, reader = graph.writers[w], graph.readers[r]
        target = _target(graph, reader)
        nodes.update({writer: None, target: None})
        (x0, y0), (x1, y1) = _place(graph, writer), _place(graph, target)
        fig.add_trace(go.Scatter(
            x=[x0, x1], y=[y0, y1], mode="lines", hoverinfo="text",
            line=dict(width=0.5 + 5 * abs(value) / (biggest or 1.0), color=POSITIVE if value >= 0 else NEGATIVE),
            text=f"{writer.label} -> {reader.label}: {value:.4g}", showlegend=False))
    places = [_place(graph, site) for site in nodes]
    fig.add_trace(go.Scatter(
        x=[p[0] for p in places], y=[p[1] for p in places], mode="markers+text", showlegend=False,
        text=[_short(site) for site in nodes], textposition="top center", hoverinfo="text",
        marker=dict(size=12, color=["#111827" if s in (EMBED, LOGITS) else "#f59e0b" if s.part == "mlp" else
                                    "#10b981" for s in nodes], symbol=["square" if s.part == "mlp" else "circle"
                                                                       for s in nodes])))
    fig.update_layout(
        title=title, template="plotly_white", height=120 + 60 * (graph.n_layers + 2),
        xaxis=dict(visible=False), yaxis=dict(title="layer", tickmode="array",
                                              tickvals=[-1, *range(graph.n_layers), graph.n_layers],
                                              ticktext=["embed", *map(str, range(graph.n_layers)), "logits"]))
    return fig


def _short(site: Site) -> str:
    if site in (EMBED, LOGITS):
        return site.label
    if site.part == "mlp":
        return f"MLP{site.layer}"
    return f"attn{site.layer}" if site.head is None else f"{site.layer}.{site.head}"  # a whole attention: post-norms


def page(graph: EdgeGraph, mask: Bool[Tensor, "writer reader"], scores: Float[Tensor, "writer reader"],
         path: str | Path, title: str = "circuit") -> Path:
    """The circuit's figure and its edge table (writer, reader, score; largest |score| first) as one HTML page."""
    w_index, r_index = torch.nonzero(mask & graph.valid, as_tuple=True)
    table = pd.DataFrame({"writer": [graph.writers[w].label for w in w_index.tolist()],
                          "reader": [graph.readers[r].label for r in r_index.tolist()],
                          "score": scores.double()[w_index, r_index].numpy()})
    table = table.reindex(table["score"].abs().sort_values(ascending=False).index)
    path = save_html(circuit_figure(graph, mask, scores, title), path)
    rows = "".join(f"<tr><td>{html.escape(a)}</td><td>{html.escape(b)}</td><td>{s:.4g}</td></tr>"
                   for a, b, s in table.itertuples(index=False))
    text = path.read_text(encoding="utf-8")
    listing = (f"<h2>{html.escape(title)}: {len(table)} edges</h2><table><tr><th>writer</th><th>reader</th>"
               f"<th>score</th></tr>{rows}</table>")
    path.write_text(text.replace("</body>", listing + "</body>"), encoding="utf-8")
    return path
