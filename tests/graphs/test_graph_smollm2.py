"""The real SmolLM2 weights (30 layers, GQA, tied embeddings): the graph through 30 random transcoders is exact to
the real-model tolerance, and the logit nodes are the model's own top predictions."""

import torch
from graph_checks import check_sums
from numerics import REAL

from resid.dictionaries import Dictionary, check


def test_a_smollm2_graph_is_exact(smollm2) -> None:
    model = smollm2
    g = torch.Generator().manual_seed(0)
    transcoders = [check(Dictionary(W_enc=torch.randn(576, 48, generator=g) / 24, b_enc=-torch.ones(48),
                                    W_dec=torch.randn(48, 576, generator=g) / 8, b_dec=torch.zeros(576),
                                    activation="relu", hook_in=f"blocks.{layer}.ln2.hook_normalized",
                                    hook_out=f"blocks.{layer}.hook_mlp_out", name=f"t{layer}"), model)
                   for layer in range(model.config.n_layers)]
    ids = model.to_tokens("The Eiffel Tower is located in the city of").ids[0].tolist()
    graph = check_sums(model, transcoders, ids, REAL)
    logits = model.run(torch.tensor([ids])).logits[0, -1]
    assert graph.logit_tokens.tolist() == logits.topk(graph.n_logits).indices.tolist()
    assert graph.logit_strs[0] == " Paris"
