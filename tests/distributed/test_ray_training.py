"""Training and evaluation on a local Ray cluster give the in-process results: the activation blocks of a dictionary
training made by 2 workers (out of order) and fed in order to the one trainer end with the in-process weights; a
tuned lens whose forward passes run on the workers ends with the in-process translators; the three evaluations
(dictionaries, lenses, replacements with their graph scores), reduced in chunk order, give the in-process tables."""

import pandas as pd
import pytest
import random_transcoders
import torch
from distributed_helpers import RAY_REASON, TEST_CPUS, TEXTS
from numerics import TINY

from resid.analyses import tuned_lens
from resid.analyses.distributed import RayExecutor
from resid.analyses.distributed.execution import Execution
from resid.analyses.training.evaluation import evaluate
from resid.analyses.training.loop import Spec, train
from resid.analyses.training.recipe import Recipe
from resid.analyses.training.replacements import evaluate_replacements
from resid.sites import Site

ray = pytest.importorskip("ray", reason=RAY_REASON)

# ~6 blocks of one batch each: the 2 workers make blocks out of order, the trainer takes them in order
RECIPE = Recipe(activation="batchtopk", k=4, d_sae=32, steps=6, batch_size=32, warmup_steps=1, threshold_start_step=2)
OPTIONS = dict(window=16, buffer_tokens=40)


@pytest.fixture(scope="module")
def executor(ray_cluster):
    with RayExecutor(workers=2, cpus=TEST_CPUS) as shared:
        yield shared


@pytest.fixture
def one_thread():
    """Each Ray worker computes on one thread: the driver too, so that both sum alike."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _specs():
    return [Spec(Site(0, "resid_post")), Spec("blocks.1.ln2.hook_normalized", Site(1, "mlp"))]


def test_blocks_made_on_two_workers_train_the_in_process_weights(saved_llama, executor, one_thread, tmp_path):
    steps: list[int] = []
    here = train(saved_llama, TEXTS, _specs(), RECIPE, Execution(progress=False), **OPTIONS)
    there = train(saved_llama, TEXTS, _specs(), RECIPE, Execution(executor=executor, out=tmp_path, progress=False),
                  on_step=lambda step, stats: steps.append(step), **OPTIONS)
    assert steps == list(range(1, RECIPE.steps + 1))
    for a, b in zip(here, there):
        assert a.name == b.name
        for name, value in a.state_dict().items():
            assert torch.equal(value, b.state_dict()[name]), name
    assert (tmp_path / "checkpoint.safetensors").is_file() and (tmp_path / "blocks.0.hook_resid_post").is_dir()


def test_a_lens_trained_with_its_forward_passes_on_workers_is_the_in_process_lens(saved_llama, executor, one_thread):
    windows = torch.randint(0, saved_llama.config.d_vocab, (8, 6), generator=torch.Generator().manual_seed(0))
    recipe = tuned_lens.Recipe(steps=3, tokens_per_step=12, seq_len=6, precision="float32")
    here = tuned_lens.train(saved_llama, windows, recipe, Execution(batch_size=1, progress=False))
    there = tuned_lens.train(saved_llama, windows, recipe, Execution(executor=executor, batch_size=1, progress=False))
    torch.testing.assert_close(there.translators.weight, here.translators.weight, rtol=0, atol=1e-7)
    assert there.translators.info["losses"] == pytest.approx(here.translators.info["losses"], abs=1e-7)


def test_both_evaluations_on_workers_give_the_in_process_tables(saved_llama, executor):
    sae = train(saved_llama, TEXTS, [Site(1, "resid_post")], RECIPE, Execution(progress=False), **OPTIONS)[0]
    options = dict(max_windows=12, window=16)
    here = evaluate(saved_llama, [sae], TEXTS, **options, execution=Execution(batch_size=2, progress=False))
    there = evaluate(saved_llama, [sae], TEXTS, **options,
                     execution=Execution(executor=executor, batch_size=2, progress=False))
    pd.testing.assert_frame_equal(there, here, check_exact=False, **TINY)
    lens = tuned_lens.zeros(saved_llama)
    windows = torch.randint(0, saved_llama.config.d_vocab, (5, 7), generator=torch.Generator().manual_seed(1))
    here = tuned_lens.evaluate(saved_llama, windows, [lens], execution=Execution(batch_size=2, progress=False))
    there = tuned_lens.evaluate(saved_llama, windows, [lens],
                                execution=Execution(executor=executor, batch_size=2, progress=False))
    pd.testing.assert_frame_equal(there, here, check_exact=False, **TINY)


def test_replacements_scored_on_workers_give_the_in_process_table(saved_llama, executor, one_thread):
    replacements = {"per-layer": random_transcoders.per_layer(saved_llama, d_sae=16),
                    "clt": random_transcoders.cross_layer(saved_llama, d_sae=16)}
    options = dict(prompts=["the nation budget", "people peace economy world"], max_windows=6, window=16)
    here = evaluate_replacements(saved_llama, replacements, TEXTS, **options,
                                 execution=Execution(batch_size=2, progress=False))
    there = evaluate_replacements(saved_llama, replacements, TEXTS, **options,
                                  execution=Execution(executor=executor, batch_size=2, progress=False))
    assert here.table["replacement_score"].notna().all()
    pd.testing.assert_frame_equal(there.table, here.table, check_exact=False, **TINY)
    pd.testing.assert_frame_equal(there.per_layer, here.per_layer, check_exact=False, **TINY)
