"""The one driver of chunked work: every long job (ablation sweeps, every kind of patching, corpus scans, the
reference means of mean ablation and the means of encoder-decoder sweeps, an attribution graph's backward sweeps and
its head split) runs through `drive`, the one loop over an executor's map, so each gets batching (in its job),
out-of-memory back-off (in its job), a resumable `out=` store, progress (a bar, or a line every half minute where no
bar is drawn: resid.analyses.distributed.progress) and Ray workers from this one loop.

    result = drive(model, job, Execution(out="results.parquet", executor="ray", workers=2))

A job (resid.analyses.distributed.executor.Job) says what its chunks are (`plan`, given the keys a resumed store
already holds), how a worker computes one, and how the finished results become the answer (`finish`). Jobs whose
chunks are table rows may write to a store: the driver opens it with the job's key columns and signature plus the
model's identity (resid.identity: a store written by other weights, another dtype or another config is refused),
writes each result as it arrives (the driver is the only writer, whoever computed the rows) and merges them at
the end. Reductions (top-k lists, sums) take no store: their results come back in chunk order, whatever order
the workers finished in, so they do not depend on the number of workers.
"""

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from resid.analyses.distributed.execution import Execution
from resid.analyses.distributed.executor import InProcess, Job
from resid.analyses.distributed.progress import meter
from resid.analyses.io import frames
from resid.analyses.io.store import ResultStore
from resid.errors import ResidError
from resid.identities import identity


def _check_stored(store: ResultStore, job: Job) -> None:
    """Refuse a resumed store holding rows this job could not have written: a key outside the job's (another
    prompt, another site), or a non-finite value in one of its finite columns (which it refuses to store). The
    signature says the store is of this sweep; this says its rows are (an edited or damaged file is not)."""
    if not job.key_values() and not job.finite:
        return
    rows = store.rows()
    for name, allowed in job.key_values().items():
        outside = [value for value in dict.fromkeys(rows[name].tolist()) if frames.key_value(value) not in allowed]
        if outside:
            raise store.mismatch(f"{len(outside)} value(s) of its key column {name!r} are not this sweep's, e.g. "
                                 f"{outside[0]!r:.60}")
    problem = _not_finite(job, rows)
    if problem is not None:
        raise store.mismatch(f"{problem} (this sweep stores finite numbers there)")


def _not_finite(job: Job, rows: pd.DataFrame) -> str | None:
    """The first row of `rows` with a NaN or infinite value in one of the job's finite columns, in words."""
    for name in (name for name in job.finite if name in rows.columns):
        values = pd.to_numeric(rows[name], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            row = rows.iloc[bad[0]]
            key = ", ".join(f"{column} {frames.key_value(row[column])}" for column in job.key)
            value = row[name].item() if isinstance(row[name], np.generic) else row[name]
            return f"the row of {key} has {name} {value!r:.40}"
    return None


class Progress:
    """The bar of one drive, counting the unit of its total, so that it shows a percentage and an ETA: the job's
    `unit` where the job sizes its chunks (a reduction's chunks, a sweep's rows, a scan's tokens), else whole
    chunks, each counted when its last piece has arrived (a table job's chunk comes in pieces in process, one after
    another, and whole from a remote worker)."""

    def __init__(self, job: Job, chunks: list, pieces: bool, execution: Execution):
        self.job, self.chunks, self.pieces = job, chunks, pieces
        self.sized = job.key is None or type(job).size is not Job.size
        total = sum(job.size(chunk) for chunk in chunks) if self.sized else len(chunks)
        self.bar = meter(execution.progress, total, f"{job.name} ({len(chunks)} chunks)",
                         job.unit if self.sized else "chunk")
        self.current: int | None = None  # the chunk whose pieces are arriving (in process)

    def arrived(self, index: int, result: object) -> None:
        if self.job.key is None:
            self.bar.update(self.job.size(self.chunks[index]))
        elif self.sized:
            self.bar.update(len(result))
        elif not self.pieces:
            self.bar.update(1)
        elif index != self.current:
            self.bar.update(self.current is not None)  # the previous chunk has sent its last piece
            self.current = index

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, kind, *exc) -> None:
        if kind is None and self.current is not None:
            self.bar.update(1)  # the last chunk's last piece
        self.bar.close()


def drive(model, job: Job, execution: Execution, take: Callable[[object, object], None] | None = None) -> object:
    """Run `job` on `model` (see the module docstring) as `execution` says: the chunks not yet in the store at its
    `out` (a .parquet or .csv file, table jobs only), on its executor, with a bar if it shows progress (the job's
    batch size is the job's own business: it was cut into chunks with it). take: a reduction's results handed over
    as they arrive, take(chunk, result), instead of kept for `finish` (an attribution graph writes each batch's
    rows into its one buffer, so no second copy is held); drive then returns None."""
    out = execution.out
    if out is not None and job.key is None:
        raise ResidError(f"{job.name} computes a reduction, not table rows: it takes no out= file.")
    if take is not None and job.key is not None:
        raise ResidError(f"{job.name} computes table rows: the driver keeps them (take= is for reductions).")
    execution.check_chunked(job.name)
    store = None
    with execution.started() as execution:
        runner = execution.executor
        try:
            if out is not None:
                store = ResultStore(Path(out), job.key, {**job.signature(), "model": identity(model).as_dict()})
            done = store.done() if store is not None else set()
            if done:
                _check_stored(store, job)
            remote = None if isinstance(runner, InProcess) else runner.workers
            chunks = job.plan(done, remote, runner.chunks_per_worker)
            job.prepare(model, execution.inner(), chunks)
            results: list = [None] * len(chunks) if job.key is None else []
            with Progress(job, chunks, isinstance(runner, InProcess), execution) as bar:
                for index, result in runner.map(model, job, chunks):
                    bar.arrived(index, result)
                    if take is not None:
                        take(chunks[index], result)
                        continue
                    if job.key is None:  # a reduction: each chunk's one result, kept in chunk order
                        results[index] = result
                        continue
                    if store is not None:
                        problem = _not_finite(job, result)
                        if problem is not None:
                            raise ResidError(f"{job.name}: {problem}, so it is not stored: the model's output is not "
                                             "a finite number there (an overflow in float16 or bfloat16? try --dtype "
                                             "float32).")
                        store.write(result)  # persisted before the next result is awaited
                    results.append(result)
        except BaseException:
            if store is not None:
                store.close()  # the finished chunks stay for a rerun to resume from; the lock goes now, not at exit
            raise
    if take is not None:
        return None
    if job.key is None:
        return job.finish(results)
    if store is not None:
        return job.finish(store.finish())
    return job.finish(pd.concat(results, ignore_index=True) if results else None)
