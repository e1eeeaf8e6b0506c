"""`resid circuit`: the edge table, the faithfulness curve and the circuit's page it writes on a tiny GQA Llama equal
resid.analyses.circuits'; bad arguments are refused before the model loads."""

import pandas as pd
import pytest
from tiny_models import build

from resid.analyses import circuits
from resid.analyses.cli.main import main

PAIRS = [
    {"clean": "When Mary and John went to the store, John gave a drink to",
     "corrupt": "When Mary and John went to the store, Mary gave a drink to", "target": " Mary", "baseline": " John"},
    {"clean": "When Alice and Bob went to the store, Bob gave a drink to",
     "corrupt": "When Alice and Bob went to the store, Alice gave a drink to", "target": " Alice", "baseline": " Bob"},
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    where = tmp_path_factory.mktemp("tiny_llama_circuit")
    build("llama_gqa_tied", where)
    return where


@pytest.mark.parametrize("method", ["eap", "exact"])
def test_circuit_writes_edges_curve_and_page(tmp_path, capsys, folder, method):
    import json

    import resid

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    out = tmp_path / "edges.csv"
    assert main(["circuit", "--model", str(folder), "--pairs", str(pairs), "--method", method, "--fractions",
                 "0.1,0.5,1", "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "CPR" in printed and "CMD" in printed
    edges = pd.read_csv(out)
    model = resid.load(folder)
    texts = [[p[k] for p in PAIRS] for k in ("clean", "corrupt", "target", "baseline")]
    expected = (circuits.eap if method == "eap" else circuits.exact)(model, *texts[:3], texts[3])
    assert list(edges["writer"]) == list(expected["writer"]) and list(edges["reader"]) == list(expected["reader"])
    pd.testing.assert_series_equal(edges["score"], expected["score"], atol=1e-5, check_names=False)
    curve = pd.read_csv(tmp_path / "edges-curve.csv")
    assert list(curve["fraction"]) == [0.1, 0.5, 1.0]
    assert curve["faithfulness"].iloc[-1] == pytest.approx(1.0, abs=1e-4)
    page = (tmp_path / "edges.html").read_text()
    assert "edges</h2>" in page and "logits" in page


@pytest.mark.parametrize("flags, message", [
    (["--k", "3", "--threshold", "0.1"], "give one"),
    (["--fractions", "0.5,0.1"], "increasing"),
    (["--steps", "0"], "positive"),
])
def test_bad_arguments_are_refused(tmp_path, capsys, folder, flags, message):
    code = main(["circuit", "--model", str(folder), "--clean", "a b", "--corrupt", "a c", "--target", " d",
                 "--out", str(tmp_path / "e.csv"), *flags])
    assert code == 2 and message in capsys.readouterr().err


def test_one_source_of_pairs(tmp_path, capsys, folder):
    code = main(["circuit", "--model", str(folder), "--clean", "a b", "--out", str(tmp_path / "e.csv")])
    assert code == 2 and "--clean TEXT --corrupt TEXT --target TOKEN" in capsys.readouterr().err
