"""Report pages (resid.analyses.report) as HTML: headings, tables with their header and row counts, numbers
formatted and tinted by sign, a cut table naming its file, plotly.js embedded once or loaded from beside the page,
nothing loaded from the network, and every text escaped."""

import re

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from plotly.offline import get_plotlyjs
from random_models import make_random_model
from report_pages import headings, tables

import resid
from resid.analyses import report
from resid.identities import identity

BANNER = get_plotlyjs()[:40]  # "/**\n* plotly.js vX.Y.Z\n* Copyright ...": once per embedded copy
EVIL = "<b>x</b> & <script>alert(1)</script>"


def _page(figures: int = 1) -> report.Page:
    effects = pd.DataFrame({"site": [f"layers[{i}].mlp" for i in range(30)],
                            "effect": np.linspace(-2.0, 1.0, 30), "head": [np.nan, *range(29)]})
    tokens = pd.DataFrame({"rank": [1, 2], "token": [repr(" Paris"), repr(EVIL)], "probability": [0.7, 1.25e-5]})
    return report.Page(f"resid decompose: {EVIL!r}", f"model m · prompt: {EVIL!r}", [
        report.Section("Prediction", ["Top tokens.", report.Table(tokens, formats={"probability": "{:.3g}"})]),
        report.Section(f"Effects {EVIL}", [EVIL, report.Table(effects, signed=("effect",), rows=10, full="e.csv"),
                                           *[go.Figure(go.Bar(x=[1, 2], y=[3, -1])) for _ in range(figures)]]),
    ])


def test_a_page_has_headings_tables_and_no_text_dump() -> None:
    page = report.render(_page())
    assert page.count("<h1>") == 1 and headings(page) == ["Prediction", f"Effects {EVIL}"] and "<pre>" not in page
    (head1, rows1), (head2, rows2) = tables(page)
    assert head1 == ["rank", "token", "probability"] and [r[2] for r in rows1] == ["0.7", "1.25e-05"]
    assert head2 == ["site", "effect", "head"] and len(rows2) == 10
    assert "20 more rows not shown; every row is in e.csv." in page
    assert rows2[0] == ["layers[0].mlp", "-2", ""] and rows2[1][1:] == ["-1.897", "0"]  # whole numbers as ints
    assert re.search(r"<th class='num'>effect</th>", page) and "<td class='text'>layers[0].mlp</td>" in page


def test_signed_cells_are_tinted_by_sign_and_size() -> None:
    effects = pd.DataFrame({"value": [2.0, -1.0, 0.0]})
    page = report.render(report.Page("t", "c", [report.Section("s", [report.Table(effects, signed=("value",))])]))
    tints = re.findall(r"background:rgba\((\d+), (\d+), (\d+), ([\d.]+)\)'>([^<]*)<", page)
    assert [(r, a, text) for r, _, _, a, text in tints] == [("33", "0.550", "+2"), ("178", "0.275", "-1"),
                                                             ("33", "0.000", "+0")]


@pytest.mark.parametrize("figures", [1, 3])
def test_self_contained_embeds_plotly_once_and_loads_nothing(tmp_path, figures) -> None:
    path = report.write(_page(figures), tmp_path / "page.html")
    page = path.read_text()
    assert page.count(BANNER) == 1 and page.count("Plotly.newPlot") == figures
    assert "<script src" not in page and "<link" not in page and not (tmp_path / "plotly.min.js").exists()
    assert page.index(BANNER) < page.index("<body>")  # in the head: defined before any figure's script runs


def test_shared_js_loads_plotly_from_beside_the_page(tmp_path) -> None:
    first = report.write(_page(2), tmp_path / "a.html", self_contained=False).read_text()
    report.write(_page(), tmp_path / "b.html", self_contained=False)
    assert first.count('<script src="plotly.min.js"></script>') == 1 and BANNER not in first
    assert first.count("Plotly.newPlot") == 2 and len(first) < 100_000
    assert (tmp_path / "plotly.min.js").read_text().startswith(BANNER)


def test_a_page_without_figures_loads_no_plotly() -> None:
    page = report.render(report.Page("t", "c", [report.Section("s", ["text"])]))
    assert BANNER not in page and "plotly.min.js" not in page


def test_every_text_is_escaped() -> None:
    page = report.render(_page())
    assert "<script>alert" not in page and "<b>x</b>" not in page
    escaped = "&lt;b&gt;x&lt;/b&gt; &amp; &lt;script&gt;alert(1)&lt;/script&gt;"
    assert re.search(f"<title>[^<]*{re.escape(escaped)}", page) and re.search(f"<h1>[^<]*{re.escape(escaped)}", page)
    assert f"<p>{escaped}</p>" in page and f"<h2>Effects {escaped}</h2>" in page  # prose, heading
    assert "<td class='text'>&#x27;" + escaped + "&#x27;</td>" in page  # a table cell


def test_the_context_line_names_the_model_its_weights_and_resid() -> None:
    model = make_random_model("llama_gqa")
    line = report.context(model, "logit(' Paris')", ["first <prompt>", "second", "third"])
    weights = identity(model).weights[:12]
    assert line.startswith(f"model {model.name} (weights sha256 {weights}, float32)")
    assert "prompts: 'first <prompt>'; 'second' (+1 more)" in line and "measured: logit(' Paris')" in line
    assert line.endswith(f"resid {resid.__version__}")
