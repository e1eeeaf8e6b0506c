"""A cross-layer transcoder resid trains and writes in circuit-tracer's format loads in circuit-tracer 0.5.0 and gives
there the graph resid gives (tests/data/graphs/clt, trained and written by resid, and clt-reference.safetensors,
circuit-tracer's graph through it after its own load_clt: tests/data/make_clt_reference.py, in circuit-tracer's
environment)."""

import sys
from pathlib import Path

import pytest
import torch
from numerics import TINY
from safetensors.torch import load_file

import resid
import resid.dictionaries
from resid.analyses import graphs
from resid.dictionaries.formats import circuit_tracer

DATA = Path(__file__).resolve().parents[1] / "data"
sys.path.insert(0, str(DATA))
import make_clt_reference as fixture  # noqa: E402
import make_graph_reference as tiny  # noqa: E402

EDGES = dict(rtol=0.0, atol=1e-5)  # as test_circuit_tracer_reference: absolute, the zero pattern compared exactly


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> resid.Transformer:
    return fixture.model_with_tokenizer(tmp_path_factory.mktemp("tiny"))


def test_the_committed_files_are_what_resid_trains_and_writes_today(model, tmp_path) -> None:
    """Trained again (one thread, as the fixture was), the CLT's files hold the committed weights; within 1e-5, as
    Adam's steps may round in another order on another machine. A BatchTopK threshold is the running average of each
    batch's smallest kept activation, which jumps when rounding swaps an entry at the top-k's boundary: the fused Adam
    and the in-place unit-norm projection (2026-11) left every weight within 1e-6 and moved layer 1's threshold by
    2.1e-3 of 0.36, so thresholds are compared within 1% of their size."""
    circuit_tracer.write(fixture.clt(model), tmp_path)
    committed = sorted(f.name for f in (DATA / "graphs" / "clt").glob("*.safetensors"))
    assert committed == sorted(f.name for f in tmp_path.glob("*.safetensors")) and committed
    for name in committed:
        ours, theirs = load_file(str(tmp_path / name)), load_file(str(DATA / "graphs" / "clt" / name))
        assert ours.keys() == theirs.keys(), name
        for key in ours:
            tolerance = dict(rtol=1e-2, atol=1e-5) if key.startswith("threshold") else dict(rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(ours[key], theirs[key], **tolerance, msg=f"{name} {key}")
    assert (tmp_path / "config.yaml").read_text() == (DATA / "graphs" / "clt" / "config.yaml").read_text()


def test_circuit_tracers_graph_through_the_files_equals_resids(model) -> None:
    ref = load_file(str(DATA / "graphs" / "clt-reference.safetensors"))
    loaded = resid.dictionaries.load(DATA / "graphs" / "clt", model)
    graph = graphs.attribute(model, tiny.PROMPT, loaded, skip_bos=True)  # circuit-tracer zeroes position 0
    assert graph.features.tolist() == ref["features"].tolist() and graph.n_features > 50
    assert graph.logit_tokens.tolist() == ref["logit_tokens"].tolist()
    torch.testing.assert_close(graph.logit_probabilities, ref["logit_probabilities"], **TINY)
    expected = ref["adjacency"][graph.row_nodes]
    torch.testing.assert_close(graph.rows, expected, **EDGES)
    assert torch.equal(graph.rows != 0, expected != 0), "an edge is zero in one graph and not in the other"
