"""`resid ablate --source` and `resid patch --source --corrupt-source` on a tiny Marian folder (with a word
tokenizer): the tables they write equal ablation.sweep / patching.activation / patching.atp called with source=, and
bad source arguments are refused before the model loads."""

import json

import pandas as pd
import pytest
from seq2seq_words import worded_marian

from resid.analyses import ablation, patching
from resid.analyses.cli.main import main

PROMPTS = ["w4 w21", "w9 w13 w2", "w33"]
SOURCES = ["w3 w9 w14", "w7 w8", "w11 w30 w5 w2"]
CORRUPT = ["w3 w9 w15", "w7 w50", "w12 w30 w5 w2"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("marian")
    worded_marian(folder)
    return folder


def _lines(path, records) -> str:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return str(path)


def test_ablate_with_sources_from_a_file(folder, tmp_path, capsys):
    prompts = _lines(tmp_path / "prompts.jsonl", [{"prompt": p, "target": "w7"} for p in PROMPTS])
    sources = tmp_path / "sources.txt"
    sources.write_text("\n".join(SOURCES) + "\n")
    out = tmp_path / "sweep.csv"
    assert main(["ablate", "--model", str(folder), "--prompts", prompts, "--source", str(sources), "--sites",
                 "head", "--metric", "logit", "--out", str(out), "--quiet"]) == 0
    assert "encoder.layers" in capsys.readouterr().out
    df = pd.read_csv(out)
    model = worded_marian(tmp_path / "again")[1]
    expected = ablation.sweep(model, PROMPTS, "w7", sites="head", metric="logit", source=SOURCES)
    joined = df.merge(expected, on=["prompt_idx", "site"])  # the store keeps rows in the order they were computed
    assert len(joined) == len(df) == len(expected) == 3 * 20  # encoder 2 x 4 heads, decoder 3 x (2 self + 2 cross)
    assert joined.delta_x.to_numpy() == pytest.approx(joined.delta_y.to_numpy(), abs=1e-5)
    assert (tmp_path / "sweep.html").exists()


@pytest.mark.parametrize("method", ["exact", "atp"])
def test_patch_with_clean_and_corrupt_sources(folder, tmp_path, method):
    pairs = _lines(tmp_path / "pairs.jsonl", [{"clean": p, "corrupt": p, "target": "w7"} for p in PROMPTS])
    clean, corrupt = tmp_path / "clean.jsonl", tmp_path / "corrupt.jsonl"
    _lines(clean, [{"text": s} for s in SOURCES])
    _lines(corrupt, [{"text": s} for s in CORRUPT])
    out = tmp_path / "patch.csv"
    assert main(["patch", "--model", str(folder), "--pairs", pairs, "--source", str(clean), "--corrupt-source",
                 str(corrupt), "--sites", "sublayer", "--method", method, "--metric", "logit", "--out", str(out)]) == 0
    df = pd.read_csv(out)
    model = worded_marian(tmp_path / "again")[1]
    run = patching.activation if method == "exact" else patching.atp
    expected = run(model, PROMPTS, PROMPTS, "w7", sites="sublayer" if method == "exact" else ("sublayer",),
                   metric="logit", source=SOURCES, corrupt_source=CORRUPT)
    assert df.site.tolist() == expected.site.tolist()
    assert "encoder.layers[0].mlp" in set(df.site) and "layers[1].cross" in set(df.site)
    assert df.patched_metric.to_numpy() == pytest.approx(expected.patched_metric.to_numpy(), abs=1e-5)


def test_one_source_text_is_every_prompts_source(folder, tmp_path):
    prompts = _lines(tmp_path / "prompts.jsonl", [{"prompt": p, "target": "w7"} for p in PROMPTS])
    out = tmp_path / "sweep.parquet"
    assert main(["ablate", "--model", str(folder), "--prompts", prompts, "--source", "w3 w9 w14", "--method", "mean",
                 "--out", str(out), "--quiet"]) == 0
    df = pd.read_parquet(out)
    model = worded_marian(tmp_path / "again")[1]
    expected = ablation.sweep(model, PROMPTS, "w7", method="mean", source=["w3 w9 w14"] * 3)
    joined = df.merge(expected, on=["prompt_idx", "site"])
    assert len(joined) == len(expected) > 0
    assert joined.delta_x.to_numpy() == pytest.approx(joined.delta_y.to_numpy(), abs=1e-5)


def test_bad_sources_are_refused(folder, tmp_path, capsys):
    prompts = _lines(tmp_path / "prompts.jsonl", [{"prompt": p, "target": "w7"} for p in PROMPTS])
    two = tmp_path / "two.txt"
    two.write_text("w1\nw2\n")
    out = str(tmp_path / "x.csv")
    assert main(["ablate", "--model", str(folder), "--prompts", prompts, "--source", str(two), "--out", out]) == 2
    assert "holds 2 sources for 3 prompts" in capsys.readouterr().err
    assert main(["ablate", "--model", str(folder), "--prompts", prompts, "--source", "missing.txt", "--out",
                 out]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["ablate", "--model", str(folder), "--prompts", prompts, "--out", out, "--quiet"]) == 2
    assert "encoder-decoder model" in capsys.readouterr().err
    pairs = _lines(tmp_path / "pairs.jsonl", [{"clean": p, "corrupt": p, "target": "w7"} for p in PROMPTS])
    assert main(["patch", "--model", str(folder), "--pairs", pairs, "--corrupt-source", "w1", "--out", out]) == 2
    assert "--corrupt-source goes with --source" in capsys.readouterr().err
