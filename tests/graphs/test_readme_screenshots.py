"""The README's pictures, made from real weights as a researcher would make them: SmolLM2-135M, per-layer transcoders
trained here by resid (every layer's from one forward pass over the demo corpus, BatchTopK, small and briefly
trained, so their graphs are rougher than those of published transcoders), the attribution graph of the Eiffel Tower
prompt in the viewer (pruned at its default thresholds, with two supernodes named from the graph itself), and the
card of one of its features. The screenshots are written to build/screenshots/ (docs/images/ holds the copies the
README shows) and checked for what they must show.

Slow (the real model; a few minutes, most of it training). The transcoders are kept in build/readme-transcoders/:
a rerun resumes their finished run instead of training again."""

import json
from pathlib import Path

import headless
import pytest
import torch
from headless import pixels_of, screenshot

from resid.analyses import Execution, corpus, features, graphs, plots
from resid.analyses.features.cards import ACTIVE
from resid.analyses.graphs.export import graph_json
from resid.analyses.graphs.viewer import write_html
from resid.analyses.training.loop import Spec, train
from resid.analyses.training.recipe import Recipe

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "build" / "screenshots"
PROMPT = "The Eiffel Tower is located in the city of"
# the viewer's colours (analyses/graphs/viewer.py): features, logits
FEATURE, LOGIT = "#984ea3", "#4daf4a"
browser = headless.browser  # the fixture
RECIPE = Recipe(activation="batchtopk", expansion=4, k=16, steps=160, batch_size=1024, warmup_steps=8,
                decay_steps=32, threshold_start_step=16, normalize="expected_average_only_in")


@pytest.fixture(scope="module")
def transcoders(smollm2) -> list:
    specs = [Spec.transcoder(smollm2, layer) for layer in range(smollm2.config.n_layers)]
    return train(smollm2, corpus.demo(max_documents=4000), specs, RECIPE,
                 Execution(batch_size=16, out=ROOT / "build" / "readme-transcoders", progress=False),
                 window=128, buffer_tokens=40 * RECIPE.batch_size)


def supernodes(graph) -> list[tuple[str, list[str]]]:
    """Two groups named from the graph: the most influential features on the subject's tokens (after the first, up
    to ' Tower'), and those in the later half of the layers at the last position, named by the top logit."""
    nodes = graph_json(graph)["nodes"]
    kept = sorted((n for n in nodes if n["feature_type"] == "cross layer transcoder"), key=lambda n: n["influence"])
    tower = graph.token_strs.index(" Tower")
    subject = [n["node_id"] for n in kept if 1 <= n["ctx_idx"] <= tower][:6]
    late = [n["node_id"] for n in kept if n["ctx_idx"] == graph.n_pos - 1 and int(n["layer"]) >= graph.n_layers // 2]
    return [(f"{''.join(graph.token_strs[1:tower + 1])!r} tokens", subject), (f"say {graph.logit_strs[0]!r}", late[:6])]


def test_the_viewer_on_the_eiffel_prompt_with_real_transcoders(smollm2, transcoders, browser) -> None:
    """The page as the README shows it: pruned at the default thresholds, the two supernodes outlined and pinned
    (their edges drawn in full, the rest faded)."""
    graph = graphs.attribute(smollm2, PROMPT, transcoders, max_feature_nodes=2048)
    groups = supernodes(graph)
    assert all(ids for _, ids in groups), groups
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = write_html(graph, SHOTS / "viewer-eiffel.html", supernodes=groups)
    data = json.loads(page.read_text().split("id='graph-data'>")[1].split("</script>")[0].replace("<\\/", "</"))
    assert data["qParams"]["supernodes"] == [[name, *ids] for name, ids in groups]
    assert len(data["nodes"]) < graph.n_nodes / 4, "pruned"
    pin = "".join(f"document.querySelector('[data-id=\"{i}\"]').dispatchEvent(new MouseEvent('click'));"
                  for _, ids in groups for i in ids)
    page.write_text(page.read_text().replace("</body>", f"<script>{pin}</script></body>"))
    image = screenshot(browser, page, SHOTS / "viewer-eiffel.png", height=1500)
    assert pixels_of(image, FEATURE) > 200 and pixels_of(image, LOGIT) > 30, "nodes not drawn"
    assert pixels_of(image, "#000000", tolerance=40) > 100, "the pinned supernodes are not outlined"


def test_a_card_of_a_feature_of_that_graph(smollm2, transcoders, browser) -> None:
    graph = graphs.attribute(smollm2, PROMPT, transcoders, max_feature_nodes=2048)
    _, (member, *_) = supernodes(graph)[1]
    layer, feature, _ = (int(x) for x in member.split("_"))
    transcoder = transcoders[layer]
    table = features.top_activating(smollm2, transcoder, corpus.demo(max_documents=60), features=[feature], k=8,
                                    context=10)
    assert len(table) and torch.isfinite(torch.tensor(table["activation"].to_numpy())).all()
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = plots.save_html(features.card(smollm2, transcoder, feature, table, k=8, examples=8),
                           SHOTS / "card-eiffel.html")
    image = screenshot(browser, page, SHOTS / "card-eiffel.png")
    assert pixels_of(image, ACTIVE) > 200, "the histogram's bars / the promoted tokens are not drawn"
