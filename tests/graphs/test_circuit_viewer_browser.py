"""The viewer's layout on a 3,000-feature graph in headless Chromium: every feature node of a (layer, position) cell
drawn apart from the others (no two centres closer than the node gap), the most influential first along each
line, and supernodes drawn as boxes around their members with their names. The graph is synthetic (a random DAG of
12 layers x 16 positions x 17 features, each reading three earlier ones and its token, each writing into the
logits: 3,264 features, about 3,250 kept), so the page is as large as a real 3,000-feature graph's without
computing one."""

import json
import re

import headless
import pytest
import torch
from headless import dump_dom

from resid.analyses.graphs.export import graph_json
from resid.analyses.graphs.graph import Graph
from resid.analyses.graphs.viewer import write_html

browser = headless.browser  # the fixture
LAYERS, POSITIONS, PER_CELL, LOGITS = 12, 16, 17, 2
GAP = 16  # viewer.js's node gap, px


def synthetic() -> Graph:
    g = torch.Generator().manual_seed(0)
    features = torch.tensor([(l, p, f) for l in range(LAYERS) for p in range(POSITIONS) for f in range(PER_CELL)])
    n_f, n_e = len(features), LAYERS * POSITIONS
    n = n_f + n_e + POSITIONS + LOGITS
    rows = torch.zeros(n_f + LOGITS, n)
    for t, (l, p, _) in enumerate(features.tolist()):
        rows[t, n_f + n_e + p] = torch.rand(1, generator=g) + 0.1  # its token
        if l:
            earlier = ((features[:, 0] < l) & (features[:, 1] <= p)).nonzero().flatten()
            picked = earlier[torch.randint(len(earlier), (3,), generator=g)]
            rows[t, picked] = torch.randn(3, generator=g)
    rows[n_f:, :n_f] = torch.randn(LOGITS, n_f, generator=g) * (0.5 + torch.rand(n_f, generator=g))  # every one writes
    return Graph(model_name="synthetic", token_ids=torch.arange(POSITIONS), token_strs=[f" t{p}" for p in
                 range(POSITIONS)], n_layers=LAYERS, features=features, activations=torch.ones(n_f),
                 pre_activations=torch.ones(n_f), active_features=features, logit_tokens=torch.tensor([1, 2]),
                 logit_probabilities=torch.tensor([0.6, 0.3]), logit_values=torch.tensor([3.0, 2.0]),
                 logit_strs=[" a", " b"], rows=rows, transcoders="synthetic")


@pytest.fixture(scope="module")
def drawn(browser, tmp_path_factory):
    graph = synthetic()
    kept = [n["node_id"] for n in graph_json(graph, "g", 1.0, 0.999)["nodes"]
            if n["feature_type"] == "cross layer transcoder"]
    groups = [("early", [i for i in kept if i.startswith("0_") and i.endswith("_0")][:6]),
              ("late", [i for i in kept if i.startswith("11_")][-40::8])]
    page = write_html(graph, tmp_path_factory.mktemp("viewer") / "g.html", 1.0, 0.999, supernodes=groups)
    data = json.loads(page.read_text().split("id='graph-data'>")[1].split("</script>")[0].replace("<\\/", "</"))
    return graph, data, groups, dump_dom(browser, page)


def _circles(dom: str) -> dict[str, tuple[float, float, str]]:
    out = {}
    for tag in re.findall(r"<circle [^>]*>", dom):
        at = dict(re.findall(r'([\w-]+)="([^"]*)"', tag))
        out[at["data-id"]] = (float(at["cx"]), float(at["cy"]), at["class"])
    return out


def test_a_cells_features_are_spread_apart_most_influential_first(drawn) -> None:
    graph, data, _, dom = drawn
    circles = _circles(dom)
    features = [n for n in data["nodes"] if n["feature_type"] == "cross layer transcoder"]
    assert len(features) >= 3000 and all(n["node_id"] in circles for n in features)
    cells: dict[tuple[str, int], list[dict]] = {}
    for n in features:
        cells.setdefault((n["layer"], n["ctx_idx"]), []).append(n)
    crowded = 0
    for members in cells.values():
        at = torch.tensor([circles[n["node_id"]][:2] for n in members])
        gaps = torch.cdist(at, at) + torch.eye(len(at)) * 1e9
        assert float(gaps.min()) >= GAP * 0.9, f"two nodes of a cell {float(gaps.min()):.1f} px apart"
        crowded += len(members) >= 12
        by_line: dict[float, list[dict]] = {}
        for n in members:
            by_line.setdefault(circles[n["node_id"]][1], []).append(n)
        for line in by_line.values():  # left to right: the cumulative influence rank grows
            ordered = sorted(line, key=lambda n: circles[n["node_id"]][0])
            ranks = [n["influence"] for n in ordered]
            assert ranks == sorted(ranks)
    assert crowded > 100  # the graph does crowd its cells


def test_supernodes_are_boxes_around_their_members(drawn) -> None:
    _, _, groups, dom = drawn
    circles = _circles(dom)
    boxes = re.findall(r'<rect [^>]*class="supernode-box"[^>]*>', dom)
    assert len(boxes) == len(groups)
    for tag, (name, ids) in zip(boxes, groups, strict=True):
        at = dict(re.findall(r'([\w-]+)="([^"]*)"', tag))
        x, y, w, h = (float(at[k]) for k in ("x", "y", "width", "height"))
        assert at["data-name"] == name
        for i in ids:
            cx, cy, _ = circles[i]
            assert x < cx < x + w and y < cy < y + h
        assert f">{name}</text>" in dom


def test_the_viewer_script_is_a_file_node_parses() -> None:
    """The viewer's JavaScript is package data (analyses/graphs/viewer.js), which a JS tool reads as it is."""
    import shutil
    import subprocess
    from importlib import resources

    node = shutil.which("node")
    if node is None:
        pytest.skip("no node installed")
    script = resources.files("resid.analyses.graphs").joinpath("viewer.js")
    done = subprocess.run([node, "--check", str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
