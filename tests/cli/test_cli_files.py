"""What the subcommands write with --out, on a tiny random model: embedded (the default) or shared plotly.js, the
report pages (decompose's report.html, the lens / patch / ablate figures), and resample ablation with donors given
in a --reference file."""

import html
import json
import re
from pathlib import Path

import pandas as pd
import pytest
from plotly.offline import get_plotlyjs
from report_pages import headings, tables
from tiny_models import build

import resid
from resid.analyses import ablation
from resid.analyses.cli.main import main

PROMPTS = ["When Mary and John went to the store, John gave a drink to",
           "When Anna and Paul went to the store, Paul gave a drink to",
           "When Kate and Mark went to the store, Mark gave a drink to"]
TARGETS, BASELINES = [" Mary", " Anna", " Kate"], [" John", " Paul", " Mark"]
DONORS = ["When Lucy and Tom went to the park, Tom handed a book to",
          "When Tom and Lucy went to the park, Lucy handed a book to",
          "When John and Mary went to the park, Mary handed a book to"]
PLOTLY_JS = 3_000_000  # plotly.min.js is about 4.8 MB; a page without it is tens of kB


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_llama_cli")
    build("llama", folder)
    return folder


def test_pages_open_alone_unless_they_share_plotly_js(folder, tmp_path, capsys):
    shared, alone = tmp_path / "shared", tmp_path / "alone"
    args = ["neurons", "values", "--model", str(folder), "--layers", "0", "--neurons", "0,1", "--k", "3"]
    assert main(args + ["--out", str(shared), "--shared-js"]) == 0
    pages = sorted(shared.glob("*.html"))
    assert [p.name for p in pages] == ["values_L0_N0.html", "values_L0_N1.html"]
    assert (shared / "plotly.min.js").stat().st_size > PLOTLY_JS
    for page in pages:
        assert page.stat().st_size < 100_000 and 'src="plotly.min.js"' in page.read_text()
    assert main(args + ["--out", str(alone)]) == 0  # the default
    assert not (alone / "plotly.min.js").exists() and len(list(alone.glob("*.html"))) == 2
    for page in alone.glob("*.html"):
        assert page.stat().st_size > PLOTLY_JS and 'src="plotly.min.js"' not in page.read_text()
    capsys.readouterr()


def test_lens_and_ablate_figures_share_plotly_js(folder, tmp_path, capsys):
    assert main(["lens", "When Mary and John went", "--model", str(folder), "--out", str(tmp_path / "lens.csv"),
                 "--shared-js"]) == 0
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "target": t}) + "\n" for p, t in zip(PROMPTS, TARGETS)))
    assert main(["ablate", "--model", str(folder), "--prompts", str(prompts), "--sites", "layer", "--metric", "logit",
                 "--out", str(tmp_path / "r.csv"), "--quiet", "--shared-js"]) == 0
    for page in ("lens.html", "r.html"):
        assert (tmp_path / page).stat().st_size < 100_000
    assert (tmp_path / "plotly.min.js").stat().st_size > PLOTLY_JS
    capsys.readouterr()


def test_the_decompose_report_is_a_page_of_the_printed_summary(folder, tmp_path, capsys):
    """report.html: the three parts of the printout as sections, each its table (the numbers printed) and figures;
    the completeness line as a sentence; the prompt escaped; plotly.js shared (--shared-js) or embedded once."""
    prompt = "When Mary and <b>John</b> went"
    assert main(["decompose", prompt, "--model", str(folder), "--level", "sublayer", "--top", "3",
                 "--out", str(tmp_path), "--shared-js"]) == 0
    printed = capsys.readouterr().out
    page = (tmp_path / "report.html").read_text()
    assert headings(page) == ["Prediction", "Logit lens", "Direct attribution"] and "<pre>" not in page
    assert f"<h1>resid decompose: {html.escape(repr(prompt))}</h1>" in page and "<b>John</b>" not in page
    (predicted, top), (lens, layers), (components, ranked) = tables(page)
    assert predicted == ["rank", "token", "probability"] and len(top) == 3
    assert lens == ["layer", "top token", "p(top)", "p(target)", "target rank"]
    assert [row[0] for row in layers] == ["embed", "0", "1"]  # the tiny llama's two layers
    assert components == ["site", "direct attribution"] and len(ranked) == 3
    printed_components = printed.split("components by direct attribution to")[1].splitlines()[1:4]
    assert [row[0] for row in ranked] == [line.split()[1] for line in printed_components]
    total = re.search(r"completeness: sum of (\d+) components = (\S+);", printed).groups()
    assert f"Completeness: the {total[0]} components of the table sum to {total[1]} and the model" in page
    assert page.count('<script src="plotly.min.js"></script>') == 1 and page.count("Plotly.newPlot") == 2
    assert (tmp_path / "plotly.min.js").exists()
    assert main(["decompose", "When Mary and John went", "--model", str(folder), "--level", "sublayer",
                 "--out", str(tmp_path / "alone")]) == 0
    alone = (tmp_path / "alone" / "report.html").read_text()
    assert len(alone) > PLOTLY_JS and alone.count(get_plotlyjs()[:40]) == 1 and "<script src" not in alone
    assert not (tmp_path / "alone" / "plotly.min.js").exists()
    capsys.readouterr()


