"""Chunks on Ray: one actor per worker loads the model once (one GPU each when the cluster has GPUs), then
pulls chunks one at a time; the driver collects results as they finish.

    with RayExecutor(workers=2) as executor:            # a local cluster (or RAY_ADDRESS, or address=...)
        df = ablation.sweep(model, prompts, targets, execution=Execution(executor=executor))

Faults: a worker that dies mid-chunk (actor killed, process OOM-killed, node lost) loses only that chunk: the
driver starts a fresh actor in its place (it loads the model again) and hands the chunk to the next free worker.
A chunk whose result never arrived was never persisted, so nothing is lost or counted twice; a chunk that kills
`retries + 1` workers is reported. An error raised by the analysis itself (bad input) is not retried.

Ray is an optional extra (`pip install 'resid-stream[distributed]'`) and is imported only here, when an executor is
made. If this executor starts Ray (no cluster running yet), Ray stays up for later calls and stops when Python exits;
`close()` ends the actors.
"""

import importlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence

from resid.analyses.distributed.executor import Executor, Job
from resid.analyses.distributed.origin import ModelOrigin, origin_of
from resid.analyses.distributed.worker import Worker
from resid.errors import ResidError
from resid.model import Transformer

RAY_MODULE = "ray"
EXTRA = "pip install 'resid-stream[distributed]'"
# Ray errors that mean "the worker is gone", not "the chunk is bad": the chunk is retried on another worker.
LOST = ("RayActorError", "WorkerCrashedError", "OutOfMemoryError", "NodeDiedError", "ObjectLostError")
RESOURCE_WAIT_S = 30.0  # how long start() waits for busy CPUs / GPUs to come free before it says so


def import_ray():
    """The ray module, or one clear error naming the extra that installs it."""
    try:
        return importlib.import_module(RAY_MODULE)
    except ImportError:
        raise ResidError(
            f"Running on Ray needs the optional package ray, which is not installed: {EXTRA} (or run in process: "
            "leave executor= unset)."
        ) from None


