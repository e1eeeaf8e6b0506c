"""The four report pages (resid decompose's report.html, and the pages resid lens, patch and ablate write beside
their tables) in a real browser (headless Chromium), as a person would look at them: each loads with nothing on
the console (no error, no warning), shows its title, section headings and tables, and plotly draws every figure
(its traces in the DOM; in the screenshot, the figures' own colours and the tables' header row). The screenshots
stay in build/screenshots/ for a person to look at.

The browser fixture and its helpers are tests/headless.py's (skipped without Chromium, unless
RESID_REQUIRE_BROWSER=1)."""

import json
import re
from pathlib import Path

import headless
import pytest
from headless import load, pixels_of, screenshot
from tiny_models import build

from resid.analyses.cli.main import main
from resid.analyses.report import CSS

browser = headless.browser  # the fixture
SHOTS = Path(__file__).resolve().parents[2] / "build" / "screenshots"
PROMPTS = ["When Mary and John went to the store, John gave a drink to",
           "When Anna and Paul went to the store, Paul gave a drink to"]
HEADER = re.search(r"th \{ background: (#\w+)", CSS).group(1)  # the tables' header row
BARS = ("#636efa", "#ef553b")  # plotly's first two colours: decompose's attention and MLP bars
BLUES, RDBU = ("#08306b",), ("#053061", "#67001f")  # the ends of the colour bars: the lens's, the signed heatmaps'
# page: (h2 headings, tables, figures, a trace class every figure of the page draws one of, colours, window height)
PAGES = {
    "decompose": (["Prediction", "Logit lens", "Direct attribution"], 3, 3, ("hm", "bars"), BARS + BLUES + RDBU, 3000),
    "lens": (["Logit lens"], 1, 1, ("hm",), BLUES, 1200),
    "patch": (["Activation patching, denoise: logit_diff"], 1, 1, ("hm",), RDBU, 1200),
    "ablate": (["Zero-ablation effects on logit_diff"], 1, 1, ("hm",), RDBU, 1200),
}


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    """The four pages, written by the command line from a tiny random llama (plotly.js embedded: the default)."""
    folder = tmp_path_factory.mktemp("report_pages")
    build("llama", folder / "model")
    model = ["--model", str(folder / "model")]
    prompts, pairs = folder / "prompts.jsonl", folder / "pairs.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "target": " Mary", "baseline": " John"}) + "\n"
                               for p in PROMPTS))
    pairs.write_text(json.dumps({"clean": PROMPTS[0], "corrupt": PROMPTS[0].replace(", John", ", Mary"),
                                 "target": " Mary", "baseline": " John"}) + "\n")
    runs = {
        "decompose": ["decompose", "When Mary and <b>John</b> went", "--out", str(folder / "decompose")],
        "lens": ["lens", PROMPTS[0], "--positions", "all", "--out", str(folder / "lens.csv")],
        "patch": ["patch", "--pairs", str(pairs), "--sites", "head", "--out", str(folder / "patch.csv"), "--quiet"],
        "ablate": ["ablate", "--prompts", str(prompts), "--sites", "head", "--out", str(folder / "ablate.csv"),
                   "--quiet"],
    }
    for args in runs.values():
        assert main(args + model) == 0
    return {"decompose": folder / "decompose" / "report.html", "lens": folder / "lens.html",
            "patch": folder / "patch.html", "ablate": folder / "ablate.html"}


@pytest.mark.parametrize("name", PAGES)
def test_a_report_page_loads_cleanly_and_draws_its_tables_and_figures(browser, pages, name) -> None:
    headings, n_tables, n_figures, traces, colours, height = PAGES[name]
    dom, console = load(browser, pages[name])
    assert console == [], console  # plotly and the page log nothing, errors included
    assert len(re.findall(r"<h1>resid \w+: ", dom)) == 1 and re.findall(r"<h2>(.*?)</h2>", dom) == headings
    assert dom.count("<table>") == n_tables and dom.count("<th class=") >= 2 * n_tables
    assert dom.count('class="plot-container plotly"') == n_figures, "plotly did not draw every figure"
    for trace in traces:
        assert re.search(rf'<g class="(?:{trace}|trace {trace})"', dom), f"no {trace} trace drawn"
    image = screenshot(browser, pages[name], SHOTS / f"report_{name}.png", height=height)
    assert pixels_of(image, HEADER, tolerance=1) > 500, "the tables' header row is not drawn"
    for colour in colours:
        assert pixels_of(image, colour, tolerance=8) > 40, f"no {colour} pixels: a figure did not draw"
