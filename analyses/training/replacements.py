"""How well sets of transcoders replace a model's MLPs, all at once, and how good the attribution graphs they give
are: the comparison of kinds of dictionaries on equal terms (per-layer transcoders, skip transcoders, a cross-layer
transcoder).

    scores = evaluate_replacements(model, {"per-layer": transcoders, "skip": skips, "clt": clt},
                                   corpus.demo(max_documents=200), prompts=["The Eiffel Tower is in the city of"])
    scores.table        one row per replacement (below)
    scores.per_layer    one row per replacement and layer: fvu, l0, dead_fraction, dense_fraction
    scores.graphs       with keep_graphs=True, each replacement's graph of each prompt

A replacement is per-layer transcoders (one per layer, any kind; resid.analyses.graphs.transcoders.Transcoders
checks them) or one cross-layer transcoder. Over the evaluation tokens (the positions `evaluate` uses: padding and,
unless keep_bos, each window's first position left out; per layer, tokens whose MLP write exceeds max_norm_ratio x
the batch's median norm too, and those keep the model's own write in the spliced runs):

    kind                 "per-layer", "skip" (per-layer with a skip path) or "cross-layer"
    features             every layer's features
    tokens               the positions evaluated (layer 0's: each layer leaves out its own outliers)
    fvu                  fraction of variance unexplained, pooled over the layers: sum of every layer's squared
                         error / sum of every layer's variance (per layer in per_layer)
    l0                   active features per token, summed over the layers
    dead_fraction        features that never fire on these tokens
    ce_clean             next-token cross-entropy of the model (nats), at the scored positions
    ce_spliced           ... with every MLP write replaced by its reconstruction at once (each layer's transcoder
                         reads the spliced run's own MLP input, so errors compound as in the replacement model)
    ce_zero_ablated      ... with every MLP write replaced by zeros
    ce_loss_recovered    1 - (ce_spliced - ce_clean) / (ce_zero_ablated - ce_clean)
    kl_spliced           KL(clean || spliced) of the next-token distributions, mean over the scored positions
    replacement_score    mean over `prompts` of the graph's replacement score and ...
    completeness_score   ... completeness score (circuit-tracer's definitions: resid.analyses.graphs.Graph.scores)
    graph_features       mean number of feature nodes of those graphs

The job is a reduction of the driver (resid.analyses.distributed.driver.drive), as `evaluate` is: its chunks are
the forward batches of windows and the prompts (one graph per replacement each), so the table is the same in process
and on Ray workers.
"""

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch
from torch import Tensor

from resid.analyses.corpus_windows import batch_tokens
from resid.analyses.distributed.driver import drive
from resid.analyses.distributed.execution import Execution, as_execution
from resid.analyses.distributed.executor import Job
from resid.analyses.graphs.attribute import attribute
from resid.analyses.graphs.graph import Graph
from resid.analyses.graphs.transcoders import Transcoders
from resid.analyses.io import corpus as corpora
from resid.analyses.io.provenance import describe
from resid.analyses.training.activations import check_ratio, training_positions
from resid.analyses.training.evaluation import Totals, nll, scored_positions, trained_on, window_batches
from resid.analyses.training.splice import splice_at, splice_clt_at
from resid.dictionaries import CrossLayerTranscoder
from resid.dictionaries.check import on_device
from resid.dictionaries.transcoders import MLPTranscoders, replacing_mlps
from resid.errors import ResidError
from resid.model import Transformer


@dataclass
class ReplacementScores:
    table: pd.DataFrame  # one row per replacement
    per_layer: pd.DataFrame  # one row per replacement and layer
    graphs: dict[str, list[Graph]] = field(default_factory=dict)  # keep_graphs: per replacement, one per prompt