def _count(value: object, name: str, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ResidError(f"{name} must be an integer of at least {minimum}, got {value!r}.")


class RayExecutor(Executor):
    """Run chunks on `workers` Ray actors (default: one per GPU of the cluster, else one per `threads` CPUs).

    address: a running cluster ("auto", "ray://host:10001", "host:6379"); None starts a local one unless Ray is
    already initialized or RAY_ADDRESS is set. threads: torch threads per worker. cpus: logical CPUs Ray reserves
    per worker (default: threads). gpus: one GPU per worker (default: when the cluster has GPUs). chunks_per_worker:
    the fewest chunks per worker a sweep is cut into (more: less lost with a worker, more overhead). retries: how
    many lost workers one chunk may cost before the run stops.
    """

    def __init__(
        self,
        workers: int | None = None,
        address: str | None = None,
        threads: int = 1,
        cpus: float | None = None,
        gpus: bool | None = None,
        retries: int = 3,
        chunks_per_worker: int = 1,
    ):
        if workers is not None:
            _count(workers, "workers", 1)
        _count(threads, "threads", 1)
        _count(retries, "retries", 0)
        _count(chunks_per_worker, "chunks_per_worker", 1)
        if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or cpus <= 0):
            raise ResidError(f"cpus must be a positive number of logical CPUs per worker, got {cpus!r}.")
        self.ray = import_ray()
        self.requested, self.address, self.threads, self.gpus, self.retries = workers, address, threads, gpus, retries
        self.cpus = float(threads if cpus is None else cpus)
        self._chunks_per_worker = chunks_per_worker
        self.actors: list = []
        self.origin: ModelOrigin | None = None
        self.startup_seconds = 0.0  # ray.init (if this executor started Ray) + the actors loading the model
        self._init_seconds = 0.0
        self._lost = tuple(getattr(self.ray.exceptions, name) for name in LOST)

    @property
    def workers(self) -> int:
        return len(self.actors) if self.actors else self._layout()[0]

    @property
    def chunks_per_worker(self) -> int:
        return self._chunks_per_worker

    def start(self, model: Transformer) -> float:
        """Start the actors for `model` (kept for later calls on the same model); the start-up seconds (0 when
        they were already up): ray.init if this executor started Ray, and the actors loading the model."""
        origin = origin_of(model)
        if self.actors and origin == self.origin:
            return 0.0
        self.close()
        workers, gpus = self._layout()
        self._wait_for_resources(workers, gpus)
        began = time.perf_counter()
        self.origin = origin
        self._options = dict(num_cpus=self.cpus, num_gpus=1 if gpus else 0, max_restarts=0)
        self.actors = [self._spawn() for _ in range(workers)]
        self._wait_ready(self.actors)
        self.startup_seconds = self._init_seconds + time.perf_counter() - began
        return self.startup_seconds

    def map(self, model: Transformer, job: Job, chunks: Sequence[object]) -> Iterator[tuple[int, object]]:
        yield from self._run(model, job, enumerate(chunks), lambda running: True)

    def stream(self, model: Transformer, job: Job, chunks: Iterable[object], ahead: int) -> Iterator[object]:
        """In chunk order: a chunk that finishes before an earlier one waits here, and counts towards `ahead`."""
        waiting: dict[int, object] = {}
        first = 0  # the next chunk to hand to the caller
        for index, result in self._run(model, job, enumerate(chunks),
                                       lambda running: running + len(waiting) < ahead):
            waiting[index] = result
            while first in waiting:
                found = waiting.pop(first)
                first += 1
                yield found
                del found  # not held while the next chunk is awaited

    def _run(self, model: Transformer, job: Job, chunks: Iterator[tuple[int, object]],
             room: Callable[[int], bool]) -> Iterator[tuple[int, object]]:
        """(chunk index, result) in completion order. Chunks are drawn from `chunks` while a worker is idle and
        `room(chunks running)` says so; a chunk lost with its worker goes again first. The actors start (and the
        job is stored) when the first chunk is drawn."""
        ray, key, job_ref = self.ray, uuid.uuid4().hex, None
        retry: deque = deque()  # (index, chunk) lost with a worker, to go again before new ones
        idle: deque = deque()
        running: dict = {}  # ObjectRef -> (actor slot, chunk index, chunk)
        failures: dict[int, int] = {}
        holding: set[int] = set()  # slots whose actor has the job
        more = True
        while True:
            while (retry or (more and room(len(running)))) and (idle or job_ref is None):
                item = retry.popleft() if retry else next(chunks, None)
                if item is None:
                    more = False
                    break
                if job_ref is None:
                    self.start(model)
                    job_ref = ray.put(job)  # stored once; Ray hands it to each actor with that actor's first chunk
                    idle.extend(range(len(self.actors)))
                slot, (index, chunk) = idle.popleft(), item
                sent = None if slot in holding else job_ref
                running[self._submit(slot, key, sent, chunk)] = (slot, index, chunk)
                holding.add(slot)
            if not running:
                return
            (ref,), _ = ray.wait(list(running), num_returns=1)
            slot, index, chunk = running.pop(ref)
            try:
                result = ray.get(ref)
            except self._lost as error:
                failures[index] = failures.get(index, 0) + 1
                if failures[index] > self.retries:
                    raise ResidError(
                        f"Chunk {index} was lost with its worker {failures[index]} times (last: {_first_line(error)}); "
                        "it may need more memory than a worker has: use a smaller batch_size or fewer workers per "
                        "machine."
                    ) from error
                self._replace(slot)
                holding.discard(slot)
                retry.appendleft((index, chunk))
            except ray.exceptions.RayTaskError as error:
                if isinstance(error.cause, ResidError):
                    raise ResidError(str(error.cause)) from None
                raise
            else:
                yield index, result
            idle.append(slot)

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors = []

    def _submit(self, slot: int, key: str, job_ref: object, chunk: object):
        """Hand one chunk (with the job's ObjectRef, or None if the actor has the job) to the actor in `slot`;
        the ObjectRef of its result."""
        return self.actors[slot].run.remote(key, job_ref, chunk)

    def _connect(self) -> None:
        if not self.ray.is_initialized():
            began = time.perf_counter()
            self.ray.init(address=self.address, include_dashboard=False, logging_level=logging.WARNING)
            self._init_seconds = time.perf_counter() - began

    def _layout(self) -> tuple[int, bool]:
        """(workers, whether each takes a GPU), checked against the cluster's resources."""
        self._connect()
        resources = self.ray.cluster_resources()
        n_cpus, n_gpus = resources.get("CPU", 0), int(resources.get("GPU", 0))
        gpus = n_gpus > 0 if self.gpus is None else self.gpus
        if gpus and not n_gpus:
            raise ResidError("gpus=True, but the Ray cluster has no GPU: leave gpus unset, or start GPU nodes.")
        workers = self.requested or (n_gpus if gpus else max(1, int(n_cpus // self.cpus)))
        if gpus and workers > n_gpus:
            raise ResidError(f"{workers} workers need {workers} GPUs (one each), but the Ray cluster has {n_gpus}: "
                             f"use workers={n_gpus} or fewer.")
        if workers * self.cpus > n_cpus:
            raise ResidError(
                f"{workers} workers x {self.cpus:g} CPUs each need {workers * self.cpus:g} CPUs, but the Ray cluster "
                f"has {n_cpus:g}: use fewer workers, or reserve fewer CPUs per worker (cpus=0.5)."
            )
        return workers, gpus

    def _wait_for_resources(self, workers: int, gpus: bool) -> None:
        """Actors that just ended give their resources back within moments; a cluster that stays busy is reported
        (Ray would otherwise wait for them forever)."""
        deadline = time.monotonic() + RESOURCE_WAIT_S
        while True:
            free = self.ray.available_resources()
            cpus, n_gpus = free.get("CPU", 0), free.get("GPU", 0)
            if cpus >= workers * self.cpus - 1e-9 and (not gpus or n_gpus >= workers):
                return
            if time.monotonic() > deadline:
                raise ResidError(
                    f"The Ray cluster has {cpus:g} CPUs and {n_gpus:g} GPUs free, but {workers} workers need "
                    f"{workers * self.cpus:g} CPUs{f' and {workers} GPUs' if gpus else ''}: other actors hold the "
                    "rest. Close other executors (executor.close()), wait for other jobs, or use fewer workers."
                )
            time.sleep(0.2)

    def _spawn(self):
        remote = self.ray.remote(Worker).options(**self._options)
        return remote.remote(self.origin, self.threads)

    def _wait_ready(self, actors: list) -> None:
        try:
            self.ray.get([actor.ready.remote() for actor in actors])
        except self.ray.exceptions.RayError as error:
            self.close()
            raise ResidError(f"A Ray worker could not load the model {self.origin.name}: {_cause(error)}") from None

    def _replace(self, slot: int) -> None:
        """A fresh actor (loading the model again) in place of the lost one."""
        try:
            self.ray.kill(self.actors[slot])
        except Exception:  # noqa: BLE001 -- already gone is what we want
            pass
        self.actors[slot] = self._spawn()
        self._wait_ready([self.actors[slot]])


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _cause(error: Exception) -> str:
    """The creation task's own error line (e.g. a ResidError) out of Ray's long report."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    own = [line for line in lines if line.startswith(("resid.errors.ResidError:", "ResidError:"))]
    return own[-1].split(":", 1)[1].strip() if own else (lines[-1] if lines else type(error).__name__)
