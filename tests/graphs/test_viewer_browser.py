"""The viewer page and a feature card in a real browser (headless Chromium): the viewer's script runs without an
error and draws one shape per node and one line per edge of the JSON it embeds, and screenshots of the viewer and
of a card show what they draw (pixels of the node kinds' colours; the card's histogram and decoder bars).

Skipped where no Chromium is installed, except under RESID_REQUIRE_BROWSER=1 (CI sets it, after installing
Debian's chromium), where a missing browser fails instead: CI must never skip these silently."""

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from random_dictionaries import random_dictionary
from random_models import make_random_model
from random_transcoders import per_layer

from resid.analyses import features, graphs, plots
from resid.analyses.features.cards import ACTIVE, OFF
from resid.analyses.graphs.export import graph_json
from resid.analyses.graphs.viewer import write_html
from resid.analyses.neurons.plots import COLORS

BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
REQUIRED = os.environ.get("RESID_REQUIRE_BROWSER") == "1"
# the viewer's colours (analyses/graphs/viewer.py): features, logits, embeddings, error terms
FEATURE, LOGIT, EMBEDDING, ERROR = "#984ea3", "#4daf4a", "#999999", "#ff7f00"
TEXTS = ["The weather was fine and the garden was green, so we walked to the river and back again.",
         "Numbers such as 12 and 40 appear here, and again and again in the garden."]


@pytest.fixture(scope="module")
def browser() -> str:
    if BROWSER is None:
        if REQUIRED:
            pytest.fail("RESID_REQUIRE_BROWSER=1 but no chromium is installed: apt-get install chromium")
        pytest.skip("no headless Chromium installed (apt-get install chromium)")
    return BROWSER


def screenshot(browser: str, page: Path, out: Path) -> Image.Image:
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--window-size=1400,1000", "--virtual-time-budget=15000", f"--screenshot={out}",
                           page.as_uri()], capture_output=True, text=True, timeout=180)
    assert out.is_file(), done.stderr[-2000:]
    return Image.open(out).convert("RGB")


def pixels_of(image: Image.Image, colour: str, tolerance: int = 6) -> int:
    """How many pixels are within `tolerance` of `colour` (#rrggbb) in every channel (anti-aliased edges differ)."""
    want = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(np.asarray(image, dtype=np.int16) - want) <= tolerance).all(-1).sum())


@pytest.fixture(scope="module")
def graph():
    model = make_random_model("llama_gqa")
    return graphs.attribute(model, [11, 5, 7, 2, 9, 31, 3], per_layer(model))


def test_the_viewer_draws_every_node_and_edge(browser, graph, tmp_path) -> None:
    page = write_html(graph, tmp_path / "g.html")
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                           "--v=0", "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    dom = done.stdout
    assert "Uncaught" not in done.stderr, done.stderr[-2000:]
    data = graph_json(graph, graph.model_name)
    errors = sum(n["feature_type"] == "mlp reconstruction error" for n in data["nodes"])
    assert dom.count("<circle") == len(data["nodes"]) - errors > 0
    assert dom.count("<rect") == errors
    assert dom.count("<line") == len(data["links"]) > 0


def test_a_screenshot_of_the_viewer_shows_its_nodes(browser, graph, tmp_path) -> None:
    image = screenshot(browser, write_html(graph, tmp_path / "g.html"), tmp_path / "g.png")
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
    clicks = ("<script>for (const line of document.querySelectorAll('line.edge')) {"
              "line.dispatchEvent(new MouseEvent('click')); const a = document.querySelector('#info a.qk');"
              "if (a) { a.dispatchEvent(new MouseEvent('click', {cancelable: true})); break; } }</script>")
    page.write_text(page.read_text().replace("</body>", clicks + "</body>"))
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                           "--v=0", "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert "Uncaught" not in done.stderr, done.stderr[-2000:]
    info = done.stdout[done.stdout.index("id=\"info\""):]
    assert "attending to position" in info and "top pairs (query-side term" in info, info[:2000]
    assert "against the pattern-weighted mean over keys" in info and info.count("<tr>") >= 4 * 3
