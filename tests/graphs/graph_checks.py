"""The exactness check every graph test shares: the replacement model run forward from its nodes reproduces the
model (logits and the transcoders' inputs), and the edges into each node plus its constant terms (the same forward
with every node write zero) equal its value."""

import torch

from resid.analyses import graphs
from resid.analyses.graphs.replacement import replace
from resid.analyses.graphs.replay import replay


def check_sums(model, transcoders, ids: list[int], tolerance: dict, **options) -> graphs.Graph:
    graph = graphs.attribute(model, ids, transcoders, **options)
    rep = replace(model, ids, transcoders, skip_bos=options.get("skip_bos"))
    inputs, logits = replay(rep)
    torch.testing.assert_close(logits[-1], rep.uncapped, **tolerance)  # the replacement model is the model here
    capped = model.run(torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(rep.logits, capped, **tolerance)
    for x, real in zip(inputs, rep.inputs, strict=True):
        torch.testing.assert_close(x, real, **tolerance)
    zero_inputs, zero_logits = replay(rep, nodes=False)
    incoming = graph.rows.double().sum(1)  # feature rows, then logit rows
    bias = torch.stack([rep.transcoders.pre_activations(l, zero_inputs[l][p])[f]
                        for l, p, f in graph.features.tolist()])
    torch.testing.assert_close(incoming[:graph.n_features], (graph.pre_activations - bias).double(), **tolerance)
    last = zero_logits[-1]
    logit_bias = last[graph.logit_tokens] - last.mean()
    torch.testing.assert_close(incoming[-graph.n_logits:], (graph.logit_values - logit_bias).double(), **tolerance)
    assert graph.metadata["replacement_logit_error"] < tolerance["atol"] * 10
    assert graph.n_features > 20 and graph.rows[:graph.n_features].abs().sum() > 0
    return graph
