"""How fast the graph viewer's page opens in a real browser (issue 43's target: a 1,000-node graph in under a
second), by the size of the graph it draws.

    python benchmarks/bench_viewer.py [--features 500,1500,3000] [--repeats 5] [--threshold 0.98]
                                      [--browser chromium]

For each feature budget, a random 6-layer model with random per-layer transcoders on a 40-token prompt gives an
attribution graph of that many active features; its viewer page (resid.analyses.graphs.viewer.write_html, pruned at
node threshold --threshold and edge threshold 0.98: about 1,000 nodes from the middle budget) is opened in headless
Chromium, and a script placed after the viewer's
own reads `performance.now()` once the viewer has drawn every node and edge and set up its sliders (its script
draws synchronously): the time from the start of navigation to a page ready to use, the browser's start-up not
counted. Medians of --repeats fresh browser runs; the page's size, nodes and edges beside them. Nothing here
depends on the graph's values, only on how many nodes and edges the page draws.
"""

import argparse
import re
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

import torch

import resid
from resid.analyses import graphs
from resid.analyses.graphs.export import graph_json
from resid.analyses.graphs.viewer import write_html
from resid.dictionaries import Binding, Dictionary, Weights, check

PROBE = ("<script>document.body.setAttribute('data-ready-ms', performance.now().toFixed(1));"
         "document.body.setAttribute('data-drawn', document.querySelectorAll('.node').length);</script>")


def model_and_transcoders(d_sae: int) -> tuple[resid.Transformer, list[Dictionary]]:
    config = resid.ModelConfig(architecture="llama", d_model=64, n_layers=6, n_heads=4, n_kv_heads=4, d_head=16,
                               d_mlp=128, d_vocab=211, n_ctx=64, norm_eps=1e-5, norm="rmsnorm", act="silu",
                               gated_mlp=True, tie_embeddings=True)
    model = resid.Transformer(config, name="random-llama")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=g)
            param.copy_(1.0 + 0.2 * noise if name.endswith(".w") else 0.3 * noise)
    d = config.d_model
    transcoders = []
    for layer in range(config.n_layers):
        W_enc, b_enc = torch.randn(d, d_sae, generator=g) / d**0.5, -0.5 * torch.rand(d_sae, generator=g)
        weights = Weights(W_enc, torch.randn(d_sae, d, generator=g) / d_sae**0.5, torch.zeros(d), b_enc)
        binding = Binding(f"blocks.{layer}.ln2.hook_normalized", f"blocks.{layer}.hook_mlp_out")
        transcoders.append(check(Dictionary(weights, binding=binding, name=f"tc{layer}"), model))
    return model.eval(), transcoders


def graph_of(features: int):
    """A graph of `features` feature nodes (the budget; the transcoders are wide enough to fill it)."""
    model, transcoders = model_and_transcoders(d_sae=max(64, features // 4))
    ids = torch.randint(0, model.config.d_vocab, (40,), generator=torch.Generator().manual_seed(1))
    return graphs.attribute(model, ids, transcoders, max_feature_nodes=features)


def ready_ms(browser: str, page: Path) -> tuple[float, int]:
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000",
                           "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    found = re.search(r'data-ready-ms="([^"]+)" data-drawn="([^"]+)"', done.stdout)
    if found is None:
        raise SystemExit(f"the page did not report its time: {done.stderr[-1500:]}")
    return float(found.group(1)), int(found.group(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", default="500,1500,3000")
    parser.add_argument("--threshold", type=float, default=0.98, help="the node threshold the page is written at")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--browser", default=next((b for b in ("chromium", "chromium-browser", "google-chrome")
                                                   if shutil.which(b)), None))
    args = parser.parse_args()
    if args.browser is None:
        raise SystemExit("no headless Chromium found: apt-get install chromium, or pass --browser")
    print(f"{'nodes':>6} {'edges':>7} {'page MB':>8} {'ready (ms, median)':>19}  all runs")
    with tempfile.TemporaryDirectory() as folder:
        for size in (int(x) for x in args.features.split(",")):
            graph = graph_of(size)
            page = write_html(graph, Path(folder) / f"g{size}.html", node_threshold=args.threshold)
            page.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
            data = graph_json(graph, node_threshold=args.threshold)
            runs = [ready_ms(args.browser, page) for _ in range(args.repeats)]
            drawn = {d for _, d in runs}
            if drawn != {len(data["nodes"])}:
                raise SystemExit(f"the page drew {drawn} nodes of the JSON's {len(data['nodes'])}")
            times = [t for t, _ in runs]
            print(f"{len(data['nodes']):>6} {len(data['links']):>7} {page.stat().st_size / 2**20:>8.1f} "
                  f"{statistics.median(times):>19.0f}  {', '.join(f'{t:.0f}' for t in times)}")


if __name__ == "__main__":
    main()
