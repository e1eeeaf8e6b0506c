"""Ablation sweeps: knock out layers, sublayers, heads or neurons one at a time over many prompts and
measure what each does to a metric of the next-token prediction.

    df = ablation.sweep(model, prompts, targets, baselines, sites="sublayer", method="mean",
                        reference=texts, out="results.parquet")

One row per (prompt, ablation): prompt_idx, site, layer, part, head, expert, neuron, method, metric, clean_metric,
ablated_metric, delta (= ablated - clean). Methods: "zero"; "mean" (the write's mean over `reference`
texts; see ablation_values for agnostic vs per-position means); "resample" (the write from another
prompt: `reference` gives one donor prompt per prompt, else a random prompt of equal token length).

The engine stacks (prompt x ablation) rows into batched forwards that reuse the clean prefix: an
ablation at layer L starts from the clean residual entering L (model.resume) and unembeds only the last
token. With `out=` results are written chunk by chunk, atomically; re-running the same call resumes.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from analyses.ablation import values
from analyses.ablation.sites import Ablation, SiteKind, expand_sites, signature
from analyses.checks import check_choice
from analyses.inputs import Prompts, batch_size_for, prediction_positions, prompts as as_prompts
from analyses.io.store import ResultStore
from analyses.metrics import Metric, check_metric, metric_values
from analyses.vocab import token_ids
from resid.batching import BatchSize, run_batched, with_backoff
from resid.errors import ResidError
from resid.interventions import Add, Scale, Site
from resid.model import Inputs, Run, Transformer
from resid.seq2seq import EncoderDecoder
from resid.stream import ResidualStream
from resid.tokenizer import Tokens

Method = Literal["zero", "mean", "resample"]
MeanPositions = Literal["agnostic", "per_position"]
KEY = ("prompt_idx", "site")
# One row per (prompt, ablation); delta = ablated_metric - clean_metric; head/expert/neuron are <NA> where they do
# not apply (expert: mixture-of-experts MLPs only).
COLUMNS = (*KEY, "layer", "part", "head", "expert", "neuron", "method", "metric", "clean_metric", "ablated_metric",
           "delta")


@dataclass
class _Context:
    model: Transformer
    method: str
    metric: str | Callable  # a name of analyses.metrics.METRICS, or a function of the logits
    means: dict
    per_position: bool
    size: BatchSize  # rows per forward pass, shared so an out-of-memory halving sticks
    positions: list[int] | None = None  # masked-LM models: each prompt's [MASK] (None: each prompt's last token)


def sweep(
    model: Transformer | EncoderDecoder,
    prompts: Inputs,
    targets: Sequence[str | int] | str | int,
    baselines: Sequence[str | int] | str | int | None = None,
    sites: SiteKind | Sequence[Site] = "sublayer",
    method: Method = "zero",
    reference: Sequence[str] | str | Path | None = None,
    metric: Metric | Callable | None = None,
    batch_size: int | str = "auto",
    out: str | Path | None = None,
    seed: int = 0,
    mean_positions: MeanPositions = "agnostic",
    progress: bool = True,
) -> pd.DataFrame:
    """Run every ablation of `sites` on every prompt (texts, resid.Tokens or token ids); see the module
    docstring. Returns the columns of COLUMNS. Masked-LM models (BERT) are measured at each prompt's [MASK]."""
    _check_model(model)
    given = as_prompts(model, prompts)
    n = len(given)
    positions = prediction_positions(model, given, None, mask=True) if model.config.head == "mlm" else None
    target_ids = token_ids(model, targets, n, "target")
    baseline_ids = None if baselines is None else token_ids(model, baselines, n, "baseline")
    metric = metric or ("logit_diff" if baselines is not None else "target_prob")
    metric_label = check_metric(metric, baseline_ids is not None)
    check_choice(method, "method", ("zero", "mean", "resample"))
    check_choice(mean_positions, "mean_positions", ("agnostic", "per_position"))
    ablations = expand_sites(sites, model.config)
    lengths = given.tokens.lengths.tolist()
    donors = _donors(method, reference, given, model, seed)
    size = batch_size_for(model, given.tokens, batch_size)
    settings = dict(method=method, metric=metric_label, seed=seed, mean_positions=mean_positions)
    if positions is not None:
        settings["positions"] = positions
    store = None
    if out is not None:
        sig = signature(model, given.record(), target_ids, baseline_ids, ablations, reference, donors, settings)
        store = ResultStore(out, KEY, sig)
    done = store.done() if store is not None else set()
    means = {}
    if method == "mean":
        if reference is None:
            raise ResidError("method='mean' needs reference texts (a list of strings or a text file) to average over.")
        units = sorted({values.unit_of(s) for a in ablations for s in a.sites}, key=str)
        texts = values.read_reference(reference)
        means = with_backoff(
            lambda rows: values.reference_means(
                model, units, values.reference_tokens(model, texts, max(lengths), rows),
                mean_positions == "per_position", max(lengths),
            ),
            size,
        )
    ctx = _Context(model, method, metric, means, mean_positions == "per_position", size, positions)
    frames = []
    pending = sum(1 for p in range(n) for a in ablations if (p, a.label) not in done)
    with tqdm(total=pending, desc="ablation sweep", disable=not progress) as bar:
        start = 0
        while start < n:
            def clean(rows: int, start: int = start):
                group_prompts = list(range(start, min(n, start + rows)))
                todo = [(p, a) for p in group_prompts for a in ablations if (p, a.label) not in done]
                group = _clean_pass(ctx, given, group_prompts, todo, target_ids, baseline_ids, donors) if todo else None
                return group_prompts, todo, group

            group_prompts, todo, group = with_backoff(clean, size)  # out of memory: fewer prompts per clean pass
            if group is not None:
                for frame in _ablate_group(ctx, group, todo, bar.update):
                    if store is not None:
                        store.write(frame)
                    frames.append(frame)
            start = group_prompts[-1] + 1
    result = store.finish() if store is not None else pd.concat(frames, ignore_index=True) if frames else None
    if result is None or result.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    order = {a.label: i for i, a in enumerate(ablations)}
    result = result.assign(_order=result["site"].map(order)).sort_values(["prompt_idx", "_order"], kind="stable")
    return result.drop(columns="_order").reset_index(drop=True)


