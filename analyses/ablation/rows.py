"""Batched (prompt x ablation) rows: what one chunk of a sweep computes, on whichever worker runs it.

A *group* is a few prompts run clean together (their resample donors appended); its rows are then ablated layer
by layer, each resumed from the clean residual entering the ablated layer (model.resume), unembedding only the
last token (or each prompt's [MASK]). Every function here takes plain inputs (token ids, global prompt indices)
so that a remote worker computes exactly what the driver would.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from resid.analyses.ablation import values
from resid.analyses.ablation.sites import Ablation
from resid.analyses.metrics import check_metric, metric_values
from resid.batching import BatchSize, run_batched
from resid.interventions import Add, Scale
from resid.model import Run, Transformer
from resid.stream import ResidualStream
from resid.tokenizer import Tokens


@dataclass
class Context:
    model: Transformer
    method: str
    metric: str | Callable  # a name of resid.analyses.metrics.METRICS, or a function of the logits
    means: dict
    per_position: bool
    size: BatchSize  # rows per forward pass, shared so an out-of-memory halving sticks
    positions: list[int] | None = None  # masked-LM models: each prompt's [MASK] (None: each prompt's last token)


@dataclass
class Group:
    """One group of prompts after its clean pass."""

    prompts: list[int]  # global prompt indices; row i of the tensors below is prompts[i]
    tokens: Tokens  # the group's prompts, on the model's device
    clean: Run  # the clean run (donor rows appended after the prompts for resample ablation)
    donor_stream: ResidualStream | None
    targets: Tensor
    baselines: Tensor | None
    clean_metric: Tensor
    at: Tensor | None = None  # masked-LM models: [k 1] padded index of each prompt's [MASK]


def clean_pass(ctx: Context, sequences: list, pad: int, group: list, todo: list, target_ids: list,
               baseline_ids: list | None, donors: list | None) -> Group:
    """The group's prompts (then, for resample, their donors: same lengths, so the same padded positions) in
    one clean run. sequences: every prompt's real token ids; donors: per prompt, a prompt index or token ids."""
    model = ctx.model
    chosen = [sequences[p] for p in group]
    if donors is not None:
        chosen += [sequences[d] if isinstance(d, int) else d for d in (donors[p] for p in group)]
    capture = values.capture_for({values.unit_of(s) for _, a in todo for s in a.sites})
    padded = Tokens.pad(chosen, pad)
    k = len(group)
    at = "last"
    if ctx.positions is not None:  # donors (same lengths) are read where their prompt is
        at = padded.padded_index([[ctx.positions[group[i % k]]] for i in range(len(chosen))]).to(model.device)
    clean = model.run(padded, capture=capture, logits_at=at)
    tokens = clean.tokens  # on the model's device, like every index built from it below
    targets = torch.tensor([target_ids[p] for p in group], device=model.device)
    baselines = None if baseline_ids is None else torch.tensor([baseline_ids[p] for p in group], device=model.device)
    return Group(
        prompts=group,
        tokens=tokens.rows(torch.arange(k)) if donors is not None else tokens,
        clean=clean,
        donor_stream=clean.stream if donors is not None else None,
        targets=targets,
        baselines=baselines,
        clean_metric=metric_values(ctx.metric, clean.logits[:k, 0], targets, baselines),
        at=None if ctx.positions is None else at[:k],
    )


def ablate_group(ctx: Context, group: Group, todo: list) -> Iterator[pd.DataFrame]:
    """Every pending (prompt, ablation) row of the group, layer by layer, each resumed from the clean residual."""
    model, k = ctx.model, len(group.prompts)
    local = {p: i for i, p in enumerate(group.prompts)}
    by_layer: dict[int, list] = {}
    for p, a in todo:
        by_layer.setdefault(a.start_layer, []).append((local[p], a))
    # The i-th residual of running("layer") is resid_pre(i): one addition per layer, never re-summed.
    entering = zip(range(model.config.n_layers), group.clean.stream.running("layer"))
    for layer, (_, _, resid) in entering:
        resid = resid[:k]
        if layer in by_layer:
            def work(rows, layer=layer, resid_pre=resid):
                index = torch.tensor([i for i, _ in rows], device=model.device)
                edits = _edits(ctx, [a for _, a in rows], index, group.tokens, group.donor_stream, k)
                at = "last" if group.at is None else group.at[index]
                logits = model.resume(layer, resid_pre[index], group.tokens.rows(index), edits, logits_at=at)
                baselines = None if group.baselines is None else group.baselines[index]
                return metric_values(ctx.metric, logits[:, 0], group.targets[index], baselines)

            for rows, ablated in run_batched(by_layer[layer], work, ctx.size):
                yield _frame(ctx, rows, group.prompts, group.clean_metric, ablated)


def _edits(ctx, ablations: list[Ablation], index: Tensor, tokens, donor_stream, k: int) -> list:
    """Per-row ablations as whole-batch edits: each unit is scaled by 0 on the rows that ablate it (1 on
    the others) and, for mean / resample, its replacement is added on those rows only. Exact: x*1 + 0 = x."""
    model, edits = ctx.model, []
    units = {}
    for row, a in enumerate(ablations):
        for site in a.sites:
            units.setdefault(site, torch.zeros(len(ablations), dtype=torch.bool))[row] = True
    for site, rows in units.items():
        unit = values.unit_of(site)
        rows = rows.to(model.device)
        shape = (-1, 1) if site.neuron is not None else (-1, 1, 1)
        edits.append(Scale(site, (~rows).to(model.dtype).view(shape)))
        if ctx.method == "zero":
            continue
        if ctx.method == "mean":
            replacement = ctx.means[unit]
            if ctx.per_position:
                replacement = replacement[tokens.position_ids[index]]
        else:
            replacement = values.read_unit(donor_stream, unit)[index + k]
        if site.positions is not None and replacement.ndim == (2 if site.neuron is not None else 3):
            # Per-position replacements are in the batch's padded layout; the site edits its prompt positions.
            at = tokens.rows(index).padded_index(site.positions)
            at = at.view(*at.shape, *([1] * (replacement.ndim - 2))).expand(-1, -1, *replacement.shape[2:])
            replacement = replacement.gather(1, at)
        edits.append(Add(site, replacement * rows.to(model.dtype).view(shape)))
    return edits


def _frame(ctx, rows, group, clean_metric: Tensor, ablated: Tensor) -> pd.DataFrame:
    local = [i for i, _ in rows]
    clean = clean_metric[local].double().cpu().numpy()
    ablated = ablated.double().cpu().numpy()
    return pd.DataFrame({
        "prompt_idx": [group[i] for i in local],
        "site": [a.label for _, a in rows],
        "layer": [a.layer for _, a in rows],
        "part": [a.part for _, a in rows],
        "head": pd.array([a.head for _, a in rows], dtype="Int64"),
        "expert": pd.array([a.expert for _, a in rows], dtype="Int64"),
        "neuron": pd.array([a.neuron for _, a in rows], dtype="Int64"),
        "method": ctx.method,
        "metric": check_metric(ctx.metric, True),
        "clean_metric": clean,
        "ablated_metric": ablated,
        "delta": ablated - clean,
    })
