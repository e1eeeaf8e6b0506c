"""Training asks the host for values a constant number of times per step and per forward batch, however many
dictionaries, layers or points it trains (tests/host_syncs.py counts them on the CPU; on a GPU each is a wait for
every queued kernel): a step of several per-layer dictionaries, a cross-layer transcoder's step, the activation
feed's forward batch. The feed also reads every layer's residuals from one running sum (additions linear in the
layers), each point as resid.dictionaries.hooks.read gives it."""

import pytest
import torch
from host_syncs import HostSyncs
from numerics import TINY
from random_models import make_random_model
from torch.overrides import TorchFunctionMode

import resid
from resid.analyses.training.activations import Activations, capture_for, read_points
from resid.analyses.training.crosslayer import CrossLayerCoder
from resid.analyses.training.loop import Spec
from resid.analyses.training.recipe import Recipe
from resid.analyses.training.trainer import Trainer, step_together
from resid.dictionaries.hooks import point_of, read
from resid.sites import Site

ROWS, D = 64, 16
RECIPES = {
    "topk": Recipe(activation="topk", k=4, d_sae=32, steps=8, batch_size=ROWS, warmup_steps=1, dead_tokens=ROWS),
    "batchtopk": Recipe(activation="batchtopk", k=4, d_sae=32, steps=8, batch_size=ROWS, warmup_steps=1,
                        dead_tokens=ROWS, threshold_start_step=0, clip=1.0),
    "relu": Recipe(activation="relu", d_sae=32, steps=8, batch_size=ROWS, warmup_steps=1),
    "jumprelu": Recipe(activation="jumprelu", d_sae=32, steps=8, batch_size=ROWS, warmup_steps=1,
                       normalize="expected_average_only_in"),
}


def _batch(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _step_syncs(trainers: list[Trainer], steps: int = 3) -> HostSyncs:
    """The syncs of the last of `steps` steps of `trainers` together (the first initialises b_dec; with
    dead_tokens=ROWS, features that did not fire in a step are dead in the next, so AuxK takes part)."""
    for step in range(steps):
        batches = [(_batch(100 * step + i, ROWS, D), _batch(100 * step + i + 50, ROWS, D))
                   for i in range(len(trainers))]
        if step == steps - 1:
            with HostSyncs() as syncs:
                step_together(trainers, batches)
            return syncs
        step_together(trainers, batches)


@pytest.mark.parametrize("activation", RECIPES)
def test_a_step_of_many_dictionaries_asks_the_host_as_often_as_one(activation: str) -> None:
    recipe = RECIPES[activation]
    one = _step_syncs([Trainer.new(recipe, D, D, transcoder=True)])
    many = _step_syncs([Trainer.new(recipe, D, D, transcoder=True) for _ in range(6)])
    assert many.count == one.count, f"one dictionary: {one.where()}; six: {many.where()}"
    assert one.count <= 2, one.where()  # whether any feature may be dead (AuxK recipes), and the finite check


@pytest.mark.parametrize("activation", ["batchtopk", "jumprelu"])
def test_a_crosslayer_step_asks_the_host_as_often_for_many_layers_as_for_few(activation: str) -> None:
    recipe = RECIPES[activation]
    counts = {}
    for layers in (2, 6):
        trainer = Trainer(CrossLayerCoder(layers, D, D, recipe))
        for step in range(3):
            x, y = _batch(step, ROWS, layers, D), _batch(step + 50, ROWS, layers, D)
            with HostSyncs() as syncs:
                trainer.step(x, y)
        counts[layers] = syncs
    assert counts[6].count == counts[2].count, f"2 layers: {counts[2].where()}; 6 layers: {counts[6].where()}"
    assert counts[2].count <= 1, counts[2].where()  # the finite check


@pytest.fixture(scope="module")
def deep_model(bos_model) -> resid.Transformer:
    return make_random_model("llama_gqa", bos_model.tokenizer, n_layers=8)


def _points(model, layers: range) -> list:
    return [p for layer in layers for p in Spec.transcoder(model, layer).points(model)]


def test_the_activation_feed_asks_the_host_once_per_forward_batch_however_many_points(deep_model, texts) -> None:
    counts = {}
    for layers in (range(1), range(8)):
        source = Activations(deep_model, texts, _points(deep_model, layers), batch_size=32, window=24,
                             forward_batch=4, buffer_tokens=200)
        with HostSyncs() as syncs:
            source.block(0)
        counts[len(layers)] = syncs
    assert counts[8].count == counts[1].count, f"1 layer: {counts[1].where()}; 8 layers: {counts[8].where()}"


class _Additions(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += getattr(func, "__name__", "") in ("add", "__add__", "__radd__", "__iadd__", "add_")
        return func(*args, **(kwargs or {}))


def test_every_layers_points_are_read_from_one_running_sum(deep_model) -> None:
    ids = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(0))
    run = deep_model.run(ids, capture=capture_for(_points(deep_model, range(8))))
    additions = {}
    for n in (2, 4, 8):
        with _Additions() as added:
            dict(read_points(run, deep_model, _points(deep_model, range(n))))
        additions[n] = added.count
    # linear in the layers: layers 4-7 cost twice layers 2-3 (summed from the embeddings per read: 4x)
    assert additions[8] - additions[4] <= 2 * (additions[4] - additions[2]), additions


def test_the_points_read_from_the_running_sum_are_hooks_read_in_any_order(deep_model) -> None:
    points = [*_points(deep_model, [5, 1, 7]), *[p for layer in (6, 0, 3) for p in
                                                 [Site(layer, "resid_post"), Site(layer, "resid_pre")]]]
    points = [p if not isinstance(p, Site) else point_of(p, deep_model.config) for p in points]
    ids = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(1))
    run = deep_model.run(ids, capture=capture_for(points))
    found = dict(read_points(run, deep_model, points))
    assert set(found) == set(points)
    for point in points:
        torch.testing.assert_close(found[point], read(run, deep_model, point), **TINY)