@dataclass
class _Group:
    """One group of prompts after its clean pass."""

    prompts: list[int]  # global prompt indices; row i of the tensors below is prompts[i]
    tokens: Tokens  # the group's prompts, on the model's device
    clean: Run  # the clean run (donor rows appended after the prompts for resample ablation)
    donor_stream: ResidualStream | None
    targets: Tensor
    baselines: Tensor | None
    clean_metric: Tensor
    at: Tensor | None = None  # masked-LM models: [k 1] padded index of each prompt's [MASK]


def _check_model(model) -> None:
    """Ablation metrics read token logits of one stream: refuse, clearly, models that have neither."""
    if isinstance(model, EncoderDecoder):
        raise ResidError(
            f"ablation.sweep does not take encoder-decoder models ({model.name}) yet. Ablate with interventions, "
            "e.g. model.run(source, target, interventions=[resid.ZeroAblate(resid.Site(l, 'cross', head=h))])."
        )
    model.readout.unembed  # noqa: B018 -- raises for embedding models, saying what to read out instead


def _clean_pass(ctx, given: Prompts, group, todo, target_ids, baseline_ids, donors) -> _Group:
    """The group's prompts (then, for resample, their donors: same lengths, so the same padded positions) in
    one clean run."""
    model = ctx.model
    sequences = given.sequences(group)
    if donors is not None:
        sequences += [given.sequences([d])[0] if isinstance(d, int) else d for d in (donors[p] for p in group)]
    capture = values.capture_for({values.unit_of(s) for _, a in todo for s in a.sites})
    padded = Tokens.pad(sequences, given.pad_token_id)
    k = len(group)
    at = "last"
    if ctx.positions is not None:  # donors (same lengths) are read where their prompt is
        at = padded.padded_index([[ctx.positions[group[i % k]]] for i in range(len(sequences))]).to(model.device)
    clean = model.run(padded, capture=capture, logits_at=at)
    tokens = clean.tokens  # on the model's device, like every index built from it below
    targets = torch.tensor([target_ids[p] for p in group], device=model.device)
    baselines = None if baseline_ids is None else torch.tensor([baseline_ids[p] for p in group], device=model.device)
    return _Group(
        prompts=group,
        tokens=tokens.rows(torch.arange(k)) if donors is not None else tokens,
        clean=clean,
        donor_stream=clean.stream if donors is not None else None,
        targets=targets,
        baselines=baselines,
        clean_metric=metric_values(ctx.metric, clean.logits[:k, 0], targets, baselines),
        at=None if ctx.positions is None else at[:k],
    )


def _ablate_group(ctx, group: _Group, todo, on_progress):
    """Every pending ablation of the group, layer by layer, each resumed from the clean residual."""
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

            for rows, ablated in run_batched(by_layer[layer], work, ctx.size, on_progress):
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


def _donors(method, reference, given: Prompts, model, seed) -> list[int] | list[list[int]] | None:
    """Resample donors: per prompt, another prompt's index, or the token ids of the given donor text."""
    if method != "resample":
        if method == "zero" and reference is not None:
            raise ResidError("reference is used by mean and resample ablation only; drop it for method='zero'.")
        return None
    lengths = given.tokens.lengths.tolist()
    if reference is None:
        return values.random_donors(lengths, seed)
    donors = values.read_reference(reference)
    if len(donors) != len(lengths):
        raise ResidError(
            f"For resample ablation, reference must give one donor prompt per prompt, in order: got {len(donors)} "
            f"donors for {len(lengths)} prompts."
        )
    donor_ids = [list(model.as_tokens(d).ids[0].tolist()) for d in donors]
    for i, (donor, ids, length) in enumerate(zip(donors, donor_ids, lengths)):
        if len(ids) != length:
            raise ResidError(f"Donor prompt {i} {donor!r} does not have the same token count as prompt {i} ({length}).")
    return donor_ids
