"""A circuit on one page, for a paper: the supernode diagram, the scores, the measured necessity and sufficiency,
each supernode's effect beside the graph's prediction, and every feature with its label.

    graphs.circuit_report.write(model, circuit, "report.html", measured=graphs.measure(model, circuit, tcs))

The diagram (plotly): each supernode a box at its features' mean prompt position (x) and mean layer (y), the
prompt's tokens along the bottom and the target logit at the top; an arrow from a to b is the sum of the graph's
edges from a's features (or the token) into b's (or into the target logit), its width |weight|, blue positive,
red negative; the SHOWN strongest are drawn. The page is resid.analyses.report's (it opens
offline); `png` beside it is taken by headless Chromium where one is installed (resid circuit --png).
"""

import shutil
import subprocess
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import torch

from resid.analyses import report
from resid.analyses.graphs.circuit import Circuit
from resid.errors import ResidError

SHOWN = 30  # arrows drawn: the strongest by |weight|
BLUE, RED = "#2166ac", "#b2182b"
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def flows(circuit: Circuit) -> pd.DataFrame:
    """The supernode diagram's arrows: source, target (a supernode's name, "token <p>: '<text>'", or "logit
    '<target>'") and weight (the graph's edges between them, summed); every pair with a non-zero sum."""
    graph = circuit.graph
    n_f, n_e = graph.n_features, graph.n_errors
    groups = {s.name: torch.tensor(s.nodes, dtype=torch.long) for s in circuit.supernodes}
    logit_row = n_f  # the target logit's row: the feature rows come first
    rows = []
    for b, into in groups.items():
        block = graph.rows[into]  # [members N]
        for a, out_of in groups.items():
            if a != b:
                rows.append((a, b, float(block[:, out_of].sum())))
        tokens = block[:, n_f + n_e:n_f + n_e + graph.n_pos].sum(0)
        rows += [(f"token {p}: {graph.token_strs[p]!r}", b, float(w)) for p, w in enumerate(tokens.tolist()) if w]
        rows.append((b, f"logit {graph.logit_strs[0]!r}", float(graph.rows[logit_row, into].sum())))
    frame = pd.DataFrame(rows, columns=["source", "target", "weight"])
    return frame[frame["weight"] != 0].reset_index(drop=True)


def diagram(circuit: Circuit) -> go.Figure:
    graph = circuit.graph
    where = {}
    for s in circuit.supernodes:
        at = graph.features[list(s.nodes)].float()
        where[s.name] = (float(at[:, 1].mean()), float(at[:, 0].mean()))
    for p, text in enumerate(graph.token_strs):
        where[f"token {p}: {text!r}"] = (float(p), -1.5)
    target = f"logit {graph.logit_strs[0]!r}"
    where[target] = (float(graph.n_pos - 1), graph.n_layers + 0.5)
    arrows = flows(circuit)
    peak = float(arrows["weight"].abs().max()) if len(arrows) else 1.0
    shown = arrows.loc[arrows["weight"].abs().sort_values(ascending=False, kind="stable").index[:SHOWN]]
    fig = go.Figure()
    for row in shown.itertuples():
        (x0, y0), (x1, y1) = where[row.source], where[row.target]
        fig.add_annotation(x=x1, y=y1, ax=x0, ay=y0, xref="x", yref="y", axref="x", ayref="y", showarrow=True,
                           arrowhead=2, arrowsize=1, arrowwidth=0.5 + 5 * abs(row.weight) / peak,
                           arrowcolor=BLUE if row.weight > 0 else RED, opacity=0.6, text="")
    names = [s.name for s in circuit.supernodes]
    fig.add_trace(go.Scatter(
        x=[where[n][0] for n in names], y=[where[n][1] for n in names], mode="markers+text", text=names,
        textposition="middle right", marker=dict(symbol="square", size=[10 + min(30, 2 * len(s.nodes))
                                                                         for s in circuit.supernodes],
                                                 color="#984ea3", line=dict(color="#e6ab02", width=2)),
        hovertext=["<br>".join(s.reasons) for s in circuit.supernodes], hoverinfo="text", name="supernodes"))
    used = {n for n in set(shown["source"]) | set(shown["target"]) if n.startswith("token ")}
    tokens = [n for n in where if n.startswith("token ")]
    fig.add_trace(go.Scatter(x=[where[n][0] for n in tokens], y=[-1.5] * len(tokens), mode="markers+text",
                             text=[repr(t)[1:-1] for t in graph.token_strs], textposition="bottom center",
                             marker=dict(color=["#999" if n in used else "#ddd" for n in tokens], size=9),
                             hoverinfo="text", name="tokens"))
    fig.add_trace(go.Scatter(x=[where[target][0]], y=[where[target][1]], mode="markers+text", text=[target],
                             textposition="top center", marker=dict(color="#4daf4a", size=14), name="target"))
    fig.update_layout(height=620, showlegend=False, margin=dict(l=40, r=160, t=30, b=60), plot_bgcolor="#fff",
                      xaxis=dict(title="prompt position", range=[-0.7, graph.n_pos + 1.5], showgrid=False,
                                 zeroline=False),
                      yaxis=dict(title="layer", range=[-2.6, graph.n_layers + 2.5], showgrid=True,
                                 gridcolor="#f0f0f0", zeroline=False))
    return fig


