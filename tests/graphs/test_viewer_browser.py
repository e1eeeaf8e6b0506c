"""The viewer page and a feature card in a real browser (headless Chromium): the viewer's script runs without an
error and draws one shape per node and one line per edge of the JSON it embeds, with its legend and threshold
sliders; moving the node slider hides nodes, a click pins a node, hovering shows its tooltip, token labels are
drawn at a readable size across the window; screenshots of the viewer and of a card show what they draw (pixels
of the node kinds' colours; the card's histogram and decoder bars).

The browser fixture and its helpers are tests/headless.py's (skipped without Chromium, unless
RESID_REQUIRE_BROWSER=1)."""

import base64
import html
import io
import json
import re
import urllib.parse

import headless
import pytest
from headless import dump_dom, pixels_of, screenshot
from PIL import Image
from random_dictionaries import random_dictionary
from random_models import make_random_model
from random_transcoders import per_layer

from resid.analyses import features, graphs, plots
from resid.analyses.features.cards import ACTIVE, OFF
from resid.analyses.graphs.export import graph_json
from resid.analyses.graphs.viewer import OPEN_SHARE, write_html
from resid.analyses.neurons.plots import COLORS

browser = headless.browser  # the fixture
# the viewer's colours (analyses/graphs/viewer.py): features, logits, embeddings, error terms
FEATURE, LOGIT, EMBEDDING, ERROR = "#984ea3", "#4daf4a", "#999999", "#ff7f00"
TEXTS = ["The weather was fine and the garden was green, so we walked to the river and back again.",
         "Numbers such as 12 and 40 appear here, and again and again in the garden."]


@pytest.fixture(scope="module")
def graph():
    model = make_random_model("llama_gqa")
    return graphs.attribute(model, [11, 5, 7, 2, 9, 31, 3], per_layer(model))


def test_the_viewer_draws_every_node_and_edge(browser, graph, tmp_path) -> None:
    """The page opens showing the most influential links that hold OPEN_SHARE of the links' influence (a line is
    made when first shown), and one shape per node; the edge slider at its written value shows every link."""
    page = write_html(graph, tmp_path / "g.html")
    dom = dump_dom(browser, page)
    assert "id=\"legend\"" in dom and all(key in dom for key in ("feature", "error", "token", "logit"))
    assert "id=\"node-threshold\"" in dom and "id=\"edge-threshold\"" in dom and "Hover a node" in dom
    data = graph_json(graph, graph.model_name)
    errors = sum(n["feature_type"] == "mlp reconstruction error" for n in data["nodes"])
    assert dom.count("<circle") == len(data["nodes"]) - errors > 0
    assert dom.count("<rect") == errors
    ranked = sorted((link["influence"] for link in data["links"]), reverse=True)
    opening = next(i + 1 for i in range(len(ranked)) if sum(ranked[:i + 1]) >= OPEN_SHARE * sum(ranked) * (1 - 1e-9))
    assert len(re.findall(r'<line [^>]*class="link', dom)) == opening < len(data["links"])
    everything = ("const e = document.getElementById('edge-threshold'); e.value = e.max;"
                  "e.dispatchEvent(new Event('input'));")
    dom = dump_dom(browser, page, everything)
    classes = re.findall(r'class="((?:node|link)[^"]*)"', dom)
    assert classes and not any("hidden" in c for c in classes), "at its written thresholds the page shows all"
    assert len(re.findall(r'<line [^>]*class="link', dom)) == len(data["links"]) > 0


