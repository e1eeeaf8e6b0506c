"""Circuits measured in the real model: every edge outside the circuit patched to its reference (each pair's corrupt
run, or the mean), exactly, several circuits in one batched forward pass (resid.analyses.circuits.patched).

MIB's circuit-localization metrics (Mueller et al. 2025), over a list of circuit sizes (fractions of the edges,
by default MIB's 0.1% .. 100%):

    faithfulness f(C) = (m(C) - m(empty)) / (m(model) - m(empty))     the metric m averaged over the pairs first
    CPR = area under f over the edge fraction (trapezoids; higher is better)
    CMD = area under |1 - f| (lower is better)

where m(model) keeps every edge (the clean model) and m(empty) none (the corrupt one). Necessity patches the
circuit's own edges instead (the rest of the model clean): necessity = 1 - f(model without C). A set of nodes
(heads and MLPs) is the circuit of every edge out of them (EdgeGraph.node_mask). Encoder-decoder models take
source= and corrupt_source= (resid.analyses.circuits.seq2seq), in process.
"""

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from resid.analyses.checks import check_choice
from resid.analyses.circuits import selection
from resid.analyses.circuits.exact import (
    DIFFERENCES_PER_FORWARD,
    REFERENCES,
    ROWS_PER_FORWARD,
    difference_elements,
)
from resid.analyses.circuits.graph import EdgeGraph
from resid.analyses.circuits.inputs import CircuitPairs, PairsJob, measure, pairs_of
from resid.analyses.circuits.prefix import SharedPrefix
from resid.analyses.circuits.scores import batch_tensors, matrix
from resid.analyses.circuits.seq2seq import (
    Graph,
    Model,
    decoder,
    graph_of,
    last_logits,
    logits_with,
    mean_writes,
    rows,
    writes_of,
)
from resid.analyses.circuits.terms import live
from resid.analyses.distributed.driver import drive
from resid.analyses.distributed.execution import Execution, as_execution
from resid.analyses.inputs import batch_size_for
from resid.analyses.sweeps.seq2seq import in_process
from resid.errors import ResidError
from resid.model import Inputs
from resid.seq2seq import EncoderDecoder
from resid.sites import Site

MIB_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
COLUMNS = ["circuit", "edges", "metric_value", "faithfulness", "model_metric", "empty_metric", "metric"]


@dataclass
class CircuitsJob(PairsJob):
    """Each pair's metric under each circuit (plus the model and the empty circuit, last), rows (pair, circuit)."""

    circuits: list = field(default_factory=list)  # each circuit's edge numbers (EdgeGraph.edges order)
    reference: str = "corrupt"
    sources: tuple = ()  # encoder-decoders: CircuitPairs.sources

    name = "circuit evaluation"
    key = ("prompt_idx", "circuit")

    def signature(self) -> dict:
        digest = hashlib.sha256(b"".join(np.asarray(c, dtype=np.int64).tobytes() + b"|" for c in self.circuits))
        return {"analysis": "circuits.evaluate", "circuits": digest.hexdigest(), "reference": self.reference,
                **super().signature()}

    def rows(self, model: Model, pairs, indices: list[int]) -> pd.DataFrame:
        graph = graph_of(model)
        clean, corrupt, t, b = batch_tensors(model, pairs, indices, self)
        values = circuit_values(model, graph, clean, corrupt, t, b, self.metric,
                                [_mask(graph, c) for c in self.circuits], self.reference)  # [circuit n]
        n_circuits = values.shape[0]
        flat = values.double().cpu().numpy()
        return pd.DataFrame({"prompt_idx": np.tile(np.asarray(indices), n_circuits),
                             "circuit": np.repeat(np.arange(n_circuits), len(indices)), "value": flat.ravel()})


def _mask(graph: Graph, numbers: np.ndarray) -> Bool[Tensor, "writer reader"]:
    writers, readers = graph.edges
    mask = graph.empty()
    mask[torch.as_tensor(writers[numbers]), torch.as_tensor(readers[numbers])] = True
    return mask


