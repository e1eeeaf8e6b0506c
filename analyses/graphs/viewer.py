"""resid's own graph viewer: one self-contained HTML page (no network, no libraries) drawing the pruned graph's JSON
(resid.analyses.graphs.export) as an SVG.

Columns are prompt positions (the token under each), rows are layers (named on the left): token embeddings at the
bottom, features (circles) and error nodes (squares) at their layer, logits at the top. The SVG is drawn at its
natural size in CSS pixels, so labels stay 13 px high whatever the prompt's length. Each column is as wide as its
most crowded (layer, position) cell needs (16 px per node, 64 to 360 px; the columns stretch to the window's width
when they fit in it, wider graphs scroll), and a cell's nodes are spread across its column, the most influential
first, in as many lines as the row holds when one line is not enough (Neuronpedia's layout: a cell of 20 features
is 20 separate nodes, not a bar). A legend names the node kinds' colours and shapes; a feature's or error's size
grows with its influence (1 - its place in the influence ranking). Edges are lines whose width follows |weight|
(blue positive, red negative). Supernodes are dashed boxes around their members, named above. A feature's label
(its `clerp`, resid.analyses.graphs.labels) shows in its tooltip and when it is clicked.

The script is package data (viewer.js, where a JavaScript linter reads it), inlined into each page.

Thresholds (two sliders, at most the thresholds the page was written with, at which they show every node and edge of
its JSON): the node slider hides features and errors whose `influence` (the cumulative share of influence up to them
in the ranking) lies past the slider's value, keeping the first one at or past it (as Graph.prune keeps the node
that crosses its threshold); tokens and logits always show. The edge slider then keeps, of the links between shown
nodes, the most influential first (a link's `influence`, its share of the edges' influence score, the ranking
Graph.prune cuts; |weight| in a JSON without it) until their share of those links' total reaches value / written
edge threshold (the one crossing it kept), so the written value keeps them all; a feature or error left without a
shown link hides too. The page opens with the node slider at its written value and the edge slider at OPEN_SHARE
(0.9) of it: the links holding 90% of the influence, a small part of them (about 14% of a 1,200-node graph's 50,000
links), which keeps a large graph readable and quick to open (a link's line is made when it is first shown). The
logits spread along the top row from the right, the target first, each labelled with its token where there is room.

Hovering a node shows its label, activation, influence and its 3 largest shown edges. Clicking a node pins it
(outlined; click again to unpin; "clear pins" unpins all): while any node is pinned, the shown links through a
pinned node and their ends are drawn in full, the rest faded. A click also lists the node's strongest incoming and
outgoing shown edges (and how many the sliders hide) and, for a feature with a card (resid.analyses.features.card)
given in `cards`, shows the card in a frame. Given a head split (resid.analyses.graphs.heads), each listed edge
names the heads carrying most of it, and clicking an edge lists its largest parts (the head of its last attention
hop, or the residual; the JSON's LINK_HEADS largest, the rest summed in one row). Given QK summaries
(resid.analyses.graphs.qk.QK.summaries), a head in that list that has one is a link: clicking it shows why the head
attended from the edge's target position to its source position, its score and pattern there, the top pairs (query-
side term x key-side term) and the terms of each side, and the same against the pattern-weighted mean over keys.

"find" pins the node of an id ("L_F_P") or a feature at every position ("L_F"); "group pinned" names the pinned nodes
a supernode (Neuronpedia's qParams.supernodes, [name, node_id, ...], read from the JSON when it has some, members
outlined and boxed); the JSON's qParams.pinnedIds (a circuit's features) are pinned as the page opens; "export
pinned subgraph" offers the pinned nodes, the shown links through them and their other ends, and the supernodes as a
JSON file of the same format (subgraph.json); "export view" the drawing as it is shown (the
sliders' hidden nodes left out, faded ones faded) as an SVG file (view.svg), "(PNG)" the same at twice its size as
a PNG file (view.png).
"""

import html
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

import pandas as pd