def test_the_sliders_hide_nodes_a_click_pins_one_and_labels_are_readable(browser, graph, tmp_path) -> None:
    """Halving the edge slider hides edges; moving the node slider to the median feature's influence hides nodes
    (not all: tokens and logits stay); then a click on a shown feature pins it (the rest fades) and hovering it
    shows its tooltip; token labels are >= 10 CSS px high and the drawing spans most of the 1400 px window."""
    data = graph_json(graph, graph.model_name)
    ranked = sorted(n["influence"] for n in data["nodes"] if n["feature_type"] == "cross layer transcoder")
    value = round(ranked[len(ranked) // 2], 2)  # about half the features: the crossing one is kept
    actions = ("const e = document.getElementById('edge-threshold'); e.value = e.max / 2;"
               "e.dispatchEvent(new Event('input')); document.body.setAttribute('data-links',"
               "  document.querySelectorAll('line.link:not(.hidden)').length); e.value = e.max;"
               "e.dispatchEvent(new Event('input'));"
               f"const s = document.getElementById('node-threshold'); s.value = {value};"
               "s.dispatchEvent(new Event('input'));"
               "const f = [...document.querySelectorAll('circle.node:not(.hidden)')].find(c =>"
               "  c.getAttribute('fill') === '#984ea3');"
               "f.dispatchEvent(new MouseEvent('click')); f.dispatchEvent(new MouseEvent('mouseenter'));"
               "const label = document.querySelector('text.token').getBoundingClientRect();"
               "document.body.setAttribute('data-label-height', label.height);"
               "document.body.setAttribute('data-svg-width', document.getElementById('graph')"
               "  .getBoundingClientRect().width);")
    dom = dump_dom(browser, write_html(graph, tmp_path / "g.html"), actions)
    nodes = [set(c.split()) for c in re.findall(r'<(?:circle|rect) [^>]*class="(node[^"]*)"', dom)]
    fixed = sum(n["feature_type"] in ("embedding", "logit") for n in data["nodes"])
    shown = sum("hidden" not in c for c in nodes)
    assert len(nodes) == len(data["nodes"]) and fixed < shown < len(nodes), "the slider hid no node, or all"
    assert sum("pinned" in c for c in nodes) == 1 and sum("faded" in c for c in nodes) > 0
    assert 'class="link faded"' in dom or 'class="link edge faded"' in dom
    tip = dom[dom.index('id="tip"'):dom.index('id="info"')]
    assert "display: block" in tip and "activation" in tip and "top edges" in tip, tip
    assert 0 < int(dom.split('data-links="')[1].split('"')[0]) < len(data["links"]), "the edge slider hid no edge"
    height = float(dom.split('data-label-height="')[1].split('"')[0])
    width = float(dom.split('data-svg-width="')[1].split('"')[0])
    assert height >= 10 and width >= 0.9 * (1400 - 2 * 12 - 20), (height, width)


def test_a_screenshot_of_the_viewer_shows_its_nodes(browser, graph, tmp_path) -> None:
    page = write_html(graph, tmp_path / "g.html")  # the legend hidden: its swatches have the nodes' colours
    page.write_text(page.read_text().replace("</head>", "<style>#legend{visibility:hidden}</style></head>"))
    image = screenshot(browser, page, tmp_path / "g.png")
    kinds = {n["feature_type"] for n in graph_json(graph, graph.model_name)["nodes"]}
    assert {"embedding", "logit", "cross layer transcoder"} <= kinds  # the pruned graph keeps features
    assert pixels_of(image, LOGIT) > 30 and pixels_of(image, EMBEDDING) > 30, "logit / embedding nodes not drawn"
    assert pixels_of(image, FEATURE) > 30, "feature nodes not drawn"
    assert pixels_of(image, ERROR) > 30, "error nodes not drawn"
    blank = pixels_of(image, "#ffffff", tolerance=2)
    assert blank < image.width * image.height * 0.995, "the page is blank"


def test_a_screenshot_of_a_feature_card_shows_its_bars(browser, gpt2_tokenizer, tmp_path) -> None:
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    sae = random_dictionary(model, "blocks.1.hook_resid_post", seed=1)
    table = features.top_activating(model, sae, TEXTS, features=[2, 5], k=4, window=12)
    feature = int(table["feature"].iloc[0])
    page = plots.save_html(features.card(model, sae, feature, table, k=6), tmp_path / "card.html")
    image = screenshot(browser, page, tmp_path / "card.png")
    assert pixels_of(image, ACTIVE) > 200, "the histogram's active bars / the promoted tokens are not drawn"
    assert pixels_of(image, COLORS["bottom"]) > 200, "the suppressed tokens' bars are not drawn"
    assert pixels_of(image, OFF) > 50, "the histogram's 'off' bar is not drawn"


def test_clicking_an_edge_then_a_head_shows_why_the_head_attended(browser, graph, tmp_path) -> None:
    """With a head split and QK summaries: a click on an edge lists its heads, a click on a head shows its score
    at the edge's source position split into pairs of terms, and the contrast with the mean."""
    model = make_random_model("llama_gqa")
    transcoders = per_layer(model)
    pruned = graph.pruned()
    split = graphs.split_heads(model, pruned, transcoders)
    qk = graphs.QK(model, graph.token_ids, transcoders).summaries(split.carriers(per_edge=3, limit=40), top=4)
    page = write_html(graph, tmp_path / "g.html", heads=split, qk=qk)
    clicks = ("for (const line of document.querySelectorAll('line.edge')) {"
              "line.dispatchEvent(new MouseEvent('click')); const a = document.querySelector('#info a.qk');"
              "if (a) { a.dispatchEvent(new MouseEvent('click', {cancelable: true})); break; } }")
    dom = dump_dom(browser, page, clicks)
    info = dom[dom.index("id=\"info\""):]
    assert "attending to position" in info and "top pairs (query-side term" in info, info[:2000]
    assert "against the pattern-weighted mean over keys" in info and info.count("<tr>") >= 4 * 3


def test_find_group_and_export_a_pinned_subgraph(browser, graph, tmp_path) -> None:
    """'find' pins a feature by id at every position it has; 'group pinned' makes them a named supernode (outlined,
    listed); 'export' offers the pinned nodes, the links through them and the supernodes as the graph's JSON, and
    'export view' the drawing as shown as an SVG file; a JSON written with supernodes shows them when it opens."""
    data = graph_json(graph, graph.model_name)
    feature = next(n for n in data["nodes"] if n["feature_type"] == "cross layer transcoder")
    layer_feature = feature["node_id"].rsplit("_", 1)[0]  # "L_F": every position of this feature
    at = [n["node_id"] for n in data["nodes"] if n["node_id"].startswith(layer_feature + "_")]
    actions = (f"const s = document.getElementById('search'); s.value = '{layer_feature}';"
               "s.dispatchEvent(new Event('change'));"
               "document.getElementById('group-name').value = 'my concept';"
               "document.getElementById('group').dispatchEvent(new MouseEvent('click'));"
               "document.getElementById('export').dispatchEvent(new MouseEvent('click'));"
               "document.getElementById('export-svg').dispatchEvent(new MouseEvent('click'));")
    dom = dump_dom(browser, write_html(graph, tmp_path / "g.html"), actions)
    assert f"{len(at)} found" in dom and f'title="{", ".join(at)}">my concept ({len(at)})' in dom
    assert len(re.findall(r'class="node[^"]*grouped', dom)) == len(at)
    href = html.unescape(re.search(r'id="download"[^>]*href="([^"]+)"', dom).group(1))
    sub = json.loads(urllib.parse.unquote(href.split(",", 1)[1]))
    assert sub["qParams"]["supernodes"] == [["my concept", *at]] and set(at) <= {n["node_id"] for n in sub["nodes"]}
    assert sub["links"] and all(l["source"] in at or l["target"] in at for l in sub["links"])
    svg = urllib.parse.unquote(html.unescape(re.search(r'id="download-svg"[^>]*href="([^"]+)"', dom).group(1))
                               .split(",", 1)[1])
    assert svg.count('class="supernode-box"') == 1  # the group's box
    assert svg.startswith("<svg") and svg.count("<circle") + svg.count("<rect") - 1 == len(data["nodes"])
    assert 'opacity="0.08"' in svg  # the view as shown: what the pins faded, faded
    # supernodes already in the JSON (Neuronpedia's qParams) are read back
    dom = dump_dom(browser, write_html(graph, tmp_path / "read.html", supernodes=[("kept", [at[0]])]), "")
    assert f'title="{at[0]}">kept (1)' in dom and len(re.findall(r'class="node[^"]*grouped', dom)) == 1


def test_logits_spread_a_png_export_and_the_panel_lists_shown_edges(browser, graph, tmp_path) -> None:
    """The logits spread along the top row (no two at one place), each labelled with its token; '(PNG)' offers the
    view as a PNG image twice the drawing's size; with the edge slider lowered, a clicked node's panel lists only
    the edges still shown and says how many the sliders hide."""
    actions = ("const e = document.getElementById('edge-threshold'); e.value = e.max / 3;"
               "e.dispatchEvent(new Event('input'));"
               "const ends = l => [l.getAttribute('data-source'), l.getAttribute('data-target')];"
               "const shown = new Set([...document.querySelectorAll('line.link:not(.hidden)')].flatMap(ends));"
               "const node = [...document.querySelectorAll('line.link.hidden')].flatMap(ends)"
               "  .find(id => shown.has(id));"  # a node with shown and hidden edges
               "document.body.setAttribute('data-clicked', node);"
               "document.querySelector(`[data-id=\"${node}\"]`).dispatchEvent(new MouseEvent('click'));"
               "document.getElementById('export-png').dispatchEvent(new MouseEvent('click'));")
    dom = dump_dom(browser, write_html(graph, tmp_path / "g.html"), actions, wait_ms=10000)
    logits = [n for n in graph_json(graph, graph.model_name)["nodes"] if n["feature_type"] == "logit"]
    xs = re.findall(r'<circle cx="([^"]+)" cy="[^"]+" r="[^"]+" fill="#4daf4a"', dom)
    assert len(xs) == len(logits) > 1 and len({round(float(x)) for x in xs}) == len(logits), xs
    assert dom.count('class="logit-label"') == len(logits)
    shown = {(a, b) for a, b in re.findall(r'<line [^>]*class="link[^"]*" data-source="([^"]+)" data-target="([^"]+)"',
                                         dom)}
    hidden = {(a, b) for a, b in re.findall(
        r'<line [^>]*class="link[^"]*hidden[^"]*" data-source="([^"]+)" data-target="([^"]+)"', dom)}
    info = dom[dom.index('id="info"'):]
    listed = set(re.findall(r"<tr><td>([^<]+)</td><td>→</td><td>([^<]+)</td>", info))
    clicked = dom.split('data-clicked="')[1].split('"')[0]
    assert hidden and listed and not listed & hidden and listed <= shown - hidden
    links = graph_json(graph, graph.model_name)["links"]
    through = sum(clicked in (link["source"], link["target"]) for link in links) - sum(
        clicked in pair for pair in shown - hidden)
    assert through and f"{through} more hidden by the sliders" in info
    png = base64.b64decode(re.search(r'id="download-png"[^>]*href="data:image/png;base64,([^"]+)"', dom).group(1))
    image = Image.open(io.BytesIO(png))
    width = float(re.search(r'<svg id="graph"[^>]*width="([^"]+)"', dom).group(1))
    assert image.size[0] == 2 * round(width) and pixels_of(image.convert("RGB"), LOGIT) > 30
