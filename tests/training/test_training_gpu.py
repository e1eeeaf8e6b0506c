"""Training on a GPU (`cuda` test: skipped without a GPU; conftest's `gpu` fixture): every random draw is made on
the CPU, so a run on the GPU ends with the CPU run's weights, to float32 rounding."""

import copy

import torch

from resid.analyses.training.loop import Spec, train
from resid.analyses.training.recipe import Recipe

OPTIONS = dict(window=24, buffer_tokens=100, forward_batch=4, progress=False)


def test_a_run_on_the_gpu_ends_with_the_cpus_weights(bos_model, texts, gpu) -> None:
    specs = [Spec("blocks.0.hook_resid_post"), Spec.transcoder(bos_model, 2)]
    recipe = Recipe(activation="relu", d_sae=64, steps=4, batch_size=96, warmup_steps=1,
                    normalize="expected_average_only_in")
    on_cpu = train(bos_model, texts, specs, recipe, **OPTIONS)
    on_gpu = train(copy.deepcopy(bos_model).to(gpu), texts, specs, recipe, **OPTIONS)
    for cpu_dict, gpu_dict in zip(on_cpu, on_gpu):
        assert gpu_dict.W_dec.device.type == gpu.type
        cpu_state, gpu_state = cpu_dict.state_dict(), gpu_dict.state_dict()
        assert cpu_state.keys() == gpu_state.keys()
        for name, value in cpu_state.items():
            torch.testing.assert_close(gpu_state[name].cpu(), value, atol=1e-4, rtol=1e-3, msg=name)
