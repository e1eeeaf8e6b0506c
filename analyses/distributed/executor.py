"""Jobs and executors: what a chunk computes, and who runs the chunks (resid.analyses.distributed.driver runs a
job on an executor).

Glossary:
    job      what to compute, as plain data (token ids, site lists, settings; never weights): `setup(model)` once
             per worker builds its state (tensors on the worker's device), `run(state, chunk)` yields the
             results of one chunk in pieces, `combine(pieces)` joins a finished chunk's pieces into one result.
    chunk    one deterministic unit of a job (a block of prompts x a block of sites; a shard of a corpus).
             Chunks depend on the inputs and the batch size, so results do not depend on who runs them.
    worker   a process holding one model: the driver itself (InProcess) or a Ray actor (RayExecutor).

`executor.map(model, job, chunks)` yields (chunk index, result) as results arrive: in chunk order, piece by piece,
in process; in completion order, one result per chunk, on Ray. Callers persist or merge each result as it comes
(the sweep writes it to its ResultStore; a scan merges its top-k), so the caller is the only writer.

`executor.stream(model, job, chunks, ahead)` feeds a step job (resid.analyses.distributed.steps): each chunk's one
result in chunk order, the chunks drawn from a possibly endless iterator only as they are needed, at most `ahead`
of them running or waiting beyond the result the caller holds (in process: none, each chunk is computed when it is
asked for). A job fed so yields one piece per chunk.
"""

import abc
import itertools
from collections.abc import Container, Iterable, Iterator, Sequence

from resid.model import Transformer
from resid.seq2seq import EncoderDecoder

Model = Transformer | EncoderDecoder  # what a job runs on


class Job(abc.ABC):
    """Work split into chunks, run by resid.analyses.distributed.driver.drive; see the module docstring.
    Subclasses are plain dataclasses.

    Table jobs set `key` (the columns that name a result row) and `signature()` (what determines the rows, for a
    resumable store); their chunk results are DataFrames. Reductions leave `key` None: each chunk has one result
    and `finish` merges them, in chunk order."""

    name = "job"  # what the progress bar says
    unit = "row"  # what `size` counts
    key: tuple[str, ...] | None = None
    # Columns of the rows that are finite numbers, checked as each row is stored and when a store is resumed: a
    # NaN there is a failed computation (or an edited file), never a result.
    finite: tuple[str, ...] = ()
    # A job mapped several times on one executor (an attribution graph's rounds) sets a value unique to it: a Ray
    # worker that has set it up keeps its state for every map of the same session instead of setting up again.
    session: str | None = None

    def plan(self, done: set, workers: int | None, per_worker: int) -> list:
        """The chunks still to compute: all of them less the rows whose keys are in `done` (a resumed store's);
        laid out for `workers` remote workers (None: in process), at least `per_worker` chunks each. Jobs that feed
        a step job take their chunks from it instead (Executor.stream) and have no plan of their own."""
        raise NotImplementedError(f"{type(self).__name__} is fed chunks by a step job; it has no plan of its own")

    def prepare(self, model: Model, execution, chunks: list) -> None:
        """Called once the chunks are planned, before any runs, with the drive's Execution, its executor started
        (Execution.inner: no out, which is the drive's):
        e.g. statistics the chunks need (the means of mean ablation), computed by a drive of their own on the same
        workers with the same progress, and only if there is work left."""

    def size(self, chunk: object) -> int:
        """How much of the progress bar a chunk is, in `unit`s; a table job that does not size its chunks has a bar
        of whole chunks (resid.analyses.distributed.driver.Progress)."""
        return 1

    def signature(self) -> dict:
        """A JSON-able description of everything that determines the rows (the driver adds the model's
        identity); a resumed store must have an equal one."""
        raise NotImplementedError(f"{type(self).__name__} takes no store")

    def key_values(self) -> dict[str, Container]:
        """The values each key column of this job's rows can take (a column left out: not checked). A resumed
        store's rows are checked against them, so that a row of another prompt or site is refused, not merged."""
        return {}

    @abc.abstractmethod
    def setup(self, model: Model) -> object:
        """Per-worker state built once from the worker's own model."""

    @abc.abstractmethod
    def run(self, state: object, chunk: object) -> Iterator[object]:
        """The results of one chunk, in pieces (a piece may be persisted before the next is computed)."""

    @abc.abstractmethod
    def combine(self, pieces: list) -> object:
        """A finished chunk's pieces as one result (what a remote worker sends back)."""

    def finish(self, results: object) -> object:
        """The answer: for table jobs, from every row (a DataFrame, or None when there are none); for
        reductions, from the chunks' results in chunk order."""
        return results


class Executor(abc.ABC):
    """Runs the chunks of a job; see the module docstring."""

    @property
    @abc.abstractmethod
    def workers(self) -> int:
        """How many chunks run at once."""

    @property
    def chunks_per_worker(self) -> int:
        """The fewest chunks per worker a sweep is cut into: more chunks lose less with a lost worker, but each
        costs a fixed overhead (resid.analyses.sweeps.chunks)."""
        return 1

    @abc.abstractmethod
    def map(self, model: Model, job: Job, chunks: Sequence[object]) -> Iterator[tuple[int, object]]:
        """(chunk index, result) for every chunk, as they arrive."""

    def stream(self, model: Model, job: Job, chunks: Iterable[object], ahead: int) -> Iterator[object]:
        """Each chunk's result in chunk order, drawing chunks only as needed (see the module docstring). This
        default maps `ahead` chunks at a time; InProcess and RayExecutor keep their workers busier."""
        chunks = iter(chunks)
        while wave := list(itertools.islice(chunks, ahead)):
            found = dict(self.map(model, job, wave))  # one piece per chunk: piece and result are the same
            yield from (found[index] for index in range(len(wave)))

    def close(self) -> None:
        """Let go of workers (nothing to do in process)."""

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InProcess(Executor):
    """The driver runs every chunk itself, in order, with its own model (the default)."""

    @property
    def workers(self) -> int:
        return 1

    def map(self, model: Model, job: Job, chunks: Sequence[object]) -> Iterator[tuple[int, object]]:
        state = job.setup(model) if chunks else None
        for index, chunk in enumerate(chunks):
            for piece in job.run(state, chunk):
                yield index, piece

    def stream(self, model: Model, job: Job, chunks: Iterable[object], ahead: int) -> Iterator[object]:
        state = unset = object()
        for chunk in chunks:  # each computed when the caller asks for it: nothing runs ahead
            state = job.setup(model) if state is unset else state
            (result,) = job.run(state, chunk)
            yield result
            del result  # the caller is done with it: not held while the next chunk is computed
