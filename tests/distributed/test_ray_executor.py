"""The Ray executor itself: a worker process that dies mid-chunk has its chunk retried on a fresh worker (each
result once), an error of the analysis is reported as it is (not retried), workers run one torch thread each by
default, load the model themselves and refuse a driver model that was edited after loading; `stream` gives results
in chunk order whichever finished first, draws no more chunks than it may run ahead, and retries a lost chunk too."""

import itertools
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from distributed_helpers import BASELINES, PROMPTS, RAY_REASON, TARGETS, TEST_CPUS
from numerics import TINY

import resid
from resid.analyses import Execution, ablation
from resid.analyses.distributed import Job, RayExecutor
from resid.errors import ResidError

ray = pytest.importorskip("ray", reason=RAY_REASON)


ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the test jobs below travel by value


class Given(Job):
    """A job whose chunks the test hands to executor.map itself: its plan is the chunk numbers 0..7."""

    def plan(self, done: set, workers: int | None, per_worker: int) -> list:
        return [chunk for chunk in range(8) if chunk not in done]


@dataclass
class Squares(Given):
    """chunk -> chunk ** 2; the worker process exits (like an OOM kill) on `crash_on` the first time round."""

    marker: str  # a file that exists once the crash has happened
    crash_on: int | None = None
    fail_on: int | None = None  # raises a ResidError on this chunk

    def setup(self, model):
        return None

    def run(self, state, chunk: int):
        if chunk == self.crash_on and not Path(self.marker).exists():
            Path(self.marker).touch()
            os._exit(1)
        if chunk == self.fail_on:
            raise ResidError(f"chunk {chunk} is bad input")
        yield chunk**2

    def combine(self, pieces: list):
        return pieces[0]


@dataclass
class Threads(Given):
    def setup(self, model):
        return None

    def run(self, state, chunk: int):
        yield torch.get_num_threads(), str(state)

    def combine(self, pieces: list):
        return pieces[0]


@dataclass
class Slow(Given):
    """chunk -> (chunk, a tensor): chunk 0 takes longest, so chunk 1 finishes first on two workers."""

    def setup(self, model):
        return None

    def run(self, state, chunk: int):
        time.sleep(1.0 if chunk == 0 else 0.0)
        yield chunk, torch.full((2,), float(chunk))

    def combine(self, pieces: list):
        return pieces[0]


def test_stream_gives_chunk_order_and_draws_only_what_runs_ahead(saved_llama, ray_cluster):
    drawn: list[int] = []

    def endless():
        for chunk in itertools.count():
            drawn.append(chunk)
            yield chunk

    with RayExecutor(workers=2, cpus=TEST_CPUS) as executor:
        stream = executor.stream(saved_llama, Slow(), endless(), ahead=2)
        found = [next(stream) for _ in range(4)]
        stream.close()
    assert [chunk for chunk, _ in found] == [0, 1, 2, 3]
    assert all(tensor.device.type == "cpu" and tensor[0] == chunk for chunk, tensor in found)
    assert len(drawn) <= 4 + 2  # those handed out, and at most `ahead` beyond them


def test_stream_retries_a_chunk_lost_with_its_worker(saved_llama, ray_cluster, tmp_path):
    with RayExecutor(workers=2, cpus=TEST_CPUS) as executor:
        found = list(executor.stream(saved_llama, Squares(str(tmp_path / "crashed"), crash_on=2), range(6), ahead=2))
    assert (tmp_path / "crashed").exists() and found == [i * i for i in range(6)]


def test_a_worker_process_exiting_mid_chunk_is_replaced(saved_llama, ray_cluster, tmp_path):
    with RayExecutor(workers=2, cpus=TEST_CPUS) as executor:
        executor.start(saved_llama)
        first = list(executor.actors)
        results = list(executor.map(saved_llama, Squares(str(tmp_path / "crashed"), crash_on=3), list(range(8))))
        assert (tmp_path / "crashed").exists() and set(executor.actors) != set(first)
    assert sorted(results) == [(i, i * i) for i in range(8)]  # every chunk once


