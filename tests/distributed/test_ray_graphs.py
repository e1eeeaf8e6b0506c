"""An attribution graph whose backward sweeps run on 2 Ray workers (each runs the replacement on its own model once,
then sweeps the driver's batches) is the in-process graph: per-layer transcoders and a cross-layer transcoder,
every feature and a max_feature_nodes budget visited in rounds (each round one map; the workers keep their state
between rounds). Small batches, so that each graph is many chunks spread over both workers."""

import pytest
import torch
from distributed_helpers import RAY_REASON, TEST_CPUS
from random_transcoders import cross_layer, per_layer

from resid.analyses import Execution, graphs
from resid.analyses.distributed import RayExecutor

ray = pytest.importorskip("ray", reason=RAY_REASON)

IDS = [11, 5, 7, 2, 9, 31, 3, 17]


@pytest.fixture(scope="module")
def executor(ray_cluster):
    with RayExecutor(workers=2, cpus=TEST_CPUS) as shared:
        yield shared


def assert_same_graph(got: graphs.Graph, expected: graphs.Graph) -> None:
    """The same nodes exactly, the same edges to float32 rounding (a sum over thousands of products, in another
    order where a worker's BLAS threads differ: 1e-5 of the largest edge is ten times that noise here)."""
    assert torch.equal(got.features, expected.features) and torch.equal(got.logit_tokens, expected.logit_tokens)
    assert torch.equal(got.active_features, expected.active_features)
    assert got.rows.shape == expected.rows.shape
    scale = float(expected.rows.abs().max())
    torch.testing.assert_close(got.rows, expected.rows, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("kind", ["per_layer", "clt"])
@pytest.mark.parametrize("max_feature_nodes", [None, 12])
def test_a_graph_on_two_workers_is_the_in_process_graph(saved_llama, executor, kind, max_feature_nodes):
    model = saved_llama
    transcoders = per_layer(model) if kind == "per_layer" else cross_layer(model)
    options = dict(max_feature_nodes=max_feature_nodes, update_interval=1)
    expected = graphs.attribute(model, IDS, transcoders, **options, execution=Execution(batch_size=4))
    got = graphs.attribute(model, IDS, transcoders, **options,
                           execution=Execution(executor=executor, batch_size=4, progress=False))
    assert expected.n_features == (12 if max_feature_nodes else len(expected.active_features)) > 8  # several chunks
    assert_same_graph(got, expected)


def test_a_head_split_on_two_workers_is_the_in_process_split(saved_llama, executor):
    """split_heads's sweeps are a driver job too: on workers (each runs the prompt again with the transcoders once)
    the parts are the in-process ones."""
    model = saved_llama
    transcoders = per_layer(model)
    pruned = graphs.attribute(model, IDS, transcoders).pruned(0.8, 0.98)
    expected = graphs.split_heads(model, pruned, transcoders, execution=Execution(batch_size=2))
    got = graphs.split_heads(model, pruned, transcoders,
                             execution=Execution(executor=executor, batch_size=2, progress=False))
    assert len(expected.targets.unique()) > 4  # several chunks, on both workers
    assert torch.equal(got.sources, expected.sources) and torch.equal(got.targets, expected.targets)
    scale = float(expected.parts.abs().max())
    torch.testing.assert_close(got.parts, expected.parts, rtol=1e-5, atol=1e-5 * scale)
