"""One value for how a job runs: every long job takes `execution: Execution | None = None` and none of the
settings it holds as its own argument; a wrong value, or a setting a job cannot honour, is one clear error."""

import inspect

import pytest
from random_models import make_random_model

from resid.analyses import Execution, ablation, features, graphs, neurons, patching
from resid.analyses.features import examples
from resid.analyses.neurons import scan
from resid.analyses.sweeps import means
from resid.errors import ResidError

JOBS = [ablation.sweep, patching.activation, patching.atp, patching.path, neurons.top_activating,
        features.top_activating, graphs.attribute, scan.scan, scan.scan_with, means.reference_means]
SETTINGS = ("executor", "workers", "batch_size", "progress", "out")


@pytest.mark.parametrize("job", JOBS, ids=lambda job: f"{job.__module__}.{job.__name__}")
def test_every_long_job_takes_one_execution(job):
    parameters = inspect.signature(job).parameters
    assert not set(SETTINGS) & set(parameters), f"{job.__name__} still takes {set(SETTINGS) & set(parameters)}"
    assert parameters["execution"].default is None
    assert parameters["execution"].annotation == Execution | None
    assert list(parameters)[-1] == "execution"
    assert examples.top_activating is features.top_activating


def test_what_a_job_cannot_honour_is_refused(gpt2_tokenizer):
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    with pytest.raises(ResidError, match="Execution\\(batch_size=0\\)"):
        Execution(batch_size=0)
    with pytest.raises(ResidError, match="computes a reduction, not table rows: it takes no out= file"):
        neurons.top_activating(model, ["a b c d"], layers=[0], execution=Execution(out="top.parquet"))
    with pytest.raises(ResidError, match="An attribution graph is one object.*not table rows.*drop out"):
        graphs.attribute(model, "a b c", [], execution=Execution(out="graph.parquet"))


def test_checkpoints_and_the_training_device_live_in_the_execution(gpt2_tokenizer):
    """checkpoint_every and device have one home, Execution, with one default (every 4% of a run's steps, at most
    100 apart: a tuned lens's 250 steps every 10, as before); a job of chunks refuses them; the training functions'
    own arguments of before still work for one release, and may not be given twice."""
    from resid.analyses import training, tuned_lens

    assert [Execution().checkpoint_steps(steps) for steps in (3, 250, 2000, 100_000)] == [1, 10, 80, 100]
    assert Execution(checkpoint_every=7).checkpoint_steps(250) == 7
    with pytest.raises(ResidError, match=r"Execution\(checkpoint_every=0\): a positive number of steps"):
        Execution(checkpoint_every=0)
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    with pytest.raises(ResidError, match=r"This job \(sites\) has no steps and no state to train: .*drop them"):
        ablation.sweep(model, ["a b c d"], [3], sites="sublayer", execution=Execution(checkpoint_every=5))
    with pytest.raises(ResidError, match=r"train was given checkpoint_every= and an Execution with checkpoint_every"):
        training.train(model, ["a b c d"], ["layers[0].resid_post"], execution=Execution(checkpoint_every=2),
                       checkpoint_every=3)
    with pytest.raises(ResidError, match=r"A tuned lens trains where the model runs \(cpu\): drop Execution\(device="):
        tuned_lens.train(model, ["a b c d"], execution=Execution(device="cpu"))
    for train in (training.train, training.train_crosslayer, tuned_lens.train):
        parameters = inspect.signature(train).parameters
        assert parameters["checkpoint_every"].default is None  # the deprecated argument: not given
        assert parameters.get("device", parameters["checkpoint_every"]).default is None