def test_an_error_of_the_analysis_is_not_retried(saved_llama, ray_cluster, tmp_path):
    with RayExecutor(workers=2, cpus=TEST_CPUS) as executor:
        executor.start(saved_llama)
        actors = list(executor.actors)
        with pytest.raises(ResidError, match="^chunk 2 is bad input$"):
            list(executor.map(saved_llama, Squares(str(tmp_path / "unused"), fail_on=2), list(range(4))))
        assert executor.actors == actors


@pytest.mark.parametrize("threads", [1, 2])
def test_workers_run_one_torch_thread_by_default(saved_llama, ray_cluster, threads: int):
    options = {} if threads == 1 else dict(threads=2)
    with RayExecutor(workers=1, cpus=TEST_CPUS, **options) as executor:
        assert list(executor.map(saved_llama, Threads(), [0])) == [(0, (threads, "None"))]


def test_workers_refuse_a_model_edited_after_loading(saved_llama, ray_cluster):
    edited = resid.load(saved_llama.name)
    with torch.no_grad():
        next(p for name, p in edited.named_parameters() if ".mlp." in name).mul_(2.0)
    with RayExecutor(workers=1, cpus=TEST_CPUS) as executor:
        with pytest.raises(ResidError, match=r"could not load the model .*differ from the driver's model"):
            executor.start(edited)


def test_executor_ray_by_name(saved_llama, ray_cluster):
    expected = ablation.sweep(saved_llama, PROMPTS, TARGETS, BASELINES, sites="layer")
    found = ablation.sweep(saved_llama, PROMPTS, TARGETS, BASELINES, sites="layer",
                           execution=Execution(executor="ray", workers=2))
    assert found[["prompt_idx", "site"]].equals(expected[["prompt_idx", "site"]])
    torch.testing.assert_close(torch.tensor(found["delta"]), torch.tensor(expected["delta"]), **TINY)


def test_more_workers_than_the_cluster_has(saved_llama, ray_cluster):
    with pytest.raises(ResidError, match=r"3 workers x 1 CPUs each need 3 CPUs, but the Ray cluster has 2"):
        RayExecutor(workers=3).start(saved_llama)


def test_cli_on_ray_writes_the_in_process_results(saved_llama, ray_cluster, tmp_path):
    import json

    import pandas as pd

    from resid.analyses.cli.main import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "target": t, "baseline": b}) + "\n"
                               for p, t, b in zip(PROMPTS, TARGETS, BASELINES)))
    common = ["ablate", "--model", saved_llama.name, "--prompts", str(prompts), "--sites", "head", "--quiet"]
    assert main([*common, "--out", str(tmp_path / "local.parquet")]) == 0
    assert main([*common, "--out", str(tmp_path / "ray.parquet"), "--ray", "--workers", "2"]) == 0
    # The file keeps the order rows were written in (chunks finish in any order); the rows are the same.
    local, on_ray = (pd.read_parquet(tmp_path / f"{name}.parquet").sort_values(["prompt_idx", "site"],
                                                                              ignore_index=True)
                     for name in ("local", "ray"))
    pd.testing.assert_frame_equal(on_ray, local, check_exact=False, **TINY)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(PROMPTS * 3))
    neurons = ["neurons", "top", "--model", saved_llama.name, "--layers", "1", "--neurons", "3,5", "--k", "3",
               "--corpus", str(corpus), "--batch-size", "1", "--quiet"]
    assert main([*neurons, "--out", str(tmp_path / "n_local")]) == 0
    assert main([*neurons, "--out", str(tmp_path / "n_ray"), "--ray", "--workers", "2"]) == 0
    local, on_ray = (pd.read_parquet(tmp_path / name / "neuron_contexts.parquet") for name in ("n_local", "n_ray"))
    pd.testing.assert_frame_equal(on_ray, local, check_exact=False, **TINY)
