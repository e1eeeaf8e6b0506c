"""EAP and EAP-IG equal a reference implementation's scores: circuitkit 0.2.0 (on TransformerLens) run on a tiny
random GPT-2 and a tiny random GQA Llama (tests/data/make_eap_reference.py wrote its scores, the models and its
licence into tests/data/eap-reference/), within 1e-4 of the largest score."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import resid
from resid.analyses import circuits

DATA = Path(__file__).resolve().parents[1] / "data" / "eap-reference"
STEPS = 5


def reference_in_our_layout(ref: torch.Tensor, graph: circuits.EdgeGraph) -> torch.Tensor:
    """circuitkit's [n_forward n_backward] as our [writer reader]: the writers are in the same order; its readers
    are per layer q, k, v of every query head (GQA ungrouped, each query head with its own copy of its key/value
    head's input) and the MLP, so a shared key/value input's score is the sum over its query heads."""
    h, g = graph.n_heads, graph.n_kv_heads
    group = h // g
    columns = []
    for layer in range(graph.n_layers):
        block = ref[:, layer * (3 * h + 1):(layer + 1) * (3 * h + 1)]
        q, k, v, mlp = block[:, :h], block[:, h:2 * h], block[:, 2 * h:3 * h], block[:, 3 * h:]
        columns += [q, k.view(-1, g, group).sum(-1), v.view(-1, g, group).sum(-1), mlp]
    return torch.cat([*columns, ref[:, -1:]], dim=1).double()


@pytest.mark.parametrize("kind", ["gpt2", "llama_gqa"])
@pytest.mark.parametrize("method", ["eap", "eap_ig"])
def test_scores_equal_circuitkit(kind, method):
    tensors = load_file(str(DATA / kind / "reference.safetensors"))
    model = resid.load(DATA / kind / "model")
    graph = circuits.EdgeGraph.of(model.config)
    labels = tensors["labels"]
    options = dict(baselines=labels[:, 1].tolist(), metric="logit_diff")
    if method == "eap":
        df = circuits.eap(model, tensors["clean"], tensors["corrupt"], labels[:, 0].tolist(), **options)
    else:
        df = circuits.eap_ig(model, tensors["clean"], tensors["corrupt"], labels[:, 0].tolist(), steps=STEPS,
                             **options)
    ours = circuits.matrix(graph, df)
    expected = reference_in_our_layout(tensors[method], graph) * graph.valid
    largest = float(expected.abs().max())
    assert largest > 0.01
    assert float((ours - expected).abs().max()) <= 1e-4 * largest
