"""`resid features values|top` end to end on a tiny random Llama (d_model 48, named like the fixtures' model) with
the SAELens fixture (an SAE on blocks.1.hook_resid_post) and the circuit-tracer per-layer set of
tests/data/dictionaries: the printed tables equal the analyses', --out writes the table and the figures, and bad
input ends in one line naming the flags."""

import re
from pathlib import Path

import pandas as pd
import pytest
from tiny_models import build

import resid
import resid.dictionaries
from resid.analyses import features, tables
from resid.analyses.cli.main import main
from resid.analyses.features.views import decoder_top_tokens

DATA = Path(__file__).resolve().parents[1] / "data" / "dictionaries"
SAE = str(DATA / "saelens" / "standard")
SET = str(DATA / "circuit_tracer" / "plt")
TEXTS = ["The weather was fine and the garden was green, so we walked to the river and back again.",
         "My neighbour has a cat that sleeps all day.", "Numbers such as 12 and 40 appear here."]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_llama_features")
    build("llama", folder)
    return folder


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join(TEXTS))
    return path


def test_values_prints_the_decoder_tokens_and_writes_figures(folder, tmp_path, capsys):
    out = tmp_path / "values"
    assert main(["features", "values", "--model", str(folder), "--dictionary", SAE, "--features", "0,3", "--k", "3",
                 "--out", str(out), "--format", "csv"]) == 0
    printed = capsys.readouterr().out
    model = resid.load(folder)
    sae = resid.dictionaries.load(SAE, model)
    expected = decoder_top_tokens(model, sae, [0, 3], k=3)
    for feature in (0, 3):
        top = expected[(expected["feature"] == feature) & (expected["direction"] == "top")]["token"]
        assert f"layers[1].resid_post.feature[{feature}]  top: {' '.join(repr(t) for t in top)}" in printed
    table = tables.read(out / "feature_values.csv")
    assert table[["feature", "token_id", "value"]].equals(expected[["feature", "token_id", "value"]])
    pages = sorted(p.name for p in out.glob("*.html"))
    assert pages == ["values_L1_resid_post_F0.html", "values_L1_resid_post_F3.html"]


def test_top_prints_the_scan_and_writes_cards(folder, corpus, tmp_path, capsys):
    out = tmp_path / "top"
    assert main(["features", "top", "--model", str(folder), "--dictionary", SAE, "--features", "2,5", "--k", "3",
                 "--corpus", str(corpus), "--quiet", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    model = resid.load(folder)
    expected = features.top_activating(model, resid.dictionaries.load(SAE, model), TEXTS, features=[2, 5], k=3)
    tokens = expected.attrs["provenance"]["parameters"]["tokens"]
    assert f"over 3 documents ({tokens} tokens, sign=positive)" in printed
    first = expected[expected["rank"] == 1].iloc[0]
    assert f"{first['site']} #1  a={first['activation']:+.3f}  {first['context']!r}" in printed
    table = tables.read(out / "feature_contexts.parquet")
    pd.testing.assert_frame_equal(table[["site", "rank", "activation", "doc", "pos"]],
                                  expected[["site", "rank", "activation", "doc", "pos"]])
    cards = sorted(p.name for p in out.glob("feature_*.html"))
    assert cards == [f"feature_L1_resid_post_F{f}.html" for f in sorted(set(expected["feature"]))]


def test_layers_pick_from_a_per_layer_set(folder, corpus, capsys):
    assert main(["features", "top", "--model", str(folder), "--dictionary", SET, "--layers", "0", "--features",
                 "1", "--k", "2", "--corpus", str(corpus), "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    assert lines and all(line.startswith("layers[0].mlp.feature[1] #") for line in lines)


@pytest.mark.parametrize("argv, message", [
    (["values", "--dictionary", SAE, "--features", "3,99"],
     r"Features \[99\] are not valid --features: dictionary .* has 16 features \(0..15\)"),
    (["values", "--dictionary", SAE, "--layers", "0"],
     r"--layers 0: no dictionary of .* reconstructs those layers; its dictionaries are at layers \[1\]"),
    (["values", "--dictionary", "no/such/folder"], r"--dictionary no/such/folder is not a folder"),
    (["values", "--dictionary", str(DATA / "LICENSES")], r"is not a dictionary folder resid reads"),
    (["top", "--dictionary", SAE, "--features", "x"], r"--features must be integers separated by commas"),
    (["top", "--dictionary", SAE, "--k", "0"], r"--k must be at least 1"),
])
def test_bad_input_is_one_line_naming_the_flags(folder, capsys, argv, message):
    assert main(["features", *argv, "--model", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("resid: error: ") and err.count("\n") == 1
    assert re.search(message, err), err
