"""Shared fixtures: the real SmolLM2 (loaded once), the reference data committed under tests/data, and small
random models built directly from a ModelConfig (no transformers needed)."""

import json
import os
from pathlib import Path

import pytest
import tokenizers
import torch
from random_models import RANDOM_CONFIGS, make_random_model
from tiny_fixtures import Tiny, build_tiny
from tiny_models import FAMILIES, VARIANTS

import resid

DATA = Path(__file__).resolve().parent / "data"

# Tests never reach the network: a Hub id must fail fast and clearly.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# `make test` runs the suite in one pytest-xdist worker per core: each takes its share of the cores' threads, so
# that two workers on two cores do not fight over four.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    torch.set_num_threads(max(1, torch.get_num_threads() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test of the real SmolLM2 is `slow` (`make test` skips them; `make test-slow` runs them). Tests
    that reach it another way (the command line's default model, the notebook) say so themselves. Every test of
    the `gpu` fixture is `cuda` (`pytest -m cuda` runs them alone)."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "smollm2" in fixtures:
            item.add_marker(pytest.mark.slow)
        if "gpu" in fixtures:
            item.add_marker(pytest.mark.cuda)
        if _family_beyond_the_fast_tests(item):
            item.add_marker(pytest.mark.slow)


# The model types of issue 58 (tiny_models.FAMILIES), and the Llamas that differ from `llama` only in their rotary's
# scaling, run these through `make test`: parity with transformers, the exactness invariants and the config
# allow-list; every other test of the `tiny` fixture runs them under `make test-slow` (the suite would double
# otherwise).
FAST_FOR_FAMILIES = frozenset({"test_parity_hf.py", "test_exactness.py", "test_config_fields.py", "test_moe.py"})
ROTARY_SCALING_ONLY = frozenset({"llama3_scaled", "llama_linear", "llama_dynamic"})


def _family_beyond_the_fast_tests(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    variant = callspec.params.get("tiny") if callspec is not None else None
    return (variant in FAMILIES or variant in ROTARY_SCALING_ONLY) and item.path.name not in FAST_FOR_FAMILIES


@pytest.fixture
def gpu() -> torch.device:
    """The GPU that the `cuda` tests compare with the CPU; they are skipped without one. RESID_TEST_DEVICE names
    another device instead: RESID_TEST_DEVICE=cpu runs those tests on the CPU against itself, which checks the
    tests (not the GPU) on a machine without one."""
    name = os.environ.get("RESID_TEST_DEVICE", "cuda")
    if name == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch.device(name)


@pytest.fixture
def one_thread():
    """Small matmuls run fastest on one thread (and do not fight the other tests for the cores); the training tests
    take it for every test (tests/training/conftest.py), the GPU benchmark's tests too."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def smollm2() -> resid.Transformer:
    return resid.load("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_reference() -> dict:
    path = DATA / "smollm2-135m" / "reference_outputs.json"
    assert path.exists(), f"{path} is missing; regenerate it with tests/data/make_smollm2_reference.py"
    return json.loads(path.read_text())


@pytest.fixture(scope="session")
def gpt2_tokenizer() -> resid.Tokenizer:
    raw = tokenizers.Tokenizer.from_file(str(DATA / "gpt2-tokenizer" / "tokenizer.json"))
    return resid.Tokenizer(raw, bos_token_id=50256, prepend_bos=False, eos_token_id=50256)


@pytest.fixture(params=sorted(RANDOM_CONFIGS))
def random_model(request, gpt2_tokenizer) -> resid.Transformer:
    return make_random_model(request.param, gpt2_tokenizer)


@pytest.fixture(scope="session", params=VARIANTS)
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    """One tiny random model per variant (tests/tiny_models.py): the transformers model and resid.load of its
    saved folder, built once per session."""
    return build_tiny(request.param, tmp_path_factory)
