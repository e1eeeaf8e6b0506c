"""`resid graph` end to end on the tiny random Llama of tests/data/dictionaries with the committed circuit-tracer
per-layer set and cross-layer transcoder, and with a folder of SAELens transcoders as `resid train-transcoder`
writes them: the printed scores are the graph's, --out writes the viewer JSON and page, and bad input ends in one
line naming the flag."""

import importlib
import json
import re
from pathlib import Path

import pytest
import torch
from tiny_models import build

import resid
import resid.dictionaries
from resid.analyses import graphs
from resid.analyses.cli.main import main
from resid.dictionaries import Binding, Weights
from resid.dictionaries.formats import saelens

DATA = Path(__file__).resolve().parents[1] / "data" / "dictionaries" / "circuit_tracer"
PROMPT = "The cat sat on the mat because"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_llama_graph")
    build("llama", folder)
    return folder


@pytest.mark.parametrize("kind", ["plt", "clt"])
def test_graph_prints_the_scores_and_writes_the_viewer_files(folder, kind, tmp_path, capsys) -> None:
    out = tmp_path / "g.json"
    assert main(["graph", PROMPT, "--model", str(folder), "--transcoders", str(DATA / kind), "--out", str(out),
                 "--validate", "2"]) == 0
    printed = capsys.readouterr().out
    model = resid.load(folder)
    graph = graphs.attribute(model, PROMPT, resid.dictionaries.load(DATA / kind, model))
    replacement, completeness = graph.scores()
    assert f"replacement score {replacement:.4f}   completeness score {completeness:.4f}" in printed
    assert re.search(r"validation: 2 features ablated", printed)
    first = printed.splitlines()[0]  # the transcoders summarized, not every name
    summary = ("2 (layers[0].mlp .. layers[1].mlp)" if kind == "plt" else "cross-layer transcoder")
    assert f"transcoders: {summary}" in first and first.endswith(f"from {DATA / kind}"), first
    data = json.loads(out.read_text())
    assert data["metadata"]["resid"]["validation"]["factor"] == 0.0
    assert (tmp_path / "g.html").read_text().startswith("<!DOCTYPE html>")
    assert (tmp_path / "graph-metadata.json").exists()


def test_graph_reads_a_folder_of_saelens_transcoders(folder, tmp_path, capsys) -> None:
    model = resid.load(folder)
    d = model.config.d_model
    g = torch.Generator().manual_seed(0)
    loaded = []
    for layer in range(model.config.n_layers):
        W_enc, b_enc = torch.randn(d, 32, generator=g) / d**0.5, -0.3 * torch.rand(32, generator=g)
        transcoder = resid.dictionaries.Dictionary(
            Weights(W_enc, torch.randn(32, d, generator=g) / 32**0.5, torch.zeros(d), b_enc),
            binding=Binding(f"blocks.{layer}.ln2.hook_normalized", f"blocks.{layer}.hook_mlp_out"), name=f"t{layer}")
        saelens.write(transcoder, tmp_path / "set" / f"layer_{layer}")
        loaded.append(resid.dictionaries.check(transcoder, model))
    assert main(["graph", PROMPT, "--model", str(folder), "--transcoders", str(tmp_path / "set")]) == 0
    expected = graphs.attribute(model, PROMPT, loaded)
    printed = capsys.readouterr().out
    assert f"{expected.n_features} feature nodes" in printed
    assert f"transcoders: 2 (layers[0].mlp .. layers[1].mlp) from {tmp_path / 'set'}\n" in printed


@pytest.mark.parametrize("flags, message", [
    (["--node-threshold", "2"], "--node-threshold 2.0 is a share"),
    (["--out", "g.csv"], "--out 'g.csv' must end in one of .json"),
    (["--max-n-logits", "0"], "--max-n-logits"),
])
def test_bad_graph_flags_end_in_one_line(folder, flags, message, capsys) -> None:
    assert main(["graph", PROMPT, "--model", str(folder), "--transcoders", str(DATA / "plt"), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_more_logit_nodes_than_the_vocabulary_are_bounded_by_it(folder, capsys) -> None:
    """--max-n-logits 1000000 is cut to the vocabulary, and said so (the logit nodes are still the most probable
    tokens up to --desired-logit-prob)."""
    model = resid.load(folder)
    assert main(["graph", PROMPT, "--model", str(folder), "--transcoders", str(DATA / "plt"), "--max-n-logits",
                 "1000000", "--desired-logit-prob", "0.002"]) == 0
    printed = capsys.readouterr().out
    assert f"note: at most {model.config.d_vocab:,} logit nodes, the vocabulary's size (--max-n-logits 1,000,000 is " \
           f"more than {model.name} has tokens)" in printed, printed


def test_a_graph_whose_rows_cannot_fit_is_refused_before_they_are_allocated(folder, capsys, monkeypatch) -> None:
    """A flat next-token distribution up to --desired-logit-prob 0.95 makes tens of thousands of logit nodes, whose
    rows grow with their square (5 GB and more): refused, naming the flags, before anything that size exists."""
    attribute = importlib.import_module("resid.analyses.graphs.attribute")  # the module, not the function
    monkeypatch.setattr(attribute, "available_bytes", lambda device: 2**30)  # 1 GiB available, whatever the host
    assert main(["graph", PROMPT, "--model", str(folder), "--transcoders", str(DATA / "plt"), "--max-n-logits",
                 "1000000"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"resid: error: The graph would have [\d,]+ logit nodes \(the most probable next tokens until "
                     r"their probabilities sum to --desired-logit-prob 0.95, at most --max-n-logits [\d]+\) and \d+ "
                     r"feature rows: [\d.,]+ GiB of rows, more than 25% of the 1.0 GiB available\. Lower "
                     r"--max-n-logits \(circuit-tracer's default is 10\) or --desired-logit-prob\.", err), err