def page(model, circuit: Circuit, measured: pd.DataFrame | None = None) -> report.Page:
    graph = circuit.graph
    target = graph.logit_strs[0]
    scores = pd.DataFrame([{"graph": k, "replacement": r, "completeness": c}
                           for k, (r, c) in circuit.scores.items()])
    lead = (f"{len(circuit.nodes)} of the graph's {graph.n_features} feature nodes ({len(graph.active_features)} "
            f"active features) in {len(circuit.supernodes)} supernodes, pruned at node threshold "
            f"{circuit.node_threshold} and edge threshold {circuit.edge_threshold}; target {target!r} "
            f"(p = {float(graph.logit_probabilities[0]):.3f}).")
    parts = [lead, diagram(circuit), report.Table(scores, formats={"replacement": "{:.3f}", "completeness": "{:.3f}"})]
    sections = [report.Section("Circuit", parts)]
    if measured is not None:
        said = (f"Necessity {measured.attrs['necessity']:.3f}: the target logit's value (logit - mean logit) drops by "
                f"that share when the circuit's features are ablated in the model. Sufficiency "
                f"{measured.attrs['sufficiency']:.3f}: the share it keeps when every other feature is ablated. "
                "Predicted: the same edit in the graph's local replacement model.")
        sections.append(report.Section("Measured in the model", [said, report.Table(
            measured, signed=("measured_change", "predicted_change"), rows=len(measured))]))
    groups = pd.DataFrame([{"supernode": s.name, "features": len(s.nodes), "influence": s.influence,
                            "reasons": "; ".join(s.reasons)} for s in circuit.supernodes])
    sections.append(report.Section("Supernodes", [report.Table(groups, rows=len(groups))]))
    sections.append(report.Section("Features", [report.Table(circuit.to_frame().drop(columns=["node"]), rows=200)]))
    prompt = "".join(graph.token_strs)
    return report.Page(f"Circuit: {prompt!r} -> {target!r}", report.context(model, "a circuit", [prompt]), sections)


def write(model, circuit: Circuit, path: str | Path, measured: pd.DataFrame | None = None,
          self_contained: bool = True) -> Path:
    return report.write(page(model, circuit, measured), path, self_contained)


def png(page_path: str | Path, out: str | Path, width: int = 1200, height: int = 1800) -> Path:
    """A screenshot of the page by headless Chromium (the first of BROWSERS on the PATH)."""
    browser = next((b for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        raise ResidError("A PNG of the report is taken by headless Chromium, and none is installed: install chromium "
                         "(apt-get install chromium), or leave --png out and open the HTML page.")
    out = Path(out)
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--window-size={width},{height}", "--virtual-time-budget=15000", f"--screenshot={out}",
                           Path(page_path).resolve().as_uri()], capture_output=True, text=True, timeout=180)
    if not out.is_file():
        raise ResidError(f"Chromium wrote no screenshot of {page_path}: {done.stderr[-500:]}")
    return out
