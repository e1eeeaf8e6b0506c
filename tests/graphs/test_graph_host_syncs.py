"""Host synchronisations of an attribution graph's row sweep, counted on the CPU (tests/host_syncs.py): one batch of
target rows (one backward sweep) asks the host for a fixed number of values, whatever the number of targets in it,
whichever layers they start at, and however many layers the sweep walks down (per-layer transcoders and a cross-layer
transcoder, whose sources write into every later layer: the syncs of this package's own code, analyses/)."""

import pytest
import torch
from host_syncs import HostSyncs
from random_models import make_random_model
from random_transcoders import cross_layer, per_layer

from resid.analyses.graphs.attribute import logit_vectors
from resid.analyses.graphs.edges import Sweeper
from resid.analyses.graphs.replacement import replace
from resid.analyses.graphs.rows import Batch, sweep

IDS = [11, 5, 7, 2, 9, 31, 3, 8, 4]


def built(kind: str, n_layers: int):
    model = make_random_model("llama_gqa", n_layers=n_layers)
    transcoders = per_layer(model) if kind == "per_layer" else cross_layer(model)
    rep = replace(model, IDS, transcoders)
    return model, rep


def counted(rep, batch: Batch) -> HostSyncs:
    sweeper = Sweeper(rep)
    sweep(rep, sweeper, batch)  # the decoders' layouts are made on a sweeper's first sweep, once per graph
    with HostSyncs() as syncs, torch.no_grad():
        sweep(rep, sweeper, batch)
    return syncs


def same_count(few: HostSyncs, many: HostSyncs) -> None:
    assert many.count == few.count, f"few: {few.count} ({few.where()})\nmany: {many.count} ({many.where()})"


def features_at(rep, layers: list[int], limit: int) -> Batch:
    """Up to `limit` active features of each of `layers`."""
    found = [torch.nonzero(rep.features[:, 0] == l).flatten()[:limit] for l in layers]
    return Batch(features=torch.cat(found))


@pytest.mark.parametrize("kind", ["per_layer", "clt"])
def test_a_logit_batchs_syncs_do_not_grow_with_its_targets(kind) -> None:
    model, rep = built(kind, 3)
    one = Batch(logits=logit_vectors(model, torch.tensor([3])))
    several = Batch(logits=logit_vectors(model, torch.tensor([3, 8, 1, 40, 2])))
    same_count(counted(rep, one), counted(rep, several))


@pytest.mark.parametrize("kind", ["per_layer", "clt"])
def test_a_feature_batchs_syncs_do_not_grow_with_its_targets_or_their_layers(kind) -> None:
    _, rep = built(kind, 3)
    top = int(rep.features[:, 0].max())
    few = counted(rep, features_at(rep, [top], 1))
    same_count(few, counted(rep, features_at(rep, list(range(top + 1)), 6)))


@pytest.mark.parametrize("kind", ["per_layer", "clt"])
def test_a_batchs_syncs_do_not_grow_with_the_layers_it_sweeps(kind) -> None:
    found = []
    for n_layers in (2, 5):
        model, rep = built(kind, n_layers)
        found.append(counted(rep, Batch(logits=logit_vectors(model, torch.tensor([3, 8])))))
    # each layer's pattern is rebuilt (Transformer.attention_pattern) over one attention context, made once
    assert found[0].count == found[1].count, f"2 layers: {found[0].where()}\n5 layers: {found[1].where()}"
