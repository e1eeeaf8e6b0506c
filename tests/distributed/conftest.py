"""Fixtures of the distributed tests: one local Ray cluster per session (2 CPUs, as `ray.init(num_cpus=2)` starts
here in a few seconds), and a tiny random Llama saved as safetensors, so that workers can load it by path."""

from pathlib import Path

import pytest
from distributed_helpers import RAY_REASON

import resid


@pytest.fixture(scope="session")
def ray_cluster():
    ray = pytest.importorskip("ray", reason=RAY_REASON)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def saved_llama(tmp_path_factory: pytest.TempPathFactory) -> resid.Transformer:
    """resid.load of a tiny random Llama (2 layers, 4 heads) saved with save_pretrained(safe_serialization=True)."""
    from tiny_models import build

    folder = Path(tmp_path_factory.mktemp("distributed_llama"))
    build("llama", folder)
    return resid.load(folder)
