"""Where an attribution graph's rows are computed: a Job of the one driver (resid.analyses.distributed.driver), in
this process or on an executor's workers (Ray actors, one model each), batch by batch, with the same results.

    batch      the targets of one backward sweep (a chunk of the driver): logit nodes (their read-out vectors) or
               active features (their indices in Replacement.features)
    RowJob     the graph's sweeps as a Job: a worker's state is the prompt's Replacement and Sweeper, built once
               from its own model (`replace` run again there on the job's token ids and transcoders: the same
               numbers as the driver's to float32 rounding, and the same active features, which it checks), and
               a chunk's result is that batch's rows [b n_sources]; in process the state is the driver's own
               (`local`: nothing set up twice, and never sent to a worker)
    RowSweeps  the driver's side: each round of batches is one drive of the job on the graph's started Execution
               (its executor, its progress), each batch's rows handed over as they arrive

The batches are cut on the driver, the same whoever computes them, so a graph built on workers equals the one built
in process to float32 rounding (a worker's BLAS may sum in another order). The job carries plain data: token ids,
the checked transcoders (a dictionary's weights travel as job data) and the driver's active features; never the
model's weights. It keeps its `session` for the whole graph, so a worker sets up once and keeps its state through
every round of max_feature_nodes (each round one drive).
"""

import dataclasses
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from jaxtyping import Float, Int
from torch import Tensor

from resid.analyses.distributed.driver import drive
from resid.analyses.distributed.execution import Execution
from resid.analyses.distributed.executor import Job
from resid.analyses.graphs.edges import Sweeper, Targets
from resid.analyses.graphs.replacement import Replacement, replace
from resid.dictionaries.check import on_device
from resid.errors import ResidError
from resid.sites import Site


@dataclass(frozen=True)
class Batch:
    """The targets of one backward sweep: logit nodes (`logits`, their read-out vectors after the final norm) or
    active features (`features`, their indices in Replacement.features); exactly one of the two."""

    logits: Tensor | None = None  # [k d_model]
    features: Tensor | None = None  # [b]

    def __len__(self) -> int:
        return len(self.logits if self.logits is not None else self.features)


def sweep(rep: Replacement, sweeper: Sweeper, batch: Batch) -> Float[Tensor, "b n_sources"]:
    """The rows of `batch`'s targets (one backward sweep)."""
    if batch.logits is not None:
        vectors = batch.logits.to(rep.embed.device)
        k = len(vectors)
        return sweeper.sweep(Targets(torch.full((k,), rep.n_layers), torch.full((k,), rep.n_pos - 1), vectors))
    features = rep.features[batch.features]  # [b 3] (layer, position, feature): the graph's bookkeeping, on the CPU
    vectors = torch.zeros(len(features), rep.inputs[0].shape[-1], device=rep.embed.device)
    by_layer: dict[int, list[int]] = {}
    for i, l in enumerate(features[:, 0].tolist()):  # once per batch: the rows of each layer, on the host
        by_layer.setdefault(l, []).append(i)
    for l, here in by_layer.items():
        here = torch.tensor(here)
        vectors[here.to(vectors.device)] = rep.transcoders.encoder(l, features[here, 2])
    return sweeper.sweep(Targets(features[:, 0], features[:, 1], vectors))


