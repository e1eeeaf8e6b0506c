"""The driver of stateful jobs, the sibling of resid.analyses.distributed.driver's `drive`: training a dictionary
or a tuned lens changes one state (weights, optimizer moments) step after step, so the work cannot be cut into
independent chunks; its input can. A `StepJob` says how: plan -> steps fed by chunks -> checkpoint -> finish.

    dictionaries = drive_steps(model, job, Execution(out="runs/sae", executor="ray", workers=2, checkpoint_every=100))

1. resume   with `out`, a StateStore (resid.analyses.io.checkpoints) locks the folder and hands the job the state
            saved there (written with the same settings, or refused); the job restores it, and so knows where its
            input goes on from.
2. feed     the job's `feed` Job computes its input chunk by chunk (a block of activations; a forward batch of
            windows): in process, or on Ray workers, one model each (Executor.stream). Either way the driver gets
            the results in chunk order, so the steps see the same input in the same order whoever computed it.
3. steps    `consume` takes each chunk's result in the driver, where the state lives, and yields after every step
            with that step's statistics, which the progress shows (the driver's one idiom,
            resid.analyses.distributed.progress: a bar, or a line every half minute); the driver writes the state
            every Execution.checkpoint_every steps and at the last one, then tells the job (`stepped`: where a caller's
            on_step runs, after the save).
4. finish   the job's answer, and its files in `out`, written while the lock is still held.

A killed run resumes from its last checkpoint to the state a run never stopped ends with: the chunks are a
function of the job's settings and its position alone.
"""

import abc
import dataclasses
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

from torch import Tensor

from resid.analyses.distributed.execution import Execution
from resid.analyses.distributed.executor import InProcess, Job, Model
from resid.analyses.distributed.progress import meter
from resid.analyses.io.checkpoints import DamagedState, StateStore
from resid.errors import ResidError


class StepJob(abc.ABC):
    """A stateful job run by `drive_steps`; see the module docstring. Its state lives in the driver process only:
    what travels to workers is its `feed`, plain data."""

    name = "job"  # what the progress bar says
    unit = "tok"  # what `step_size` counts
    kind: str  # the checkpoint's format tag (StateStore)
    what: str  # the checkpoint's kind in messages ("training", "tuned-lens")
    steps: int  # steps of a whole run
    step: int  # steps done
    step_size: int  # progress units per step
    shows_progress = False  # set by the driver: whether its bar shows (a feed made in process may show its own)

    @abc.abstractmethod
    def settings(self) -> dict:
        """A JSON-able description of everything that determines the run: a checkpoint resumes only with an
        equal one."""

    def older_settings(self) -> list[dict]:
        """The same run's settings as earlier versions of resid wrote them: their checkpoints resume too."""
        return []

    @abc.abstractmethod
    def restore(self, tensors: dict[str, Tensor], metadata: dict[str, str]) -> None:
        """Take up the state `state()` saved (the step it reached, where its input was); a state that does not fit
        the run (a missing tensor, another shape, a step that is not a count) raises checkpoints.DamagedState."""

    @abc.abstractmethod
    def state(self) -> tuple[dict[str, Tensor], dict[str, str]]:
        """(tensors, string metadata): everything a resumed run needs; a ResidError naming the tensor if any of it
        is not finite (the store then keeps the last good checkpoint)."""

    @abc.abstractmethod
    def feed(self, remote: bool) -> Job:
        """The Job whose chunks are this job's input (remote: it runs on other workers, which send their results
        back on the CPU)."""

    @abc.abstractmethod
    def chunks(self) -> Iterable[object]:
        """The chunks still to compute, from the restored position on, in the order the steps take them (may be
        endless: the driver stops asking once the steps are done)."""

    @abc.abstractmethod
    def consume(self, result: object) -> Iterator[dict[str, str]]:
        """Steps on one chunk's result (none, one or several), yielding after each step the statistics the bar
        shows."""

    def stepped(self) -> None:
        """Called after each step once its checkpoint (if due) is written."""

    @abc.abstractmethod
    def finish(self, out: Path | None) -> object:
        """The answer, and its files in `out` (None: none)."""


def drive_steps(model: Model, job: StepJob, execution: Execution) -> object:
    """Run `job` on `model` as `execution` says (see the module docstring): its chunks on the executor, a checkpoint
    in `execution.out` every execution.checkpoint_steps(job.steps) steps and at the end (resumed from when there), a
    bar if it shows progress. Its batch size and device are the job's own business: it was made with them."""
    checkpoint_every = execution.checkpoint_steps(job.steps)
    runner, owned = execution.runner()
    store = None
    try:
        if execution.out is not None:
            store = StateStore(execution.out, job.kind, job.what, job.settings(), job.older_settings())
            saved = store.load()
            if saved is not None:
                try:
                    job.restore(*saved)
                except DamagedState as error:  # the job says what does not fit; the store names the file
                    raise store.damaged(str(error)) from None
        remote = not isinstance(runner, InProcess)
        job.shows_progress = execution.shows_progress
        with meter(execution.progress, job.steps * job.step_size, job.name, job.unit, initial=job.step * job.step_size,
                   unit_scale=True) as bar:
            if job.step < job.steps:
                # in process nothing runs ahead; on Ray every worker works on a chunk while the steps run
                results = runner.stream(model, job.feed(remote), job.chunks(), runner.workers if remote else 1)
                try:
                    for result in results:
                        for postfix in job.consume(result):
                            bar.update(job.step_size)
                            bar.set_postfix(postfix)
                            if store is not None and (job.step % checkpoint_every == 0 or job.step == job.steps):
                                store.save(*job.state())
                            job.stepped()
                        del result  # not held while the next chunk is computed (a block can be gigabytes)
                        if job.step >= job.steps:
                            break
                finally:
                    results.close()
        return job.finish(execution.path)
    finally:
        if store is not None:
            store.close()
        if owned:
            runner.close()


def older_arguments(execution: Execution, what: str, **given: object) -> Execution:
    """`execution` with the settings a training function took as its own arguments before they moved into
    Execution (`given`: checkpoint_every, device as the call gave them; None: not given): taken for one release,
    with a DeprecationWarning; a setting given in both places is refused."""
    given = {name: value for name, value in given.items() if value is not None}
    if not given:
        return execution
    twice = [name for name in given if getattr(execution, name) is not None]
    if twice:
        raise ResidError(f"{what} was given {twice[0]}= and an Execution with {twice[0]}: give it once, in the "
                         "Execution.")
    settings = ", ".join(f"{name}=..." for name in given)
    warnings.warn(f"{what}(..., {settings}) is deprecated and goes in the next release: pass "
                  f"execution=Execution(..., {settings}) instead.", DeprecationWarning, stacklevel=3)
    return dataclasses.replace(execution, **given)
