"""How a long job runs, as one value: every long job (sweeps, patching, scans, means, training, lens training,
evaluations, the graph's backward sweeps) takes `execution: Execution | None = None` with the same settings, names,
types and defaults (None: Execution(), every default).

    from resid.analyses import Execution
    ablation.sweep(model, prompts, targets, execution=Execution(out="sweep.parquet", executor="ray", workers=2))

    executor     None or "inprocess": in this process; "ray": Ray workers (with `workers`); or an Executor object
                 (resid.analyses.distributed.RayExecutor(workers=2, address="auto"))
    workers      how many Ray workers (executor="ray" only; None: one per GPU of the cluster, else one per CPU)
    batch_size   prompts (or corpus windows) per forward pass, targets per backward sweep of an attribution graph;
                 "auto": the largest that fits the device, backing off on out-of-memory errors (a graph: 64)
    progress     a progress bar on stderr; None: when stderr is a terminal
    out          where finished work is kept, so that calling again the same way resumes: a .parquet / .csv
                 table for jobs whose results are rows, a folder for training; None keeps nothing
    checkpoint_every  jobs of steps (training a dictionary or a tuned lens) only: steps between two checkpoints in
                 `out`; None: every CHECKPOINT_SHARE of the run's steps, at most CHECKPOINT_MOST steps apart
    device       jobs of steps only: where the state trains (a dictionary's weights and Adam moments); None: the
                 model's device

The values are checked when the value is made, the executor and workers when the job starts (Execution.runner).
"""

import dataclasses
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from resid.analyses.distributed.executor import Executor, InProcess
from resid.analyses.distributed.progress import shows
from resid.analyses.distributed.ray_executor import RayExecutor
from resid.errors import ResidError

# checkpoint_every=None: a checkpoint every 4% of a run's steps (a tuned lens's 250: every 10), at most 100 steps
# apart (a dictionary run of 2,500 steps or more), so that a kill loses little of a short run or of a long one
CHECKPOINT_SHARE, CHECKPOINT_MOST = 0.04, 100


@dataclass(frozen=True)
class Execution:
    """How a long job runs; see the module docstring."""

    executor: Executor | str | None = None
    workers: int | None = None
    batch_size: int | str = "auto"
    progress: bool | None = None
    out: str | os.PathLike | None = None
    checkpoint_every: int | None = None
    device: str | torch.device | None = None

    def __post_init__(self) -> None:
        size = self.batch_size
        if size != "auto" and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ResidError(f"Execution(batch_size={size!r}): give a positive whole number of prompts per forward "
                             "pass, or 'auto'.")
        if self.progress is not None and not isinstance(self.progress, bool):
            raise ResidError(f"Execution(progress={self.progress!r}): True, False, or None (a bar on a terminal).")
        if self.out is not None and not isinstance(self.out, (str, os.PathLike)):
            raise ResidError(f"Execution(out={self.out!r}): a file or folder path, or None.")
        every = self.checkpoint_every
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise ResidError(f"Execution(checkpoint_every={every!r}): a positive number of steps, or None (every "
                             f"{CHECKPOINT_SHARE:.0%} of the run, at most {CHECKPOINT_MOST} steps apart).")
        if self.device is not None and not isinstance(self.device, (str, torch.device)):
            raise ResidError(f"Execution(device={self.device!r}): a device such as 'cuda' or 'cpu', or None (the "
                             "model's).")

    def checkpoint_steps(self, steps: int) -> int:
        """Steps between two checkpoints of a run of `steps` steps (see the module docstring)."""
        if self.checkpoint_every is not None:
            return self.checkpoint_every
        return max(1, min(CHECKPOINT_MOST, round(CHECKPOINT_SHARE * steps)))

    def check_chunked(self, what: str) -> None:
        """Refuse the settings of jobs of steps for a job of chunks (`what`), which has no state to train."""
        if self.checkpoint_every is not None or self.device is not None:
            raise ResidError(f"This job ({what}) has no steps and no state to train: Execution's checkpoint_every and "
                             "device are for training (dictionaries, tuned lenses); drop them.")

    @property
    def shows_progress(self) -> bool:
        """Whether to draw a progress bar: as asked, or, by default, when stderr is a terminal."""
        return shows(self.progress)

    @property
    def path(self) -> Path | None:
        return None if self.out is None else Path(self.out)

    def runner(self) -> tuple[Executor, bool]:
        """(the executor that runs the job, whether this call made it and so the job must close it when done):
        a new InProcess for None or "inprocess", a new RayExecutor(workers) for "ray", an Executor object as given."""
        executor, workers = self.executor, self.workers
        if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
            raise ResidError(f"workers must be a positive integer, got {workers!r}.")
        if isinstance(executor, Executor):
            if workers is not None:
                raise ResidError("workers= goes with executor='ray'; an executor object already has its workers "
                                 "(e.g. RayExecutor(workers=2)): drop workers=.")
            return executor, False
        if executor is None or executor == "inprocess":
            if workers is not None:
                raise ResidError(f"workers={workers} needs executor='ray' (the in-process executor is one worker).")
            return InProcess(), True
        if executor == "ray":
            return RayExecutor(workers=workers), True
        raise ResidError(
            f"Unknown executor {executor!r}: use None (in process), 'ray' (with workers=N), or an executor object "
            "such as resid.analyses.distributed.RayExecutor(workers=2, address=...)."
        )

    @contextmanager
    def started(self) -> Iterator["Execution"]:
        """This Execution with its executor started: an Executor object, made here once (and closed at the end) where
        `executor` names one, so that every drive of a job of several maps (an attribution graph's rounds, a sweep
        and its reference means) runs on the same workers; the other settings as they are."""
        runner, owned = self.runner()
        try:
            yield dataclasses.replace(self, executor=runner, workers=None)
        finally:
            if owned:
                runner.close()

    def inner(self) -> "Execution":
        """The Execution of a job run within this one's drive (the reference means of a mean-ablation sweep): the
        same executor, batch size and progress; the store at `out` is the outer job's."""
        return dataclasses.replace(self, out=None)


def as_execution(execution: "Execution | None") -> Execution:
    """The value a job was given, or the defaults; anything else is refused by name."""
    if execution is None:
        return Execution()
    if not isinstance(execution, Execution):
        raise ResidError(f"execution= takes a resid.analyses.Execution, got {type(execution).__name__}: e.g. "
                         "Execution(out='results.parquet', executor='ray', workers=2).")
    return execution
