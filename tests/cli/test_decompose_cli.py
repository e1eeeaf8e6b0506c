"""`resid decompose`: the printed decomposition, its completeness line, the files --out writes, and errors."""

import re

import pandas as pd
import pytest

from resid.analyses import attribution, tables
from resid.analyses.cli.main import main

pytestmark = pytest.mark.slow  # the real SmolLM2 end to end

PROMPT = "The Eiffel Tower is located in the city of"


def test_prints_predictions_lens_components_and_completeness(capsys):
    assert main(["decompose", PROMPT, "--top", "3"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    first = lines.index("top next tokens:") + 1
    assert "' Paris'" in lines[first] and "0.70" in lines[first]
    lens_header = next(i for i, line in enumerate(lines) if line.startswith("logit lens at the last token"))
    assert "target ' Paris'" in lines[lens_header]
    lens_rows = lines[lens_header + 2 : lens_header + 2 + 31]
    assert lens_rows[0].split()[0] == "embed"
    assert lens_rows[-1].split()[0] == "29" and "' Paris'" in lens_rows[-1]
    assert "top 3 components by direct attribution to logit(' Paris'):" in out
    total, actual = map(float, re.search(r"components = (\S+); model logit\(' Paris'\) = (\S+);", out).groups())
    assert abs(total - actual) < 1e-4 and abs(actual - 12.8419) < 1e-3


def test_out_writes_tables_and_report(tmp_path, capsys, smollm2):
    args = ["decompose", "When Mary and John went to the store, John gave a drink to", "--target", " Mary",
            "--baseline", " John", "--out", str(tmp_path)]
    assert main(args) == 0
    assert "logit(' Mary') - logit(' John')" in capsys.readouterr().out
    written = tables.read(tmp_path / "attribution.csv")
    expected = attribution.direct(smollm2, args[1], " Mary", " John", level="head")
    pd.testing.assert_frame_equal(written, expected, check_exact=False, rtol=1e-6, atol=1e-6)
    assert written.attrs["provenance"]["analysis"] == "attribution.direct"
    assert written.attrs["provenance"]["target"] == " Mary"
    assert r"\toprule" in (tmp_path / "attribution.tex").read_text()
    lens = tables.read(tmp_path / "logit_lens.csv")
    assert set(lens["pos"]) == set(range(len(smollm2.to_str_tokens(args[1]))))
    report = (tmp_path / "report.html").read_text()
    for title in ("Logit lens", "Direct attribution per layer", "Direct attribution per head"):
        assert title in report


def test_multi_token_target_is_one_clear_error(capsys):
    assert main(["decompose", PROMPT, "--target", " Parisian"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("resid: error: The target ' Parisian' is 2 tokens") and "first token" in err


def test_attribute_writes_a_table_for_a_prompt_set(tmp_path, capsys):
    prompts = tmp_path / "ioi.jsonl"
    prompts.write_text('{"prompt": "When Mary and John went to the store, John gave a drink to", '
                       '"target": " Mary", "baseline": " John"}\n'
                       '{"prompt": "When Tom and Anna sat in the park, Anna handed a book to", '
                       '"target": " Tom", "baseline": " Anna"}\n')
    out = tmp_path / "heads.parquet"
    assert main(["attribute", "--prompts", str(prompts), "--level", "sublayer", "--top", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "prompt 1: logit(' Tom') - logit(' Anna')" in printed and f"wrote {out} (124 rows)" in printed
    df = tables.read(out)
    sums = df.groupby("prompt_idx").agg(total=("value", "sum"), logit=("logit", "first"))
    assert ((sums.total - sums.logit).abs() < 1e-4).all() and (sums.logit > 0).all()


def test_attribute_needs_exactly_one_source(capsys):
    assert main(["attribute"]) == 2
    assert "Give either one prompt or --prompts" in capsys.readouterr().err


def test_lens_prints_and_writes(tmp_path, capsys):
    out = tmp_path / "lens.csv"
    assert main(["lens", PROMPT, "--target", " Paris", "--positions", "0,-1", "--norm", "frozen",
                 "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "frozen final norm" in lines[0] and "' Paris'" in lines[0]
    assert len(lines) == 2 + 2 * 31 + 1 and "L29 post" in lines[-2] and "' Paris'" in lines[-2]
    assert set(tables.read(out)["pos"]) == {0, 9} and (tmp_path / "lens.html").exists()


def test_lens_bad_positions_is_one_clear_error(capsys):
    assert main(["lens", PROMPT, "--positions", "last"]) == 2
    assert "--positions must be 'all' or comma-separated integers" in capsys.readouterr().err


def test_lens_every_sublayer_adds_the_mid_residuals(capsys):
    assert main(["lens", PROMPT, "--every", "sublayer"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    # The embeddings, then resid_mid and resid_post of each of the 30 layers, at the last position.
    assert len(rows) == 1 + 2 * 30 and "L29 post" in rows[-1] and "' Paris'" in rows[-1]
    assert sum("mid" in row for row in rows) == 30
