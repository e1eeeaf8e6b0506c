"""The viewer page in a real browser (headless Chromium, skipped where none is installed): its script runs without
an error and draws one shape per node and one line per edge of the JSON it embeds."""

import shutil
import subprocess

import pytest
from random_models import make_random_model
from random_transcoders import per_layer

from resid.analyses import graphs
from resid.analyses.graphs.export import graph_json
from resid.analyses.graphs.viewer import write_html

BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


@pytest.mark.skipif(BROWSER is None, reason="no headless Chromium installed (apt-get install chromium)")
def test_the_viewer_draws_every_node_and_edge(tmp_path) -> None:
    model = make_random_model("llama_gqa")
    graph = graphs.attribute(model, [11, 5, 7, 2, 9, 31, 3], per_layer(model))
    page = write_html(graph, tmp_path / "g.html")
    done = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                           "--v=0", "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    dom = done.stdout
    assert "Uncaught" not in done.stderr, done.stderr[-2000:]
    data = graph_json(graph, graph.model_name)
    errors = sum(n["feature_type"] == "mlp reconstruction error" for n in data["nodes"])
    assert dom.count("<circle") == len(data["nodes"]) - errors > 0
    assert dom.count("<rect") == errors
    assert dom.count("<line") == len(data["links"]) > 0
