"""Dictionaries in a run ask the host for no value per dictionary: a forward with 6 dictionaries makes as many host
synchronisations as one with 2 (observe and splice, SAEs, transcoders, skip transcoders, CLTs, every storage), and
so does attributing their features (by_dictionary). On a GPU each synchronisation waits for every queued kernel."""

import pytest
import torch
from host_syncs import HostSyncs
from random_dictionaries import random_dictionary
from random_models import make_random_model
from random_transcoders import cross_layer

from resid.analyses.features.by_dictionary import by_dictionary
from resid.dictionaries import Observe, Splice

N_LAYERS = 6


@pytest.fixture(scope="module")
def model():
    return make_random_model("llama_gqa", n_layers=N_LAYERS)


def _ids(model) -> torch.Tensor:
    return torch.randint(0, model.config.d_vocab, (2, 7), generator=torch.Generator().manual_seed(0))


def _saes(model) -> list:
    return [random_dictionary(model, f"blocks.{layer}.hook_resid_post", seed=layer, name=f"r{layer}")
            for layer in range(N_LAYERS)]


def _transcoders(model, skip: bool) -> list:
    return [random_dictionary(model, f"blocks.{layer}.ln2.hook_normalized", f"blocks.{layer}.hook_mlp_out",
                              skip=skip, seed=layer, name=f"t{layer}") for layer in range(N_LAYERS)]


def _count(fn) -> HostSyncs:
    fn()  # anything done once per process (first calls, caches) stays out of the count
    with HostSyncs() as syncs:
        fn()
    return syncs


def _assert_constant(model, make) -> None:
    ids = _ids(model)
    few, many = (_count(lambda n=n: model.run(ids, dictionaries=make()[:n])) for n in (2, N_LAYERS))
    assert many.count == few.count, f"2 dictionaries: {few.where()}; {N_LAYERS}: {many.where()}"


@pytest.mark.parametrize("storage", ["auto", "sparse", "dense"])
def test_observing_saes_asks_the_host_nothing_per_dictionary(model, storage: str) -> None:
    _assert_constant(model, lambda: [Observe(d, storage=storage) for d in _saes(model)])


@pytest.mark.parametrize("error", [True, False])
def test_splicing_saes_asks_the_host_nothing_per_dictionary(model, error: bool) -> None:
    _assert_constant(model, lambda: [Splice(d, error=error) for d in _saes(model)])


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("mode", ["observe", "splice"])
def test_transcoders_ask_the_host_nothing_per_dictionary(model, mode: str, skip: bool) -> None:
    """Transcoders reading the MLP's standardized input: a splice also checks, for all at once, that the norm
    gains can be undone."""
    _assert_constant(model, lambda: [d if mode == "observe" else Splice(d) for d in _transcoders(model, skip)])


@pytest.mark.parametrize("mode", ["observe", "splice"])
def test_cross_layer_transcoders_ask_the_host_nothing_per_layer(mode: str) -> None:
    """A CLT over 2 layers and one over 6 make as many synchronisations."""
    counts = []
    for n_layers in (2, N_LAYERS):
        small = make_random_model("llama_gqa", n_layers=n_layers)
        clt = cross_layer(small)
        counts.append(_count(lambda small=small, clt=clt: small.run(
            _ids(small), dictionaries=[clt if mode == "observe" else Splice(clt)])))
    assert counts[1].count == counts[0].count, f"2 layers: {counts[0].where()}; {N_LAYERS}: {counts[1].where()}"


def test_attributing_features_asks_the_host_nothing_per_dictionary(model) -> None:
    ids = _ids(model)
    saes = _saes(model)
    few, many = (_count(lambda n=n: by_dictionary(model, ids, saes[:n])) for n in (2, N_LAYERS))
    assert many.count == few.count, f"2 dictionaries: {few.where()}; {N_LAYERS}: {many.where()}"


def test_a_batch_reads_the_host_once_for_its_dictionaries(model) -> None:
    """What a run with dictionaries adds to a plain run: one reading of every dictionary's count of non-zero
    activations (for sparse storage), and nothing when every record is dense."""
    ids = _ids(model)
    plain = _count(lambda: model.run(ids)).count
    assert _count(lambda: model.run(ids, dictionaries=_saes(model))).count == plain + 1
    dense = [Observe(d, storage="dense") for d in _saes(model)]
    assert _count(lambda: model.run(ids, dictionaries=dense)).count == plain
