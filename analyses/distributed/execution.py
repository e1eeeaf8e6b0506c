"""How a long job runs, as one value: every long job (sweeps, patching, scans, means, training, lens training,
evaluations, the graph's backward sweeps) takes `execution: Execution | None = None` with the same five settings,
names, types and defaults (None: Execution(), every default).

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

The values are checked when the job starts (resid.analyses.distributed.executor.resolve for the executor).
"""

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from resid.analyses.distributed.executor import Executor
from resid.errors import ResidError


@dataclass(frozen=True)
class Execution:
    """How a long job runs; see the module docstring."""

    executor: Executor | str | None = None
    workers: int | None = None
    batch_size: int | str = "auto"
    progress: bool | None = None
    out: str | os.PathLike | None = None

    def __post_init__(self) -> None:
        size = self.batch_size
        if size != "auto" and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ResidError(f"Execution(batch_size={size!r}): give a positive whole number of prompts per forward "
                             "pass, or 'auto'.")
        if self.progress is not None and not isinstance(self.progress, bool):
            raise ResidError(f"Execution(progress={self.progress!r}): True, False, or None (a bar on a terminal).")
        if self.out is not None and not isinstance(self.out, (str, os.PathLike)):
            raise ResidError(f"Execution(out={self.out!r}): a file or folder path, or None.")

    @property
    def shows_progress(self) -> bool:
        """Whether to draw a progress bar: as asked, or, by default, when stderr is a terminal."""
        if self.progress is not None:
            return self.progress
        stream = sys.stderr
        return bool(getattr(stream, "isatty", None) and stream.isatty())

    @property
    def path(self) -> Path | None:
        return None if self.out is None else Path(self.out)


def as_execution(execution: "Execution | None") -> Execution:
    """The value a job was given, or the defaults; anything else is refused by name."""
    if execution is None:
        return Execution()
    if not isinstance(execution, Execution):
        raise ResidError(f"execution= takes a resid.analyses.Execution, got {type(execution).__name__}: e.g. "
                         "Execution(out='results.parquet', executor='ray', workers=2).")
    return execution