def _numbers(graph: Graph, mask: Tensor) -> np.ndarray:
    writers, readers = graph.edges
    return np.flatnonzero(mask.cpu().numpy()[writers, readers]).astype(np.int64)


def circuit_values(model: Model, graph: Graph, clean, corrupt, targets, baselines, metric,
                   masks: Sequence[Tensor], reference: str = "corrupt") -> Float[Tensor, "circuit n"]:
    """Each pair's metric with only the edges of each mask kept (the rest patched to the reference), then with
    every edge kept (the model) and none (the empty circuit): [len(masks) + 2, n], as many circuits per forward
    pass as ROWS_PER_FORWARD rows allow. clean, corrupt: Tokens, or an encoder-decoder's (source, target). Each
    distinct mask is run once; the model (and every mask of every edge) is the clean run, and the empty circuit
    with the corrupt reference the corrupt run (the patched pass equals them: tests/analyses/test_circuits.py,
    test_circuits_seq2seq.py), which cost no patched rows."""
    prefix = SharedPrefix.of(model, clean, corrupt, reference)
    writes = writes_of(model, corrupt, prefix=prefix)
    empty_logits = (writes[1] if isinstance(writes, tuple) else writes).logits if reference == "corrupt" else None
    if reference == "mean":
        writes = mean_writes(corrupt, writes)
    clean_logits = last_logits(model, clean, prefix)
    n = rows(clean)

    def values_of(logits: Tensor, c: int) -> Tensor:  # logits [c * n d_vocab] -> [c n]
        repeated = lambda x: None if x is None else x.repeat(c)  # noqa: E731
        return measure(metric, logits, repeated(targets), repeated(baselines),
                       clean_logits.repeat(c, 1) if metric == "kl" else None).view(c, n)

    every = [*(m.cpu().bool() for m in masks), graph.full(), graph.empty()]
    known = {graph.full().numpy().tobytes(): values_of(clean_logits, 1)[0]}
    if empty_logits is not None:
        known[graph.empty().numpy().tobytes()] = values_of(empty_logits, 1)[0]
    keys = [m.numpy().tobytes() for m in every]
    to_run = list(dict.fromkeys(key for key in keys if key not in known))  # distinct, in order
    mask_of = dict(zip(keys, every))
    reads, computed = (False, False) if isinstance(writes, tuple) else (writes.reads, writes.computed)
    for block in _forwards([mask_of[key] for key in to_run], graph, reads, computed, n,
                           difference_elements(model, clean, prefix)):
        block = [to_run[i] for i in block]
        keep = torch.stack([mask_of[key].float() for key in block]).to(model.device)
        logits = logits_with(model, graph, clean, writes, keep, prefix)
        known.update(zip(block, values_of(logits.flatten(0, 1), len(block))))
    return torch.stack([known[key] for key in keys])