def evaluate_replacements(
    model: Transformer,
    replacements: Mapping[str, object],
    corpus: corpora.Source,
    prompts: Sequence[str] = (),
    max_windows: int = 32,
    window: int = 128,
    keep_bos: bool = False,
    dense: float = 0.1,
    max_norm_ratio: float | None = 10.0,
    max_feature_nodes: int | None = None,
    keep_graphs: bool = False,
    execution: Execution | None = None,
) -> ReplacementScores:
    """Each replacement (a name -> per-layer transcoders or a cross-layer transcoder) scored as the module docstring
    says, over the first `max_windows` windows of `corpus` and the graphs of `prompts` (none: no graph scores).
    max_feature_nodes: the graphs' limit (resid.analyses.graphs.attribute; None: every active feature).
    execution: `batch_size` windows per forward pass, `executor` / `workers`, `progress`."""
    execution = as_execution(execution)
    if not replacements:
        raise ResidError("Give at least one replacement: a name -> per-layer transcoders (one per layer) or a "
                         "cross-layer transcoder, e.g. {'per-layer': transcoders, 'clt': clt}.")
    checked = {name: Transcoders.of(model, items) for name, items in replacements.items()}
    if not 0 < dense < 1:
        raise ResidError(f"dense must be a fraction between 0 and 1, got {dense!r}.")
    check_ratio(max_norm_ratio)
    if any(not isinstance(p, str) or not p for p in prompts):
        raise ResidError("prompts= takes non-empty texts, one graph each (e.g. ['The Eiffel Tower is in the city "
                         "of']).")
    pieces, batches = window_batches(model, corpus, window, max_windows, execution)
    items = {name: t.dictionaries for name, t in checked.items()}
    job = ReplacementEvaluation(items, model.require_tokenizer().pad_token_id, keep_bos, max_norm_ratio,
                                max_feature_nodes, keep_graphs,
                                [("windows", batch) for batch in batches] + [("prompt", p) for p in prompts])
    totals, graphs = drive(model, job, execution)
    rows, layer_rows = [], []
    for name, t in checked.items():
        whole, *per_layer = totals[name]
        layer_metrics = [total.metrics(dense) for total in per_layer]
        layer_rows += [{"replacement": name, "layer": layer, **{key: m[key] for key in
                       ("fvu", "l0", "dead_fraction", "dense_fraction")}} for layer, m in enumerate(layer_metrics)]
        rows.append({"replacement": name, "kind": _kind(t), **_pooled(per_layer, layer_metrics, whole.metrics(dense)),
                     **_graph_scores(graphs[name])})
    table = pd.DataFrame(rows)
    table.attrs["provenance"] = describe(model, "training.evaluate_replacements", {
        "replacements": {name: t.name for name, t in checked.items()}, "windows": len(pieces), "window": window,
        "prompts": list(prompts), "keep_bos": keep_bos, "dense": dense, "max_norm_ratio": max_norm_ratio,
        "max_feature_nodes": max_feature_nodes})
    return ReplacementScores(table, pd.DataFrame(layer_rows),
                             {name: [s["graph"] for s in found] for name, found in graphs.items()} if keep_graphs
                             else {})


def _kind(t: Transcoders) -> str:
    if isinstance(t.replacing, CrossLayerTranscoder):
        return "cross-layer"
    return "skip" if all(d.W_skip is not None for d in t.dictionaries) else "per-layer"


def _pooled(per_layer: list[Totals], metrics: list[dict], whole: dict) -> dict:
    """The replacement's row from its layers' sums (FVU pooled, L0 summed, features over every layer) and the whole
    replacement's cross-entropies (`whole`: the metrics of the Totals that holds only those)."""
    error = sum(total.error for total in per_layer)
    variance = sum(total.square - float(total.sum.pow(2).sum()) / max(total.tokens, 1) for total in per_layer)
    fired = torch.cat([total.fired for total in per_layer])
    return {"layers": len(per_layer), "features": int(len(fired)), "tokens": per_layer[0].tokens,
            "fvu": error / variance if variance > 0 else float("nan"), "l0": sum(m["l0"] for m in metrics),
            "dead_fraction": float((fired == 0).double().mean()),
            **{key: whole[key] for key in ("ce_clean", "ce_spliced", "ce_zero_ablated", "ce_loss_recovered",
                                           "kl_spliced")}}


def _graph_scores(found: list[dict]) -> dict:
    if not found:
        return {"replacement_score": float("nan"), "completeness_score": float("nan"), "graph_features": float("nan")}
    mean = lambda key: sum(s[key] for s in found) / len(found)  # noqa: E731
    return {"replacement_score": mean("replacement"), "completeness_score": mean("completeness"),
            "graph_features": mean("features")}


