"""Ablation sweeps: knock out layers, sublayers, heads or neurons one at a time over many prompts and
measure what each does to a metric of the next-token prediction.

    df = ablation.sweep(model, prompts, targets, baselines, sites="sublayers", method="mean",
                        reference=texts, out="results.parquet")

One row per (prompt, ablation): prompt_idx, site, layer, part, head, neuron, method, metric, clean_metric,
ablated_metric, delta (= ablated - clean). Methods: "zero"; "mean" (the write's mean over `reference`
texts; see ablation_values for agnostic vs per-position means); "resample" (the write from another
prompt: `reference` gives one donor prompt per prompt, else a random prompt of equal token length).

The engine stacks (prompt x ablation) rows into batched forwards that reuse the clean prefix: an
ablation at layer L starts from the clean residual entering L (model.resume) and unembeds only the last
token. With `out=` results are written chunk by chunk, atomically; re-running the same call resumes.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from analyses.ablation import values
from analyses.ablation.sites import Ablation, expand_sites, signature
from analyses.metrics import METRICS, metric_values
from analyses.io.store import ResultStore
from analyses.vocab import token_ids
from resid.batching import BatchSize, model_batch_size, run_batched, with_backoff
from resid.errors import ResidError
from resid.interventions import Add, Scale, Site
from resid.model import Run, Transformer
from resid.stream import ResidualStream
from resid.tokenizer import Tokens

KEY = ("prompt_idx", "site")


@dataclass
class _Context:
    model: Transformer
    method: str
    metric: str
    means: dict
    per_position: bool
    size: BatchSize  # rows per forward pass, shared so an out-of-memory halving sticks


def sweep(
    model: Transformer,
    prompts: Sequence[str],
    targets: Sequence[str | int] | str | int,
    baselines: Sequence[str | int] | str | int | None = None,
    sites: str | Sequence[Site] = "sublayers",
    method: str = "zero",
    reference: Sequence[str] | str | Path | None = None,
    metric: str | None = None,
    batch_size: int | str = "auto",
    out: str | Path | None = None,
    seed: int = 0,
    mean_positions: str = "agnostic",
    progress: bool = True,
) -> pd.DataFrame:
    """Run every ablation of `sites` on every prompt; see the module docstring."""
    prompts = _check_prompts(prompts)
    n = len(prompts)
    target_ids = token_ids(model, targets, n, "target")
    baseline_ids = None if baselines is None else token_ids(model, baselines, n, "baseline")
    metric = metric or ("logit_diff" if baselines is not None else "target_prob")
    if metric not in METRICS:
        raise ResidError(f"Unknown metric {metric!r}; choose from {sorted(METRICS)}.")
    if metric == "logit_diff" and baseline_ids is None:
        raise ResidError("metric='logit_diff' needs baselines (one per prompt); or use metric='target_prob'.")
    if method not in ("zero", "mean", "resample"):
        raise ResidError(f"Unknown ablation method {method!r}; choose 'zero', 'mean' or 'resample'.")
    if mean_positions not in ("agnostic", "per_position"):
        raise ResidError(f"mean_positions must be 'agnostic' or 'per_position', got {mean_positions!r}.")
    ablations = expand_sites(sites, model.config)
    lengths = [len(model.require_tokenizer().encode(p)) for p in prompts]
    donors = _donors(method, reference, prompts, lengths, model, seed)
    size = BatchSize(model_batch_size(model, max(lengths)) if batch_size == "auto" else batch_size)
    settings = dict(method=method, metric=metric, seed=seed, mean_positions=mean_positions)
    store = None
    if out is not None:
        sig = signature(model, prompts, target_ids, baseline_ids, ablations, reference, donors, settings)
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
    ctx = _Context(model, method, metric, means, mean_positions == "per_position", size)
    frames = []
    pending = sum(1 for p in range(n) for a in ablations if (p, a.label) not in done)
    with tqdm(total=pending, desc="ablation sweep", disable=not progress) as bar:
        start = 0
        while start < n:
            group_prompts = list(range(start, min(n, start + size.value)))
            todo = [(p, a) for p in group_prompts for a in ablations if (p, a.label) not in done]
            if todo:
                try:
                    group = _clean_pass(ctx, prompts, group_prompts, todo, target_ids, baseline_ids, donors)
                except torch.cuda.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    size.halve()  # fewer prompts per clean pass; retry this group
                    continue
                for frame in _ablate_group(ctx, group, todo, bar.update):
                    if store is not None:
                        store.write(frame)
                    frames.append(frame)
            start = group_prompts[-1] + 1
    result = store.finish() if store is not None else pd.concat(frames, ignore_index=True) if frames else None
    if result is None or result.empty:
        return pd.DataFrame(columns=[*KEY, "layer", "part", "head", "neuron", "method", "metric",
                                     "clean_metric", "ablated_metric", "delta"])
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


def _clean_pass(ctx, prompts, group, todo, target_ids, baseline_ids, donors) -> _Group:
    model = ctx.model
    texts = [prompts[p] for p in group]
    if donors is not None:
        texts += [prompts[donors[p]] if isinstance(donors[p], int) else donors[p] for p in group]
    capture = values.capture_for({values.unit_of(s) for _, a in todo for s in a.sites})
    clean = model.run(model.to_tokens(texts), capture=capture, logits_at="last")
    tokens = clean.tokens  # on the model's device, like every index built from it below
    k = len(group)
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
    )


def _ablate_group(ctx, group: _Group, todo, on_progress):
    """Every pending ablation of the group, layer by layer, each resumed from the clean residual."""
    model, k = ctx.model, len(group.prompts)
    local = {p: i for i, p in enumerate(group.prompts)}
    by_layer: dict[int, list] = {}
    for p, a in todo:
        by_layer.setdefault(a.start_layer, []).append((local[p], a))
    stream = group.clean.stream
    # resid_pre(layer) kept as a running sum: stream.resid_pre(layer) would re-add every earlier write each time.
    resid = stream.resid_pre(0)[:k]
    for layer in range(model.config.n_layers):
        if layer in by_layer:
            def work(rows, layer=layer, resid_pre=resid):
                index = torch.tensor([i for i, _ in rows], device=model.device)
                edits = _edits(ctx, [a for _, a in rows], index, group.tokens, group.donor_stream, k)
                logits = model.resume(layer, resid_pre[index], group.tokens.rows(index), edits, logits_at="last")
                baselines = None if group.baselines is None else group.baselines[index]
                return metric_values(ctx.metric, logits[:, 0], group.targets[index], baselines)

            for rows, ablated in run_batched(by_layer[layer], work, ctx.size, on_progress):
                yield _frame(ctx, rows, group.prompts, group.clean_metric, ablated)
        resid = resid + stream.layers[layer].attn.out[:k] + stream.layers[layer].mlp.out[:k]


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
            replacement = replacement[:, torch.tensor(site.positions, device=model.device) % tokens.ids.shape[1]]
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
        "neuron": pd.array([a.neuron for _, a in rows], dtype="Int64"),
        "method": ctx.method,
        "metric": ctx.metric,
        "clean_metric": clean,
        "ablated_metric": ablated,
        "delta": ablated - clean,
    })


def _check_prompts(prompts: Sequence[str]) -> list[str]:
    if isinstance(prompts, str):
        prompts = [prompts]
    prompts = list(prompts)
    if not prompts:
        raise ResidError("No prompts given: pass a non-empty list of strings.")
    bad = [i for i, p in enumerate(prompts) if not isinstance(p, str) or not p.strip()]
    if bad:
        raise ResidError(f"Prompt(s) {bad[:10]} are empty or not strings.")
    return prompts


def _donors(method, reference, prompts, lengths, model, seed):
    if method != "resample":
        if method == "zero" and reference is not None:
            raise ResidError("reference is used by mean and resample ablation only; drop it for method='zero'.")
        return None
    if reference is None:
        return values.random_donors(lengths, seed)
    donors = list(reference) if not isinstance(reference, (str, Path)) else None
    if donors is None or len(donors) != len(prompts):
        raise ResidError("For resample ablation, reference must list one donor prompt per prompt (same order).")
    for i, (donor, length) in enumerate(zip(donors, lengths)):
        if len(model.require_tokenizer().encode(donor)) != length:
            raise ResidError(f"Donor prompt {i} {donor!r} does not have the same token count as prompt {i} ({length}).")
    return donors