def _forwards(masks: list[Tensor], graph: Graph, reads: bool, computed: bool, n: int, elements: int
              ) -> list[list[int]]:
    """Consecutive circuits run together, as patched.EdgePass will run them: of one form (fewer kept edges than
    patched, where the reference holds its reads, or not), within ROWS_PER_FORWARD rows and DIFFERENCES_PER_FORWARD
    elements of the writers' differences (a pass keeps the difference of every writer with a term in some circuit
    at every row, `elements` per writer: n pairs x positions x d_model, and reads it for every reader, so a pass of
    several large circuits costs more than each alone), and only where one pass of the block and the next circuit
    computes no more than their two passes would: a pass computes the sublayers where some circuit has a term (the
    second form skips the others, where the reference is a run: `computed`), each for every row, and reads each
    one's weights once."""
    valid = graph.valid.numpy()
    sublayers = _sublayers(graph) if isinstance(graph, EdgeGraph) else [slice(0, 0)]  # (encoder-decoders: all run)
    every = set(range(len(sublayers)))
    forms, sizes, touched = [], [], []
    for mask in masks:
        m = mask.numpy() & valid
        small = reads and int(m.sum()) < int((valid & ~m).sum())
        terms = m if small else valid & ~m
        forms.append(small)
        sizes.append(elements * max(1, int(terms.any(1).sum())))
        if small and computed:
            has = live(graph, terms).any(0)
            touched.append({i for i, readers in enumerate(sublayers) if has[readers].any()})
        else:
            touched.append(every)
    per_forward = max(1, ROWS_PER_FORWARD // n)
    blocks: list[list[int]] = []
    computes: set[int] = set()
    for i, (form, size) in enumerate(zip(forms, sizes)):
        last = blocks[-1] if blocks else None
        union = computes | touched[i]
        if (last is None or forms[last[0]] != form or len(last) >= per_forward
                or sum(sizes[j] for j in last) + size > DIFFERENCES_PER_FORWARD
                or len(union) * (len(last) + 2) > len(computes) * (len(last) + 1) + 2 * len(touched[i])):
            blocks.append([i])
            computes = set(touched[i])
        else:
            last.append(i)
            computes = union
    return blocks


def _sublayers(graph: EdgeGraph) -> list[slice]:
    """The readers of each sublayer of a decoder's graph: every layer's attention (q, k, v or q, kv), its MLP."""
    return [s for layer in range(graph.n_layers) for s in (graph.attn_readers(layer), graph.reader_slice(layer, "mlp"))]


def evaluate(
    model: Model,
    clean: Inputs,
    corrupt: Inputs,
    targets: Sequence[str | int] | str | int,
    circuits: Sequence[Tensor] | Tensor,
    baselines: Sequence[str | int] | str | int | None = None,
    metric: str | Callable | None = None,
    reference: str = "corrupt",
    execution: Execution | None = None,
    source: Inputs | None = None,
    corrupt_source: Inputs | None = None,
) -> pd.DataFrame:
    """Each circuit ([writer reader] bool masks, or a [circuit writer reader] tensor) measured over the pairs: one
    row per circuit with its edge count, the mean metric, its faithfulness, the model's and the empty circuit's
    mean metric. source, corrupt_source: an encoder-decoder model's (resid.analyses.circuits.exact)."""
    check_choice(reference, "reference", REFERENCES)
    graph = graph_of(model)
    pairs = pairs_of(model, clean, corrupt, targets, baselines, metric, source, corrupt_source)
    masks = list(circuits)
    for mask in masks:
        if tuple(mask.shape) != tuple(graph.valid.shape):
            raise ResidError(f"A circuit is a [writer reader] mask of shape {tuple(graph.valid.shape)} (EdgeGraph); "
                             f"got {tuple(mask.shape)}.")
    return _evaluate(model, graph, pairs, [m.bool().cpu() & graph.valid for m in masks], reference,
                     as_execution(execution))


def _evaluate(model: Model, graph: Graph, pairs: CircuitPairs, masks: list[Tensor], reference: str,
              execution: Execution) -> pd.DataFrame:
    if isinstance(model, EncoderDecoder):
        in_process(execution.executor)
    size = batch_size_for(decoder(model), pairs.pairs.clean.tokens, execution.batch_size)
    job = CircuitsJob.of(pairs.pairs, "clean", pairs.targets, pairs.baselines, pairs.metric, size.value,
                         dict(metric=pairs.label), circuits=[_numbers(graph, m) for m in masks], reference=reference,
                         sources=pairs.sources)
    rows = drive(model, job, execution)
    means = rows.groupby("circuit")["value"].mean().sort_index().to_numpy()
    model_value, empty_value = means[-2], means[-1]
    span = model_value - empty_value
    values = means[:-2]
    return pd.DataFrame({
        "circuit": np.arange(len(masks)), "edges": [int(m.sum()) for m in masks], "metric_value": values,
        "faithfulness": (values - empty_value) / span if span != 0 else np.full(len(values), np.nan),
        "model_metric": model_value, "empty_metric": empty_value, "metric": pairs.label,
    })[COLUMNS]


def faithfulness_curve(
    model: Model,
    clean: Inputs,
    corrupt: Inputs,
    targets: Sequence[str | int] | str | int,
    scores: pd.DataFrame,
    baselines: Sequence[str | int] | str | int | None = None,
    metric: str | Callable | None = None,
    fractions: Sequence[float] = MIB_FRACTIONS,
    absolute: bool = True,
    prune: bool = True,
    reference: str = "corrupt",
    execution: Execution | None = None,
    source: Inputs | None = None,
    corrupt_source: Inputs | None = None,
) -> pd.DataFrame:
    """The faithfulness of the top-k circuits of an edge table (eap, eap_ig, exact), k = each fraction of the
    edges (rounded down, as MIB does), pruned: one row per fraction (`fraction`, `k`, and evaluate's columns);
    cpr(curve) and cmd(curve) summarize it. source, corrupt_source: an encoder-decoder model's."""
    check_choice(reference, "reference", REFERENCES)
    graph = graph_of(model)
    fractions = [float(f) for f in fractions]
    if not fractions or any(not 0 < f <= 1 for f in fractions) or sorted(fractions) != fractions:
        raise ResidError(f"fractions must be increasing fractions of the edges in (0, 1], got {fractions!r}.")
    pairs = pairs_of(model, clean, corrupt, targets, baselines, metric, source, corrupt_source)
    s = matrix(graph, scores)
    ks = [int(f * graph.n_edges) for f in fractions]
    masks = selection.top_ks(graph, s, ks, absolute, prune)
    df = _evaluate(model, graph, pairs, masks, reference, as_execution(execution))
    df.insert(1, "fraction", fractions)
    df.insert(2, "k", ks)
    df["method"] = scores["method"].iloc[0] if "method" in scores and len(scores) else "custom"
    return df


def cpr(curve: pd.DataFrame) -> float:
    """MIB's CPR: the area under the faithfulness curve over the edge fraction (trapezoids)."""
    return _area(curve, lambda f: f)


def cmd(curve: pd.DataFrame) -> float:
    """MIB's CMD: the area between the faithfulness curve and 1 over the edge fraction (trapezoids)."""
    return _area(curve, lambda f: np.abs(1.0 - f))


def _area(curve: pd.DataFrame, of: Callable[[np.ndarray], np.ndarray]) -> float:
    x = curve["fraction"].to_numpy(dtype=float)
    y = of(curve["faithfulness"].to_numpy(dtype=float))
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))


