"""Edge scores over pairs, run on the one driver (resid.analyses.distributed): every method (EAP, EAP-IG, exact) sums
its [writer reader] scores over a batch of pairs; a chunk of pairs is one stored result (one row per edge, the
chunk's sum), so a run resumes from the chunks it finished and the answer is the mean over pairs, whoever computed
the chunks and however they were batched.

The table: one row per edge, `writer` and `reader` (resid.Site labels), `score` (the mean over pairs of the
estimated or measured change of the metric when the edge alone is patched to the reference, patched - clean),
`abs_score`, `method`, `metric`, `pairs`.
"""

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from resid.analyses.circuits.inputs import CircuitPairs, PairsJob, PromptPairs
from resid.analyses.circuits.seq2seq import Graph, Model, decoder, graph_of, source_tokens
from resid.analyses.distributed.driver import drive
from resid.analyses.distributed.execution import Execution
from resid.analyses.inputs import batch_size_for
from resid.batching import run_batched

COLUMNS = ["writer", "reader", "score", "abs_score", "method", "metric", "pairs"]
# One batch's [writer reader] scores summed over its pairs, from (model, graph, pairs, rows, job)
BatchScores = Callable[..., Float[Tensor, "writer reader"]]


@dataclass
class ScoresJob(PairsJob):
    """The summed edge scores of chunks of pairs: `batch_scores(model, graph, pairs, rows, job)` computes one
    batch's."""

    method: str = "eap"
    options: dict = field(default_factory=dict)  # the method's own settings (steps, on, reference, edges)
    batch_scores: BatchScores | None = None
    sources: tuple = ()  # encoder-decoders: CircuitPairs.sources

    name = "edge scores"
    key = ("chunk", "edge")

    def signature(self) -> dict:
        return {"analysis": f"circuits.{self.method}", "options": _jsonable(self.options), "batch": self.batch,
                **super().signature()}

    def plan(self, done: set, workers: int | None, per_worker: int) -> list[tuple[int, ...]]:
        """Blocks of `batch` consecutive pairs, each named by its first (the same blocks on every executor, so a
        resumed store's finished chunks are skipped whole)."""
        finished = {chunk for chunk, _ in done}
        blocks = [tuple(range(i, min(i + self.batch, len(self.clean)))) for i in range(0, len(self.clean), self.batch)]
        return [block for block in blocks if block[0] not in finished]

    def key_values(self) -> dict:
        return {}

    def run(self, state, chunk: tuple[int, ...]) -> Iterator[pd.DataFrame]:
        model, pairs, size = state
        graph = graph_of(model)
        total = None
        for _, summed in run_batched(list(chunk), lambda rows: self.batch_scores(model, graph, pairs, rows, self),
                                     size):
            total = summed if total is None else total + summed
        writers, readers = graph.edges
        values = total[torch.as_tensor(writers), torch.as_tensor(readers)].double().cpu().numpy()
        yield pd.DataFrame({"chunk": chunk[0], "edge": np.arange(len(writers)),
                            "score_sum": values})

    def finish(self, results: pd.DataFrame | None) -> pd.DataFrame | None:
        return results


def edge_scores(model: Model, pairs: CircuitPairs, method: str, batch_scores: BatchScores, options: dict,
                execution: Execution, backward: bool = True) -> pd.DataFrame:
    """The edge table (see the module docstring) of `method` over every pair."""
    graph = graph_of(model)
    size = batch_size_for(decoder(model), pairs.pairs.clean.tokens, execution.batch_size, backward=backward)
    job = ScoresJob.of(pairs.pairs, "clean", pairs.targets, pairs.baselines, pairs.metric, size.value,
                       dict(metric=pairs.label), method=method, options=options, batch_scores=batch_scores,
                       sources=pairs.sources)
    rows = drive(model, job, execution)
    summed = rows.groupby("edge")["score_sum"].sum().reindex(range(graph.n_edges)).to_numpy()
    return table(graph, summed / len(pairs), method, pairs.label, len(pairs))


def table(graph: Graph, scores: np.ndarray, method: str, metric: str, n_pairs: int) -> pd.DataFrame:
    """One row per edge (in the graph's edge order) with its mean score."""
    writers, readers = graph.edges
    return pd.DataFrame({
        "writer": [graph.writers[w].label for w in writers],
        "reader": [graph.readers[r].label for r in readers],
        "score": scores.astype(float),
        "abs_score": np.abs(scores).astype(float),
        "method": method, "metric": metric, "pairs": n_pairs,
    })[COLUMNS]


def matrix(graph: Graph, df: pd.DataFrame) -> Float[Tensor, "writer reader"]:
    """An edge table's scores as a dense [writer reader] matrix (0 off the edges); the table may hold a subset."""
    writer_index = {site.label: i for i, site in enumerate(graph.writers)}
    reader_index = {site.label: i for i, site in enumerate(graph.readers)}
    out = torch.zeros(len(graph.writers), len(graph.readers), dtype=torch.float64)
    w = torch.tensor(df["writer"].map(writer_index).to_numpy(dtype=np.int64))
    r = torch.tensor(df["reader"].map(reader_index).to_numpy(dtype=np.int64))
    out[w, r] = torch.tensor(df["score"].to_numpy(dtype=np.float64))
    return out


def batch_tensors(model: Model, pairs: PromptPairs, rows: list[int], job: PairsJob) -> tuple:
    """(clean tokens, corrupt tokens, targets, baselines or None) of these pairs, on the model's device; an
    encoder-decoder's clean and corrupt sides are (source, target prefix) Tokens (`job.sources`)."""
    clean, corrupt = pairs.batch("clean", rows).to(model.device), pairs.batch("corrupt", rows).to(model.device)
    t = torch.tensor([job.targets[i] for i in rows], device=model.device)
    b = None if job.baselines is None else torch.tensor([job.baselines[i] for i in rows], device=model.device)
    if getattr(job, "sources", ()):
        clean_ids, corrupt_ids, pad = job.sources
        clean = (source_tokens(clean_ids, rows, pad, model.device), clean)
        corrupt = (source_tokens(corrupt_ids, rows, pad, model.device), corrupt)
    return clean, corrupt, t, b


def _jsonable(options: dict) -> dict:
    """Options for a store's signature: arrays as a digest of their bytes."""
    return {name: hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()
            if isinstance(value, np.ndarray) else value for name, value in options.items()}
