"""Exact edge patching: each edge patched alone to its reference (corrupt, or mean) value, the rest of the model
clean, the ground truth EAP and EAP-IG estimate,

    score(w, r) = metric(clean run with reader r reading writer w's reference output) - metric(clean run)

batched: one forward pass runs `batch` rows, each a (edge, pair) (resid.analyses.circuits.patched: keep is 1 on
every edge but one). It costs a forward pass per edge and pair: affordable on small models, or on the edges
`edges` names (e.g. EAP's top few hundred). Encoder-decoder models too (source=, corrupt_source=: resid.analyses.
circuits.seq2seq), in process.
"""

import math
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from resid.analyses.checks import check_choice
from resid.analyses.circuits.inputs import measure, pairs_of
from resid.analyses.circuits.prefix import SharedPrefix
from resid.analyses.circuits.scores import batch_tensors, edge_scores
from resid.analyses.circuits.seq2seq import (
    Graph,
    Model,
    decoder,
    graph_of,
    last_logits,
    logits_with,
    rows,
    writes_of,
)
from resid.analyses.distributed.execution import Execution, as_execution
from resid.analyses.sweeps.seq2seq import in_process
from resid.model import Inputs
from resid.seq2seq import EncoderDecoder
from resid.sites import Site

REFERENCES = ("corrupt", "mean")
ROWS_PER_FORWARD = 256  # (edge, pair) rows of one patched forward pass
# elements of the writers' differences one patched pass keeps (fp32: 64 MiB): each writer with a term keeps its
# difference at every row of the pass, so this bounds how many circuits (edges) run together
DIFFERENCES_PER_FORWARD = 1 << 24


def exact(
    model: Model,
    clean: Inputs,
    corrupt: Inputs,
    targets: Sequence[str | int] | str | int,
    baselines: Sequence[str | int] | str | int | None = None,
    metric: str | Callable | None = None,
    edges: Sequence[tuple[Site | str, Site | str]] | None = None,
    reference: str = "corrupt",
    execution: Execution | None = None,
    source: Inputs | None = None,
    corrupt_source: Inputs | None = None,
) -> pd.DataFrame:
    """The exact patching effect of every edge (or of `edges`, (writer, reader) Sites or labels), the mean over
    the pairs: the table of resid.analyses.circuits.eap.eap (edges not measured have score NaN). reference:
    "corrupt" (each pair's corrupt run) or "mean" (every write averaged over the corrupt prompts' positions of
    the batch). source, corrupt_source: an encoder-decoder model's sources of the clean and corrupt prompts (the
    decoder's target prefixes)."""
    check_choice(reference, "reference", REFERENCES)
    graph = graph_of(model)
    if isinstance(model, EncoderDecoder):
        in_process(as_execution(execution).executor)
    pairs = pairs_of(model, clean, corrupt, targets, baselines, metric, source, corrupt_source)
    chosen = np.arange(graph.n_edges) if edges is None else _edge_numbers(graph, edges)
    options = {"reference": reference, "edges": chosen}
    df = edge_scores(model, pairs, "exact", _batch_scores(chosen, reference), options, as_execution(execution),
                     backward=False)
    if edges is not None:
        measured = np.zeros(graph.n_edges, dtype=bool)
        measured[chosen] = True
        df.loc[~measured, ["score", "abs_score"]] = np.nan
    return df


def difference_elements(model: Model, clean, prefix: SharedPrefix | None) -> int:
    """The elements of one writer's difference at one circuit's rows of a patched pass: the pairs x the positions
    it runs (after the prefix) x d_model. clean: Tokens, or an encoder-decoder's (source, target)."""
    side = clean[1] if isinstance(clean, tuple) else clean
    positions = side.ids.shape[1] - (0 if prefix is None else prefix.start)
    return rows(clean) * positions * decoder(model).config.d_model


def _edge_numbers(graph: Graph, edges) -> np.ndarray:
    number = {(int(w), int(r)): i for i, (w, r) in enumerate(zip(*graph.edges))}
    as_site = lambda s: s if isinstance(s, Site) else Site.parse(s)  # noqa: E731
    return np.array(sorted({number[graph.edge_index(as_site(w), as_site(r))] for w, r in edges}), dtype=np.int64)


def _batch_scores(chosen: np.ndarray, reference: str):
    def batch_scores(model: Model, graph: Graph, pairs, rows: list[int], job) -> Tensor:
        clean, corrupt, t, b = batch_tensors(model, pairs, rows, job)
        return edge_effects(model, graph, clean, corrupt, t, b, job.metric, chosen, reference)
    return batch_scores


def edge_effects(model: Model, graph: Graph, clean, corrupt, targets, baselines, metric,
                 chosen: np.ndarray, reference: str = "corrupt") -> Tensor:
    """The [writer reader] sums over this batch's pairs of metric(edge patched alone) - metric(clean), for the
    edges numbered `chosen` (0 elsewhere). clean, corrupt: Tokens, or an encoder-decoder's (source, target)."""
    prefix = SharedPrefix.of(model, clean, corrupt, reference)
    writes = writes_of(model, corrupt, reference, prefix)
    clean_logits = last_logits(model, clean, prefix)
    clean_value = measure(metric, clean_logits, targets, baselines, clean_logits)
    n = rows(clean)
    # edges in order (a reader's, then the next's): a pass of C edges patches up to C writers, each kept at its
    # C * n rows
    per_forward = max(1, min(ROWS_PER_FORWARD // n,
                             math.isqrt(DIFFERENCES_PER_FORWARD // difference_elements(model, clean, prefix))))
    writers, readers = graph.edges
    scores = torch.zeros(len(graph.writers), len(graph.readers), device=model.device)
    full = graph.valid.float().to(model.device)
    for start in range(0, len(chosen), per_forward):
        block = torch.as_tensor(chosen[start:start + per_forward])
        w, r = torch.as_tensor(writers[block]), torch.as_tensor(readers[block])
        keep = full.expand(len(block), -1, -1).clone()
        keep[torch.arange(len(block)), w, r] = 0.0
        logits = logits_with(model, graph, clean, writes, keep, prefix)  # [edges n d_vocab]
        repeated = lambda x: None if x is None else x.repeat(len(block))  # noqa: E731
        values = measure(metric, logits.flatten(0, 1), repeated(targets), repeated(baselines),
                         clean_logits.repeat(len(block), 1)).view(len(block), n)
        scores[w.to(model.device), r.to(model.device)] = (values - clean_value).sum(1)
    return scores