from resid.analyses.graphs.export import Supernodes, graph_json
from resid.analyses.graphs.graph import Graph
from resid.analyses.graphs.heads import HeadSplit
from resid.analyses.io import atomic

OPEN_SHARE = 0.9  # the page opens showing the links that hold this share of the written links' influence



def script() -> str:
    """The viewer's JavaScript (package data, viewer.js), inlined into every page."""
    return resources.files("resid.analyses.graphs").joinpath("viewer.js").read_text(encoding="utf-8")


def page(graph: Graph, node_threshold: float = 0.8, edge_threshold: float = 0.98,
         cards: dict[str, str] | None = None, heads: HeadSplit | None = None, qk: dict | None = None,
         supernodes: Supernodes = (), labels: Mapping[str, str] | None = None, circuit=None,
         measured: pd.DataFrame | None = None) -> str:
    """The viewer page of `graph` pruned at the thresholds; `cards` maps a feature's node_id ("L_F_P") to the path
    (relative to the page) of its card; `heads` splits its edges by head (graphs.split_heads of graph.pruned() at
    the same thresholds); `qk`: QK.summaries of the heads that carry them (e.g. of heads.carriers());
    `supernodes`: named groups of node ids, drawn as boxes and listed (export.graph_json); `labels`, `circuit`,
    `measured`: the features' labels, a circuit (its supernodes boxed, its features pinned as the page opens, its
    scores shown) and its measurements, as export.graph_json takes them."""
    data = graph_json(graph, graph.model_name, node_threshold, edge_threshold,
                      decode=dict(zip(graph.logit_tokens.tolist(), graph.logit_strs, strict=True)).get, heads=heads,
                      qk=qk, supernodes=supernodes, labels=labels, circuit=circuit, measured=measured)
    meta = data["metadata"]["resid"]
    title = html.escape(f"{graph.model_name}: {''.join(graph.token_strs)!r}")
    summary = html.escape(f"{len(data['nodes'])} nodes, {len(data['links'])} edges (node threshold {node_threshold},"
                          f" edge threshold {edge_threshold}); replacement score {meta['replacement_score']:.3f}, "
                          f"completeness score {meta['completeness_score']:.3f}")

    def embedded(value) -> str:  # JSON inside <script>: "</" must not close the tag
        return json.dumps(value).replace("</", "<\\/")

    legend = "".join(f"<span class='key'><span class='swatch {shape}' style='background:{colour}'></span>{name}</span>"
                     for name, shape, colour in (("feature", "round", "#984ea3"), ("error (MLP reconstruction)", "",
                                                 "#ff7f00"), ("token", "round", "#999"), ("logit", "round", "#4daf4a")))
    legend += ("<span class='key'><span class='bar' style='background:#2166ac'></span>positive edge</span>"
               "<span class='key'><span class='bar' style='background:#b2182b'></span>negative edge</span>"
               "<span class='key'>size: influence</span>")
    how = ("Hover a node for its activation, influence and top edges; click nodes to pin them and see the edges "
           "through them (the rest fades)" + ("" if heads is None else "; click an edge for the heads that carry it")
           + "; move the sliders to prune further.")
    sliders = (f"<label>node threshold <input type='range' id='node-threshold' min='0' max='{node_threshold}' "
               f"step='0.01' value='{node_threshold}'> <span id='node-value'></span></label> "
               f"<label>edge threshold <input type='range' id='edge-threshold' min='0' max='{edge_threshold}' "
               f"step='any' value='{OPEN_SHARE * edge_threshold}'> <span id='edge-value'></span></label> "
               "<button id='clear'>clear pins</button> <span id='shown'></span><br>"
               "<label>find <input id='search' size='12' placeholder='L_F_P or L_F'></label> <span id='found'></span> "
               "<input id='group-name' size='14' placeholder='supernode name'> "
               "<button id='group'>group pinned</button> "
               "<button id='export'>export pinned subgraph</button> <a id='download' download='subgraph.json'></a> "
               "<button id='export-svg'>export view (SVG)</button> <a id='download-svg' download='view.svg'></a> "
               "<button id='export-png'>(PNG)</button> <a id='download-png' download='view.png'></a> "
               "<span id='supernodes'></span>")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title><style>"
            "body{font-family:sans-serif;margin:12px} #wrap{overflow:auto;border:1px solid #ddd;width:100%} "
            ".node,.edge{cursor:pointer} text{font-size:13px;fill:#222} text.axis{font-size:12px;fill:#555} "
            ".grid{stroke:#eee} .link{stroke-opacity:0.5} .hidden{display:none} .faded{opacity:0.08} "
            ".node.pinned{stroke:#000;stroke-width:3} .node.grouped{stroke:#e6ab02;stroke-width:2} "
            ".supernode-box{fill:none;stroke-width:1.5;stroke-dasharray:5 3} "
            "text.supernode-name{font-size:12px;font-weight:bold} #circuit td{font-family:sans-serif} "
            "text.logit-label{font-size:12px;fill:#2b7a2b} "
            ".supernode{margin-right:10px;color:#7a5c00} td{padding:0 6px;font-family:monospace} "
            "#legend,#controls{margin:6px 0} .key{margin-right:14px;white-space:nowrap} "
            ".swatch{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:middle} "
            ".round{border-radius:50%} .bar{display:inline-block;width:18px;height:3px;margin-right:4px;"
            "vertical-align:middle} #how{color:#333} #tip{position:fixed;display:none;background:#fffff4;"
            "border:1px solid #999;padding:4px 8px;font-size:13px;pointer-events:none;max-width:420px}"
            "</style></head><body>"
            f"<h2>{title}</h2><p>{summary}</p>{circuit_panel(circuit, measured)}<p id='how'>{how}</p>"
            f"<div id='legend'>{legend}</div>"
            f"<div id='controls'>{sliders}</div><div id='wrap'><svg id='graph' xmlns='http://www.w3.org/2000/svg'>"
            f"</svg></div><div id='tip'></div>"
            f"<div id='info'><p>Click a node{'' if heads is None else ' or an edge'}.</p></div>"
            f"<script type='application/json' id='graph-data'>{embedded(data)}</script>"
            f"<script type='application/json' id='graph-cards'>{embedded(cards or {})}</script>"
            f"<script>{script()}</script></body></html>")