def test_lens_patch_and_ablate_pages_hold_the_figure_and_the_top_rows(folder, tmp_path, capsys):
    """--out X writes X.html (patch, ablate: or --figure) as a page: a heading, the figure, a sentence on what a row
    is, and the printed rows' table, largest effect first, naming X for the rows it leaves out."""
    assert main(["lens", PROMPTS[0], "--model", str(folder), "--positions", "all",
                 "--out", str(tmp_path / "lens.csv")]) == 0
    page = (tmp_path / "lens.html").read_text()
    (header, rows), = tables(page)
    assert headings(page) == ["Logit lens"] and "Each row is one site" in page and "Plotly.newPlot" in page
    written = pd.read_csv(tmp_path / "lens.csv")
    sites = written[written["rank"] == 1]  # one row per (position, site): 3 sites at each of > 13 positions
    assert header[:4] == ["pos", "input", "site", "top token"] and len(rows) == 40 < len(sites)
    assert f"{len(sites) - 40} more rows not shown; every row is in lens.csv." in page
    assert [r[2] for r in rows[:3]] == ["embed", "L0 post", "L1 post"] and rows[3][0] == "1"
    prompts = _prompts_file(tmp_path / "p.jsonl")
    assert main(["ablate", "--model", str(folder), "--prompts", str(prompts), "--sites", "head",
                 "--out", str(tmp_path / "r.csv"), "--figure", str(tmp_path / "fig.html"), "--quiet"]) == 0
    printed = capsys.readouterr().out.split("largest mean effects on logit_diff:\n")[1].splitlines()
    page = (tmp_path / "fig.html").read_text()
    (header, rows), = tables(page)
    assert headings(page) == ["Zero-ablation effects on logit_diff"] and "Each row is one ablated site" in page
    assert header == ["site", "mean delta", "standard error", "prompts"] and len(rows) == 8  # 2 layers x 4 heads
    assert [r[0] for r in rows] == [line.split()[0] for line in printed]
    assert [float(r[1]) for r in rows] == pytest.approx([float(line.split()[1]) for line in printed], abs=1e-3)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"clean": p, "corrupt": d, "target": t, "baseline": b}) + "\n"
                             for p, d, t, b in zip(PROMPTS, PROMPTS[1:] + PROMPTS[:1], TARGETS, BASELINES)))
    assert main(["patch", "--model", str(folder), "--pairs", str(pairs), "--sites", "sublayer",
                 "--out", str(tmp_path / "patch.csv"), "--quiet"]) == 0
    printed = capsys.readouterr().out.splitlines()[2:]
    page = (tmp_path / "patch.html").read_text()
    (header, rows), = tables(page)
    assert headings(page) == ["Activation patching, denoise: logit_diff"] and "Each row is one patched site" in page
    assert header == ["site", "effect", "score"] and len(rows) == 4  # 2 layers x attn, mlp
    assert [r[0] for r in rows] == [line.split()[0] for line in printed]
    effects = [float(r[1]) for r in rows]
    assert effects == sorted(effects, key=abs, reverse=True)


def _prompts_file(path: Path) -> Path:
    path.write_text("".join(json.dumps({"prompt": p, "target": t, "baseline": b}) + "\n"
                            for p, t, b in zip(PROMPTS, TARGETS, BASELINES)))
    return path


def test_resample_uses_the_donors_of_the_reference_file(folder, tmp_path, capsys):
    prompts, donors = _prompts_file(tmp_path / "p.jsonl"), tmp_path / "donors.txt"
    donors.write_text("\n".join(DONORS) + "\n")  # no blank line: one donor per line
    common = ["ablate", "--model", str(folder), "--prompts", str(prompts), "--method", "resample",
              "--sites", "sublayer", "--quiet"]
    assert main(common + ["--reference", str(donors), "--out", str(tmp_path / "given.csv")]) == 0
    assert main(common + ["--out", str(tmp_path / "random.csv")]) == 0
    capsys.readouterr()
    given, drawn = pd.read_csv(tmp_path / "given.csv"), pd.read_csv(tmp_path / "random.csv")
    direct = ablation.sweep(resid.load(folder), PROMPTS, TARGETS, BASELINES, sites="sublayer", method="resample",
                            reference=DONORS)
    keys = ["prompt_idx", "site"]  # the sweep's chunks may come back in another order
    both = given.merge(direct, on=keys, suffixes=("", "_direct")).merge(drawn, on=keys, suffixes=("", "_random"))
    assert len(both) == len(given) == len(direct) == 3 * 4  # 3 prompts x (2 layers x attn, mlp)
    assert (both["ablated_metric"] - both["ablated_metric_direct"]).abs().max() < 1e-5
    assert (both["ablated_metric"] - both["ablated_metric_random"]).abs().max() > 1e-3


def test_resample_reference_of_the_wrong_length_names_the_flag(folder, tmp_path, capsys):
    prompts, donors = _prompts_file(tmp_path / "p.jsonl"), tmp_path / "donors.txt"
    donors.write_text("\n".join(DONORS[:2]) + "\n")
    assert main(["ablate", "--model", str(folder), "--prompts", str(prompts), "--method", "resample",
                 "--reference", str(donors), "--out", str(tmp_path / "r.csv"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--reference FILE must give one donor prompt per prompt" in err and "got 2 donors for 3 prompts" in err


def test_resample_without_donors_suggests_the_reference_flag(folder, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "When Mary and John went", "target": " Mary"}) + "\n"
                       + json.dumps({"prompt": "Anna", "target": " Paul"}) + "\n")
    assert main(["ablate", "--model", str(folder), "--prompts", str(prompts), "--method", "resample",
                 "--metric", "logit", "--out", str(tmp_path / "r.csv"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--reference FILE (one donor prompt per prompt, in order)" in err and "reference=" not in err