def necessity_sufficiency(
    model: Model,
    clean: Inputs,
    corrupt: Inputs,
    targets: Sequence[str | int] | str | int,
    circuit: Tensor | Sequence[Site],
    baselines: Sequence[str | int] | str | int | None = None,
    metric: str | Callable | None = None,
    reference: str = "corrupt",
    execution: Execution | None = None,
    source: Inputs | None = None,
    corrupt_source: Inputs | None = None,
) -> pd.DataFrame:
    """One row: the circuit's sufficiency (its faithfulness, everything else patched) and necessity (1 - the
    faithfulness of the model with the circuit's own edges patched). `circuit`: a [writer reader] mask, or a set
    of nodes (head and MLP Sites: every edge out of them)."""
    graph = graph_of(model)
    mask = circuit if isinstance(circuit, Tensor) else graph.node_mask(circuit)
    mask = mask.bool().cpu() & graph.valid
    df = evaluate(model, clean, corrupt, targets, [mask, graph.valid & ~mask], baselines, metric, reference,
                  execution, source, corrupt_source)
    return pd.DataFrame({"edges": [int(mask.sum())], "sufficiency": [df["faithfulness"].iloc[0]],
                         "necessity": [1.0 - df["faithfulness"].iloc[1]],
                         "model_metric": [df["model_metric"].iloc[0]], "empty_metric": [df["empty_metric"].iloc[0]],
                         "metric": [df["metric"].iloc[0]]})