def circuit_panel(circuit, measured: pd.DataFrame | None = None) -> str:
    """A circuit's scores (graph, pruned, circuit), necessity and sufficiency, and its supernodes with their reasons,
    as an HTML block ("" without a circuit)."""
    if circuit is None:
        return ""
    scores = "".join(f"<tr><td>{html.escape(k)}</td><td>{r:.3f}</td><td>{c:.3f}</td></tr>"
                     for k, (r, c) in circuit.scores.items())
    measures = ""
    if measured is not None:
        measures = (f"<p>measured in the model: necessity {measured.attrs['necessity']:.3f} (the target logit's drop "
                    f"with the circuit ablated), sufficiency {measured.attrs['sufficiency']:.3f} (its share kept with "
                    "every other feature ablated)</p>")
    groups = "".join(f"<li><b>{html.escape(s.name)}</b> ({len(s.nodes)}): {html.escape('; '.join(s.reasons))}</li>"
                     for s in circuit.supernodes)
    return (f"<div id='circuit'><b>circuit</b>: {len(circuit.nodes)} features in {len(circuit.supernodes)} "
            f"supernodes<table><tr><td></td><td>replacement</td><td>completeness</td></tr>{scores}</table>"
            f"{measures}<ul>{groups}</ul></div>")


def write_html(graph: Graph, path: str | Path, node_threshold: float = 0.8, edge_threshold: float = 0.98,
               cards: dict[str, str] | None = None, heads: HeadSplit | None = None, qk: dict | None = None,
               supernodes: Supernodes = (), labels: Mapping[str, str] | None = None, circuit=None,
               measured: pd.DataFrame | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write(path, page(graph, node_threshold, edge_threshold, cards, heads, qk, supernodes, labels, circuit,
                            measured))
    return path