@dataclass
class RowJob(Job):
    """An attribution graph's backward sweeps as a Job (see the module docstring): chunks are (index, Batch) pairs,
    results their rows on the CPU (in process: on the model's device)."""

    token_ids: Tensor  # [pos]: the prompt as the driver's replace tokenized it
    transcoders: tuple  # the checked per-layer transcoders in layer order, or (the cross-layer transcoder,)
    skip_bos: bool  # as the driver's replace resolved it
    features: Tensor  # [n 3]: the driver's active features (layer, position, feature), which a worker must find
    model_name: str
    session: str = field(default_factory=lambda: uuid.uuid4().hex)  # one graph: a worker's state serves it whole
    batches: list = field(default_factory=list, repr=False)  # this drive's Batches (they travel with their chunks)
    # the driver's own (Replacement, Sweeper): the state in process, never pickled for a worker
    local: tuple | None = field(default=None, repr=False, compare=False)

    name = "graph rows"
    unit = "target"

    @classmethod
    def of(cls, model, rep: Replacement, local: tuple | None = None) -> "RowJob":
        return cls(rep.token_ids.cpu(), plain_transcoders(rep), rep.skip_bos, rep.features.cpu(), model.name,
                   local=local)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "local": None}  # a worker builds its own state from the plain data

    def plan(self, done: set, workers: int | None, per_worker: int) -> list[tuple[int, Batch]]:
        """The batches with their indices: in order in process (each computed when the driver asks for it, one
        batch's rows held at a time); deepest first on workers, so that no long sweep starts last."""
        planned, self.batches = list(enumerate(self.batches)), []  # the batches travel with their chunks
        return planned if workers is None else sorted(planned, key=lambda chunk: -self.depth(chunk[1]))

    def depth(self, batch: Batch) -> float:
        """The highest layer a batch's sweep starts from (a sweep spans the layers below its highest target; a logit
        node's is above every layer)."""
        if batch.logits is not None or not len(batch):
            return float("inf")
        return float(self.features[batch.features, 0].max())

    def size(self, chunk: tuple[int, Batch]) -> int:
        return len(chunk[1])

    def setup(self, model) -> tuple[Replacement, Sweeper]:
        if self.local is not None:
            return self.local
        rep = replace(model, self.token_ids.to(model.device), list(on_device(self.transcoders, model)),
                      skip_bos=self.skip_bos)
        if not torch.equal(rep.features.cpu(), self.features):
            raise ResidError(self._different(rep.features.cpu()))
        return rep, Sweeper(rep)

    def run(self, state: tuple[Replacement, Sweeper], chunk: tuple[int, Batch]) -> Iterator[Tensor]:
        with torch.no_grad():
            yield sweep(*state, chunk[1])

    def combine(self, pieces: list) -> Tensor:
        return pieces[0]

    def _different(self, found: Tensor) -> str:
        """The message for a worker whose replacement run finds other active features than the driver's."""
        mine, theirs = {tuple(f) for f in found.tolist()}, {tuple(f) for f in self.features.tolist()}
        odd = sorted(mine ^ theirs)
        layer, position, feature = odd[0] if odd else self.features[0].tolist()
        where = Site(layer, "mlp", feature=feature, positions=(position,)).label
        return (f"A worker's replacement run of {self.model_name} finds {len(found)} active features, the driver's "
                f"{len(self.features)} (first difference: {where}): a pre-activation at the firing threshold "
                "rounds differently on the worker's device or threads, so the two graphs would have different "
                "nodes. Build this graph in process (leave executor= unset), or on workers of the driver's device "
                "kind.")


class RowSweeps:
    """The driver's side (see the module docstring): `each(batches, take)` hands each batch's rows [b n_sources] to
    take(batch index, rows) as they are computed; `all(batches)` returns them in batch order. `execution` is the
    graph's, started (Execution.started: every round on the same workers)."""

    def __init__(self, model, rep: Replacement, sweeper: Sweeper, execution: Execution):
        self.model, self.rep, self.sweeper, self.execution = model, rep, sweeper, execution
        self.job = RowJob.of(model, rep, local=(rep, sweeper))

    def each(self, batches: Sequence[Batch], take: Callable[[int, Tensor], None]) -> None:
        job = dataclasses.replace(self.job, batches=list(batches))  # the same session: a worker keeps its state
        drive(self.model, job, self.execution, take=lambda chunk, rows: take(chunk[0], rows))

    def all(self, batches: Sequence[Batch]) -> list[Tensor]:
        found: list = [None] * len(batches)
        self.each(batches, found.__setitem__)
        return found


def plain_transcoders(rep: Replacement) -> tuple:
    """The replacement's checked transcoders as a job carries them to a worker: the per-layer ones in layer order,
    or (the cross-layer transcoder,) (the transcoder protocol's dictionaries)."""
    return tuple(rep.transcoders.dictionaries)


def feature_batches(index: Int[Tensor, "n"], batch_size: int) -> list[Batch]:
    """Feature indices cut into Batches of at most batch_size targets, in the given order."""
    return [Batch(features=chunk) for chunk in index.split(batch_size)]
