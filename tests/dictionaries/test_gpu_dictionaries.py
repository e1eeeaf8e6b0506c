"""Dictionaries on a GPU (`cuda` tests: skipped without a GPU; conftest's `gpu` fixture): observed, spliced and
attributed as on the CPU."""

import torch
from random_dictionaries import standard_set

from resid.analyses.features.by_dictionary import by_dictionary
from resid.dictionaries import Splice

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
