"""The real SmolLM2 weights (30 layers, GQA, tied embeddings): the graph through 30 random transcoders is exact to
the real-model tolerance, and the logit nodes are the model's own top predictions."""

import torch
from graph_checks import check_sums
from numerics import REAL

from resid.dictionaries import Binding, Dictionary, Weights, check


def test_a_smollm2_graph_is_exact(smollm2) -> None:
    model = smollm2
    g = torch.Generator().manual_seed(0)
    transcoders = []
    for layer in range(model.config.n_layers):
        W_enc = torch.randn(576, 48, generator=g) / 24
        weights = Weights(W_enc, torch.randn(48, 576, generator=g) / 8, torch.zeros(576), -torch.ones(48))
        binding = Binding(f"blocks.{layer}.ln2.hook_normalized", f"blocks.{layer}.hook_mlp_out")
        transcoders.append(check(Dictionary(weights, binding=binding, name=f"t{layer}"), model))
    ids = model.to_tokens("The Eiffel Tower is located in the city of").ids[0].tolist()
    graph = check_sums(model, transcoders, ids, REAL)
    logits = model.run(torch.tensor([ids])).logits[0, -1]
    assert graph.logit_tokens.tolist() == logits.topk(graph.n_logits).indices.tolist()
    assert graph.logit_strs[0] == " Paris"