@dataclass
class ReplacementEvaluation(Job):
    """Chunks ("windows", a forward batch of windows) give every replacement's Totals over the batch: its
    cross-entropies, then each layer's reconstruction; chunks ("prompt", text) give each replacement's graph scores
    for that prompt. `finish` adds the Totals up in chunk order and lists the scores in prompt order."""

    replacements: dict  # name -> its checked dictionaries: (the CrossLayerTranscoder,) or per-layer, in layer order
    pad: int
    keep_bos: bool
    max_norm_ratio: float | None
    max_feature_nodes: int | None
    keep_graphs: bool
    chunks: list  # planned on the driver (they travel with their chunks)

    name = "replacement eval"
    unit = "chunk"

    def plan(self, done: set, workers: int | None, per_worker: int) -> list[tuple]:
        planned, self.chunks = self.chunks, []
        return planned

    def setup(self, model: Transformer) -> tuple:
        return model, {name: replacing_mlps(model, on_device(items, model))
                       for name, items in self.replacements.items()}

    @torch.no_grad()
    def run(self, state: tuple, chunk: tuple) -> Iterator[tuple[str, object]]:
        model, replacements = state
        kind, payload = chunk
        if kind == "prompt":
            yield kind, {name: self._graph(model, payload, items) for name, items in replacements.items()}
            return
        tokens = batch_tokens(payload, self.pad, model.device)[0]
        valid = training_positions(tokens, self.keep_bos)
        scored = scored_positions(tokens, valid)
        targets = tokens.ids[:, 1:][scored[:, :-1]]
        out, clean_logp = {}, None
        for name, items in replacements.items():
            clean = model.run(tokens, dictionaries=list(items.dictionaries))
            records = [items.layer_record(clean, layer) for layer in range(items.n_layers)]
            where = [trained_on(record, valid, self.max_norm_ratio) for record in records]
            totals = [Totals(record.error.shape[-1], record.acts.shape[-1]) for record in records]
            for total, record, here in zip(totals, records, where, strict=True):
                total.observe(record, here)
            if clean_logp is None:  # the clean run's logits: the same whichever dictionaries it observes
                clean_logp = torch.log_softmax(clean.logits[scored].float(), dim=-1)
            spliced = torch.log_softmax(model.run(tokens, interventions=_splices(model, items, where)).logits[scored]
                                        .float(), dim=-1)
            zeroed = torch.log_softmax(model.run(tokens, interventions=_splices(model, items, where, zero=True))
                                       .logits[scored].float(), dim=-1)
            whole = Totals(0, 0)  # the whole replacement's cross-entropies, beside its layers' reconstructions
            whole.ce_clean, whole.ce_spliced, whole.ce_zero = (nll(logp, targets) for logp in (clean_logp, spliced,
                                                                                                zeroed))
            whole.kl, whole.scored = float((clean_logp.exp() * (clean_logp - spliced)).sum()), len(targets)
            out[name] = [whole, *totals]
        yield kind, out

    def _graph(self, model: Transformer, prompt: str, items) -> dict:
        graph = attribute(model, prompt, list(items.dictionaries), max_feature_nodes=self.max_feature_nodes)
        replacement, completeness = graph.scores()
        return {"replacement": replacement, "completeness": completeness, "features": graph.n_features,
                "graph": graph if self.keep_graphs else None}

    def combine(self, pieces: list) -> tuple[str, object]:
        return pieces[0]

    def finish(self, results: list[tuple[str, object]]) -> tuple[dict, dict]:
        totals: dict[str, list[Totals]] = {}
        graphs: dict[str, list[dict]] = {name: [] for name in self.replacements}
        for kind, result in results:  # in chunk order: float64 sums that do not depend on who finished first
            for name, value in result.items():
                if kind == "prompt":
                    graphs[name].append(value)
                elif name not in totals:
                    totals[name] = value
                else:
                    for into, part in zip(totals[name], value, strict=True):
                        into.add(part)
        return totals, graphs


def _splices(model: Transformer, items: MLPTranscoders, where: list[Tensor], zero: bool = False) -> list:
    """Every layer's MLP write replaced at once (by its reconstruction, or zeros) where where[layer] is True."""
    if isinstance(items, CrossLayerTranscoder):
        return splice_clt_at(model, items, where, zero=zero)
    return [hook for d, here in zip(items.dictionaries, where, strict=True)
            for hook in splice_at(model, d, here, zero=zero)]
