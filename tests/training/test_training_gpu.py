"""Training on a GPU (`cuda` test: skipped without a GPU; conftest's `gpu` fixture): every random draw is made on
the CPU, so a run on the GPU sees the CPU run's batches and ends with its weights, to float32 rounding."""

import copy

import torch

from resid.analyses.distributed.execution import Execution
from resid.analyses.training.loop import Spec, train
from resid.analyses.training.recipe import Recipe
from resid.sites import Site

OPTIONS = dict(window=24, buffer_tokens=100)


def _run(model, texts, specs, recipe) -> tuple[list, list]:
    stats: list = []
    dictionaries = train(model, texts, specs, recipe, Execution(batch_size=4, progress=False),
                         on_step=lambda step, s: stats.append(s), **OPTIONS)
    return dictionaries, stats


def test_a_run_on_the_gpu_ends_with_the_cpus_weights(bos_model, texts, gpu) -> None:
    specs = [Spec(Site(0, "resid_post")), Spec.transcoder(bos_model, 2)]
    recipe = Recipe(activation="relu", d_sae=64, steps=6, batch_size=96, warmup_steps=1,
                    normalize="expected_average_only_in")
    on_cpu, cpu_stats = _run(bos_model, texts, specs, recipe)
    on_gpu, gpu_stats = _run(copy.deepcopy(bos_model).to(gpu), texts, specs, recipe)
    assert len(gpu_stats) == len(cpu_stats) == recipe.steps
    for cpu_step, gpu_step in zip(cpu_stats, gpu_stats):  # the same batches through the same weights
        for cpu_s, gpu_s in zip(cpu_step, gpu_step):
            torch.testing.assert_close(torch.stack([gpu_s.loss, gpu_s.l0, gpu_s.fvu]).cpu(),
                                       torch.stack([cpu_s.loss, cpu_s.l0, cpu_s.fvu]), atol=1e-4, rtol=1e-3)
    for cpu_dict, gpu_dict in zip(on_cpu, on_gpu):
        assert gpu_dict.W_dec.device.type == gpu.type  # returned where the model runs
        cpu_state, gpu_state = cpu_dict.state_dict(), gpu_dict.state_dict()
        assert cpu_state.keys() == gpu_state.keys()
        for name, value in cpu_state.items():
            # by norm: Adam's first steps move an entry by +-lr whatever its gradient, so an entry whose gradient
            # is float noise may step the other way on the other device
            gap = (gpu_state[name].cpu().double() - value.double()).norm() / value.double().norm().clamp_min(1e-12)
            assert gap < 1e-3, (name, float(gap))
