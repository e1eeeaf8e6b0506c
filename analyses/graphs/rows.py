"""Where an attribution graph's rows are computed: in this process, or on an executor's workers (Ray actors, one
model each), batch by batch, with the same results.

    batch      the targets of one backward sweep (a chunk of the driver, resid.analyses.distributed): logit nodes
               (their read-out vectors) or active features (their indices in Replacement.features)
    RowJob     the graph's sweeps as a Job: a worker's state is the prompt's Replacement and Sweeper, built once
               from its own model (`replace` run again there on the job's token ids and transcoders: the same
               numbers as the driver's to float32 rounding, and the same active features, which it checks), and
               a chunk's result is that batch's rows [b n_sources]
    RowSweeps  the driver's side: batches of rows, computed with its own Sweeper in process (the loop of one
               sweep per batch, nothing set up twice), or mapped over the executor, results by batch index

The batches are cut on the driver, the same whoever computes them, so a graph built on workers equals the one built
in process to float32 rounding (a worker's BLAS may sum in another order). The job carries plain data: token ids,
the checked transcoders (a dictionary's weights travel as job data) and the driver's active features; never the
model's weights. It keeps its `session` for the whole graph, so a worker sets up once and keeps its state through
every round of max_feature_nodes (each round one map over the executor).
"""

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from jaxtyping import Float, Int
from torch import Tensor

from resid.analyses.distributed.executor import Executor, Job
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
    """An attribution graph's backward sweeps as a Job (see the module docstring): chunks are Batches, results
    their rows on the CPU."""

    token_ids: Tensor  # [pos]: the prompt as the driver's replace tokenized it
    transcoders: tuple  # the checked per-layer transcoders in layer order, or (the cross-layer transcoder,)
    skip_bos: bool  # as the driver's replace resolved it
    features: Tensor  # [n 3]: the driver's active features (layer, position, feature), which a worker must find
    model_name: str
    session: str = field(default_factory=lambda: uuid.uuid4().hex)  # one graph: a worker's state serves it whole

    name = "graph rows"
    unit = "target"

    @classmethod
    def of(cls, model, rep: Replacement) -> "RowJob":
        return cls(rep.token_ids.cpu(), rep.transcoders.dictionaries, rep.skip_bos, rep.features.cpu(), model.name)

    def size(self, batch: Batch) -> int:
        return len(batch)

    def setup(self, model) -> tuple[Replacement, Sweeper]:
        rep = replace(model, self.token_ids.to(model.device), list(on_device(self.transcoders, model)),
                      skip_bos=self.skip_bos)
        if not torch.equal(rep.features.cpu(), self.features):
            raise ResidError(self._different(rep.features.cpu()))
        return rep, Sweeper(rep)

    def run(self, state: tuple[Replacement, Sweeper], batch: Batch) -> Iterator[Tensor]:
        with torch.no_grad():
            yield sweep(*state, batch)

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
    """The driver's side (see the module docstring): `each(batches)` yields (batch index, rows [b n_sources]) as
    they are computed; `all(batches)` returns them in batch order."""

    def __init__(self, model, rep: Replacement, sweeper: Sweeper, executor: Executor | None):
        self.model, self.rep, self.sweeper, self.executor = model, rep, sweeper, executor
        self.job = RowJob.of(model, rep) if executor is not None else None

    def each(self, batches: Sequence[Batch]) -> Iterator[tuple[int, Tensor]]:
        if self.executor is None:  # in order, each computed only when asked for: one batch's rows held at a time
            for index, batch in enumerate(batches):
                yield index, sweep(self.rep, self.sweeper, batch)
            return
        # deepest first (a sweep spans the layers below its highest target), so that no long sweep starts last
        order = sorted(range(len(batches)), key=lambda index: -self.depth(batches[index]))
        for index, rows in self.executor.map(self.model, self.job, [batches[index] for index in order]):
            yield order[index], rows

    def depth(self, batch: Batch) -> int:
        """The highest layer a batch's sweep starts from (a logit node's: n_layers)."""
        if batch.logits is not None or not len(batch):
            return self.rep.n_layers
        return int(self.rep.features[batch.features, 0].max())

    def all(self, batches: Sequence[Batch]) -> list[Tensor]:
        found: list = [None] * len(batches)
        for index, rows in self.each(batches):
            found[index] = rows
        return found


def feature_batches(index: Int[Tensor, "n"], batch_size: int) -> list[Batch]:
    """Feature indices cut into Batches of at most batch_size targets, in the given order."""
    return [Batch(features=chunk) for chunk in index.split(batch_size)]
