"""Chunks and executors without Ray: the sweep's chunk plan covers every pending row exactly once, the in-process
layout is the engine's plain loop, streams give chunk order (in process, each chunk computed only when asked for),
and asking for Ray where it is not installed, or for remote workers on a model built in memory, is one clear
error."""

import pytest
from random_models import make_random_model

from resid.analyses import Execution, ablation, neurons
from resid.analyses.distributed import Executor, InProcess, Job, ray_executor
from resid.analyses.distributed.origin import origin_of
from resid.analyses.site_words import expand
from resid.analyses.sweeps.chunks import MAX_CHUNK_ROWS, layout
from resid.errors import ResidError

PROMPTS = ["When Mary and John went to the store, John gave a drink to", "The cat sat on the mat and"]


@pytest.fixture(scope="module")
def model(gpt2_tokenizer):
    return make_random_model("llama_gqa", gpt2_tokenizer)


def _rows(chunks) -> list:
    return [row for chunk in chunks for row in chunk.rows]


def _plan(n_prompts, sites, done, batch, n_layers, workers=None, per_worker=1):
    labels = [site.label for site in sites]
    return layout(n_prompts, sites, lambda p, s: (p, labels[s]) not in done, batch, n_layers, workers, per_worker)


@pytest.mark.parametrize("n_prompts, batch, workers, per_worker",
                         [(7, 3, None, 1), (7, 64, 2, 4), (2, 64, 2, 4), (1, 64, 4, 1), (300, 8, 3, 2), (40, 8, 2, 1)])
def test_every_pending_row_once(model, n_prompts: int, batch: int, workers: int | None, per_worker: int):
    ablations = expand("head", model.config)
    done = {(1, ablations[0].label), (n_prompts - 1, ablations[-1].label)}
    chunks = _plan(n_prompts, ablations, done, batch, model.config.n_layers, workers, per_worker)
    expected = [(p, s) for p in range(n_prompts) for s in range(len(ablations)) if (p, ablations[s].label) not in done]
    assert sorted(_rows(chunks)) == expected
    assert all(chunk.prompts == tuple(sorted({p for p, _ in chunk.rows})) for chunk in chunks)
    if workers is not None:
        assert len(chunks) >= min(workers * per_worker, len(expected))
        assert all(len(chunk.rows) <= MAX_CHUNK_ROWS for chunk in chunks)


def test_in_process_layout_is_the_engine_loop(model):
    """One chunk per `batch` prompts, every site in it: the batches the engine always ran."""
    ablations = expand("sublayer", model.config)
    chunks = _plan(7, ablations, set(), 3, model.config.n_layers)
    assert [chunk.prompts for chunk in chunks] == [(0, 1, 2), (3, 4, 5), (6,)]
    assert all(len(chunk.rows) == len(chunk.prompts) * len(ablations) for chunk in chunks)


def test_remote_layout_keeps_prompt_blocks_large(model):
    """Few prompts: every chunk holds all of them and a run of consecutive layers of about equal cost (an
    ablation entering layer L reruns n_layers - L layers); many prompts: blocks of a quarter batch or more."""
    ablations = expand("sublayer", model.config)  # 3 layers x (attn, mlp)
    chunks = _plan(8, ablations, set(), 64, 3, workers=2)
    assert [chunk.prompts for chunk in chunks] == [tuple(range(8))] * 2
    layers = [sorted({ablations[s].layer for _, s in chunk.rows}) for chunk in chunks]
    assert layers == [[0], [1, 2]]  # costs 3 + 3 against 2 + 2 + 1 + 1
    many = _plan(64, ablations, set(), 16, 3, workers=2, per_worker=4)
    assert len(many) == 8 and all(len(chunk.prompts) == 8 and len(chunk.rows) == 8 * 6 for chunk in many)
    big = _plan(4000, ablations, set(), 1024, 3, workers=2)
    assert len(big) >= 4000 * 6 / MAX_CHUNK_ROWS and all(len(chunk.rows) <= MAX_CHUNK_ROWS for chunk in big)


def test_executor_arguments(model):
    runner, owned = Execution().runner()
    assert isinstance(runner, InProcess) and owned
    given = InProcess()
    assert Execution(executor=given).runner() == (given, False)  # the caller's executor: the caller closes it
    with pytest.raises(ResidError, match="workers=2 needs executor='ray'"):
        Execution(workers=2).runner()
    with pytest.raises(ResidError, match="drop workers="):
        Execution(executor=InProcess(), workers=2).runner()
    with pytest.raises(ResidError, match="Unknown executor 'dask'"):
        ablation.sweep(model, PROMPTS, [" Mary", " the"], execution=Execution(executor="dask"))
    with pytest.raises(ResidError, match="workers must be a positive integer"):
        neurons.top_activating(model, PROMPTS, layers=[0], execution=Execution(executor="ray", workers=0))


def test_ray_not_installed_is_one_clear_error(model, monkeypatch):
    monkeypatch.setattr(ray_executor, "RAY_MODULE", "ray_is_not_installed_here")
    expected = r"needs the optional package ray.*pip install 'resid-stream\[distributed\]'"
    with pytest.raises(ResidError, match=expected):
        ablation.sweep(model, PROMPTS, [" Mary", " the"], execution=Execution(executor="ray", workers=2))
    with pytest.raises(ResidError, match=expected):
        neurons.top_activating(model, PROMPTS, layers=[0], execution=Execution(executor="ray"))
    with pytest.raises(ResidError, match=expected):
        ray_executor.RayExecutor(workers=2)


def test_a_model_built_in_memory_cannot_go_to_workers(model):
    with pytest.raises(ResidError, match=r"built in memory.*save_pretrained.*resid.load\(folder\).*in-process"):
        origin_of(model)


class Doubles(Job):
    """chunk -> 2 * chunk, recording the chunks it ran."""

    def __init__(self):
        self.ran: list[int] = []

    def setup(self, model):
        return None

    def run(self, state, chunk: int):
        self.ran.append(chunk)
        yield 2 * chunk

    def combine(self, pieces: list):
        return pieces[0]


class MapOnly(Executor):
    """An executor that only maps (in process): Executor.stream's default, `ahead` chunks at a time."""

    @property
    def workers(self) -> int:
        return 1

    def map(self, model, job, chunks):
        return InProcess().map(model, job, chunks)


def test_streams_give_chunk_order_and_in_process_compute_only_what_is_asked_for(model):
    job = Doubles()
    stream = InProcess().stream(model, job, iter(range(100)), ahead=1)
    assert [next(stream) for _ in range(3)] == [0, 2, 4] and job.ran == [0, 1, 2]
    job = Doubles()
    assert list(MapOnly().stream(model, job, range(5), ahead=2)) == [0, 2, 4, 6, 8] and job.ran == list(range(5))
