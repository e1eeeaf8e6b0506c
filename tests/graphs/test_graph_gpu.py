"""Attribution graphs on a GPU (`cuda` test: skipped without a GPU; conftest's `gpu` fixture): the CPU's graph."""

import torch
from random_transcoders import per_layer

from resid.analyses import graphs

IDS = torch.tensor([11, 5, 7, 2, 9, 31, 3])


def test_a_graph_on_the_gpu_is_the_cpus(random_model, gpu) -> None:
    transcoders = per_layer(random_model)
    on_cpu = graphs.attribute(random_model, IDS, transcoders)
    on_gpu = graphs.attribute(random_model.to(gpu), IDS, [t.to(gpu) for t in transcoders])
    assert torch.equal(on_gpu.features.cpu(), on_cpu.features)
    assert torch.equal(on_gpu.logit_tokens.cpu(), on_cpu.logit_tokens)
    torch.testing.assert_close(on_gpu.rows.cpu(), on_cpu.rows, atol=1e-4, rtol=1e-3)
