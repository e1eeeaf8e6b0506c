"""What the subcommands write with --out, on a tiny random model: embedded (the default) or shared plotly.js, the
text summary in report.html, and resample ablation with donors given in a --reference file."""

import html
import json
from pathlib import Path

import pandas as pd
import pytest
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


def test_report_holds_the_printed_summary(folder, tmp_path, capsys):
    assert main(["decompose", "When Mary and John went", "--model", str(folder), "--level", "sublayer",
                 "--out", str(tmp_path), "--shared-js"]) == 0
    printed = capsys.readouterr().out
    report = (tmp_path / "report.html").read_text()
    pre = report[report.index("<pre>") + 5 : report.index("</pre>")]
    assert "top next tokens:" in pre and "completeness: sum of" in pre
    assert printed.startswith(html.unescape(pre) + "\n\nwrote ")  # all that is printed before the file list
    assert report.count('src="plotly.min.js"') == 1 and (tmp_path / "plotly.min.js").exists()
    assert main(["decompose", "When Mary and John went", "--model", str(folder), "--level", "sublayer",
                 "--out", str(tmp_path / "alone")]) == 0
    assert (tmp_path / "alone" / "report.html").stat().st_size > PLOTLY_JS
    assert not (tmp_path / "alone" / "plotly.min.js").exists()
    capsys.readouterr()


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
