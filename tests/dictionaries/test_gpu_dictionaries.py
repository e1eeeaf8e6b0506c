"""Dictionaries on a GPU (`cuda` tests: skipped without a GPU; conftest's `gpu` fixture): observed, spliced,
attributed, loaded and ablated as on the CPU."""

import torch
from random_dictionaries import random_dictionary, standard_set
from random_models import make_random_model

import resid
from resid.analyses import ablation
from resid.analyses.features.by_dictionary import by_dictionary
from resid.dictionaries import Splice
from resid.dictionaries.formats import saelens

IDS = torch.tensor([[11, 5, 7, 2, 9, 31, 3], [4, 8, 15, 16, 23, 42, 6]])
CLOSE = dict(atol=1e-4, rtol=1e-4)


def test_dictionaries_on_the_gpu_give_the_cpus_activations_and_attributions(random_model, gpu) -> None:
    def measured(model, dictionaries):
        observed = model.run(IDS, dictionaries=dictionaries)
        spliced = model.run(IDS, dictionaries=[Splice(d) for d in dictionaries])
        acts = {name: encoded.acts.cpu() for name, encoded in observed.dictionaries.items()}
        rows = by_dictionary(model, IDS, dictionaries)
        return acts, spliced.logits.cpu(), rows

    dictionaries = standard_set(random_model)
    cpu_acts, cpu_logits, cpu_rows = measured(random_model, dictionaries)
    gpu_acts, gpu_logits, gpu_rows = measured(random_model.to(gpu), [d.to(gpu) for d in dictionaries])
    assert gpu_acts.keys() == cpu_acts.keys()
    for name in cpu_acts:
        torch.testing.assert_close(gpu_acts[name], cpu_acts[name], **CLOSE)
    torch.testing.assert_close(gpu_logits, cpu_logits, **CLOSE)
    assert len(gpu_rows) == len(cpu_rows) > 0
    torch.testing.assert_close(torch.tensor(gpu_rows["value"].to_numpy(dtype=float)),
                               torch.tensor(cpu_rows["value"].to_numpy(dtype=float)), **CLOSE)


def test_load_puts_a_dictionary_on_the_models_gpu(tmp_path, gpu) -> None:
    model = make_random_model("llama_gqa")
    sae = random_dictionary(model, "blocks.1.hook_resid_post", seed=1, name="r1")
    saelens.write(sae, tmp_path / "r1")
    loaded = resid.dictionaries.load(tmp_path / "r1", model.to(gpu))
    assert loaded.W_enc.device == model.device
    model.run(IDS, dictionaries=[loaded])  # runs where the model runs


def test_a_sweep_on_the_gpu_takes_the_cpus_dictionaries_for_its_feature_sites(gpu) -> None:
    """Jobs move the dictionaries they carry to the worker's device (a Ray GPU worker gets the driver's CPU ones)."""
    model = make_random_model("llama_gqa")
    sae = random_dictionary(model, "blocks.1.hook_resid_post", seed=1, name="r1")
    sites = [resid.Site(1, "resid_post", feature=f) for f in range(4)]
    on_cpu = ablation.sweep(model, IDS, 3, sites=sites, dictionaries=[sae])
    on_gpu = ablation.sweep(model.to(gpu), IDS, 3, sites=sites, dictionaries=[sae])
    assert sae.W_enc.device.type == "cpu"  # the caller's dictionary stays where it was
    torch.testing.assert_close(torch.tensor(on_gpu.ablated_metric.to_numpy()),
                               torch.tensor(on_cpu.ablated_metric.to_numpy()), **CLOSE)
