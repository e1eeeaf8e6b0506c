"""Sweeps and corpus scans on a local Ray cluster give the in-process results: an ablation sweep the same rows
(values within 1e-6), a top-activating scan the same table for 1, 2 and 3 workers; a worker killed mid-sweep
loses nothing, and a sweep interrupted after some chunks resumes on Ray from its store."""

import numpy as np
import pandas as pd
import pytest
from distributed_helpers import BASELINES, DONORS, PROMPTS, RAY_REASON, REFERENCE, TARGETS, TEST_CPUS, TEXTS
from numerics import TINY

from resid.analyses import Execution, ablation, neurons
from resid.analyses.distributed import RayExecutor
from resid.analyses.io.store import ResultStore

ray = pytest.importorskip("ray", reason=RAY_REASON)

SWEEPS = {
    "zero-head": dict(sites="head", method="zero"),
    "mean-sublayer": dict(sites="sublayer", method="mean", reference=REFERENCE),
    "mean-per-position": dict(sites="layer", method="mean", reference=REFERENCE, mean_positions="per_position"),
    "resample-head": dict(sites="head", method="resample", reference=DONORS),
}


@pytest.fixture(scope="module")
def executor(ray_cluster):
    with RayExecutor(workers=2, cpus=TEST_CPUS, chunks_per_worker=4) as shared:  # 4+ chunks: room to interrupt
        yield shared


def _sweep(model, **options) -> pd.DataFrame:
    return ablation.sweep(model, PROMPTS, TARGETS, BASELINES, **options)


def _assert_same_rows(found: pd.DataFrame, expected: pd.DataFrame) -> None:
    assert found[["prompt_idx", "site"]].equals(expected[["prompt_idx", "site"]])  # each row once, same order
    pd.testing.assert_frame_equal(found, expected, check_exact=False, **TINY)


@pytest.mark.parametrize("kind", sorted(SWEEPS))
def test_sweep_on_ray_equals_in_process(saved_llama, executor, kind: str):
    expected = _sweep(saved_llama, **SWEEPS[kind])
    _assert_same_rows(_sweep(saved_llama, execution=Execution(executor=executor), **SWEEPS[kind]), expected)


# each pool costs seconds: 2 workers in make test, 1 and 3 in make test-slow
@pytest.mark.parametrize("workers", [pytest.param(1, marks=pytest.mark.slow), 2,
                                     pytest.param(3, marks=pytest.mark.slow)])
def test_top_activating_is_the_same_for_1_2_and_3_workers(saved_llama, ray_cluster, workers: int):
    options = dict(layers=[0, 1], k=4, window=9)  # batches of 2: 14 shards of 8 windows
    expected = neurons.top_activating(saved_llama, TEXTS, **options, execution=Execution(batch_size=2))
    with RayExecutor(workers=workers, cpus=TEST_CPUS) as executor:
        table = neurons.top_activating(saved_llama, TEXTS, **options,
                                       execution=Execution(executor=executor, batch_size=2))
    _same_up_to_near_ties(table, expected)  # other threads and shards: float32 rounding, which may reorder near-ties


def _same_up_to_near_ties(table: pd.DataFrame, expected: pd.DataFrame) -> None:
    """Equal coefficients rank by rank (to float32 rounding); a rank may be held by another token only where
    that coefficient ties, to that rounding, with another rank of the same neuron or is the last rank (the
    corpus repeats windows, so exact ties are common and rounding may break them either way)."""
    pd.testing.assert_frame_equal(table[["layer", "neuron", "rank", "coefficient"]],
                                  expected[["layer", "neuron", "rank", "coefficient"]], check_exact=False, **TINY)
    same = (table[["doc", "pos"]].to_numpy() == expected[["doc", "pos"]].to_numpy()).all(axis=1)
    k = expected["rank"].max()
    for i in np.flatnonzero(~same):
        row = expected.iloc[i]
        group = expected[(expected.layer == row.layer) & (expected.neuron == row.neuron)]
        others = group[group["rank"] != row["rank"]]["coefficient"].to_numpy()
        tied = np.isclose(others, row.coefficient, atol=TINY["atol"], rtol=TINY["rtol"]).any()
        assert tied or row["rank"] == k, f"rank {row['rank']} of neuron {row.neuron} differs without a tie"


class KillsAWorker(RayExecutor):
    """Kills the worker it has just handed a chunk to, once, after the first chunk came back."""

    submitted, killed = 0, None

    def _submit(self, slot, key, job_ref, chunk):
        ref = super()._submit(slot, key, job_ref, chunk)
        self.submitted += 1
        if self.killed is None and self.submitted > len(self.actors):  # a worker that already finished a chunk
            self.killed = self.actors[slot]
            ray.kill(self.killed)
        return ref


def test_a_worker_killed_mid_sweep_loses_nothing(saved_llama, ray_cluster):
    expected = _sweep(saved_llama, sites="head", method="zero")
    with KillsAWorker(workers=2, cpus=TEST_CPUS, chunks_per_worker=4) as executor:
        found = _sweep(saved_llama, sites="head", method="zero", execution=Execution(executor=executor))
        assert executor.killed is not None and executor.killed not in executor.actors  # replaced by a fresh one
    _assert_same_rows(found, expected)


def test_an_interrupted_sweep_resumes_on_ray(saved_llama, executor, tmp_path, monkeypatch):
    out = tmp_path / "sweep.parquet"
    options = dict(sites="head", method="mean", reference=REFERENCE, execution=Execution(executor=executor, out=out))
    expected = _sweep(saved_llama, sites="head", method="mean", reference=REFERENCE)
    written: list[pd.DataFrame] = []
    write = ResultStore.write

    def interrupted(store, rows):
        if len(written) == 3:
            raise KeyboardInterrupt("the driver is stopped after three chunks")
        write(store, rows)
        written.append(rows)

    monkeypatch.setattr(ResultStore, "write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _sweep(saved_llama, **options)
    first = {(p, s) for frame in written for p, s in zip(frame["prompt_idx"], frame["site"])}
    assert 0 < len(first) < len(expected)
    written.clear()
    monkeypatch.setattr(ResultStore, "write", lambda store, rows: (write(store, rows), written.append(rows)))
    found = _sweep(saved_llama, **options)
    second = {(p, s) for frame in written for p, s in zip(frame["prompt_idx"], frame["site"])}
    assert not first & second and len(first) + len(second) == len(expected)  # nothing computed twice
    _assert_same_rows(found, expected)
