"""The analyses on a GPU give the CPU's rows (`cuda` tests: skipped without a GPU; conftest's `gpu` fixture):
head attribution, exact head patching and attribution patching, on every random family."""

import torch

from resid.analyses import attribution, patching

CLEAN = ["When Mary and John went to the store, John gave a drink to",
         "When Alice and Bob went to the park, Bob gave a book to"]
CORRUPT = ["When Mary and John went to the store, Mary gave a drink to",
           "When Alice and Bob went to the park, Alice gave a book to"]
TARGETS, BASELINES = [" Mary", " Alice"], [" John", " Bob"]
CLOSE = dict(atol=1e-3, rtol=1e-3)  # float32 on either device: reduction order differs


def _column(df, name: str) -> torch.Tensor:
    return torch.tensor(df[name].to_numpy(dtype=float))


def test_head_analyses_on_the_gpu_give_the_rows_of_the_cpu(random_model, gpu) -> None:
    def analyses(model):
        return (attribution.direct(model, CLEAN, TARGETS, BASELINES, level="head"),
                patching.activation(model, CLEAN, CORRUPT, TARGETS, BASELINES, sites="head"),
                patching.atp(model, CLEAN, CORRUPT, TARGETS, BASELINES, sites="head"))

    on_cpu = analyses(random_model)
    on_gpu = analyses(random_model.to(gpu))
    for cpu_df, gpu_df, value in zip(on_cpu, on_gpu, ("value", "patched_metric", "patched_metric")):
        assert list(gpu_df.columns) == list(cpu_df.columns) and len(gpu_df) == len(cpu_df) > 0
        assert gpu_df["site"].tolist() == cpu_df["site"].tolist()
        torch.testing.assert_close(_column(gpu_df, value), _column(cpu_df, value), **CLOSE)
