"""How RayExecutor lays workers out on a GPU cluster, simulated on this CPU machine: the cluster's resources are
what `ray.cluster_resources()` reports, so a stand-in reporting GPUs shows the layout a real GPU cluster gets
(one worker per GPU by default, each actor asking for one GPU), and the clear errors when GPUs are short."""

from types import SimpleNamespace

import pytest
from distributed_helpers import RAY_REASON

from resid.analyses.distributed import RayExecutor
from resid.errors import ResidError

pytest.importorskip("ray", reason=RAY_REASON)


def _cluster(executor: RayExecutor, cpus: float, gpus: int) -> RayExecutor:
    executor.ray = SimpleNamespace(is_initialized=lambda: True, exceptions=executor.ray.exceptions,
                                   cluster_resources=lambda: {"CPU": cpus, "GPU": gpus} if gpus else {"CPU": cpus})
    return executor


def test_one_worker_per_gpu_by_default():
    assert _cluster(RayExecutor(), cpus=64, gpus=16)._layout() == (16, True)
    assert _cluster(RayExecutor(workers=4), cpus=64, gpus=16)._layout() == (4, True)
    assert _cluster(RayExecutor(), cpus=8, gpus=0)._layout() == (8, False)  # CPU only: one per thread's CPU
    assert _cluster(RayExecutor(gpus=False), cpus=8, gpus=2)._layout() == (8, False)


def test_short_of_gpus_is_one_clear_error():
    with pytest.raises(ResidError, match="20 workers need 20 GPUs .* the Ray cluster has 16: use workers=16"):
        _cluster(RayExecutor(workers=20), cpus=64, gpus=16)._layout()
    with pytest.raises(ResidError, match="gpus=True, but the Ray cluster has no GPU"):
        _cluster(RayExecutor(gpus=True), cpus=8, gpus=0)._layout()
