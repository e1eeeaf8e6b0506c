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

from analyses import ablation_values as values
from analyses.ablation_sites import Ablation, expand_sites, signature
from analyses.metrics import METRICS, metric_values
from analyses.store import ResultStore
from analyses.tokens import token_ids
from resid.batching import auto_batch_size, run_batched
from resid.errors import ResidError
from resid.interventions import Add, Scale, Site
from resid.model import Transformer

KEY = ("prompt_idx", "site")


@dataclass
class _Context:
    model: Transformer
    method: str
    metric: str
    means: dict
    per_position: bool


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
    lengths = [len(model._need_tokenizer().encode(p)) for p in prompts]
    donors = _donors(method, reference, prompts, lengths, model, seed)
    if batch_size == "auto":
        cfg = model.config
        batch_size = auto_batch_size(
            model.device, max(lengths), cfg.d_model, cfg.d_mlp, cfg.n_heads, cfg.d_vocab, model.dtype.itemsize
        )
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ResidError(f"batch_size must be a positive integer or 'auto', got {batch_size!r}.")
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
        batches = values.reference_tokens(model, values.read_reference(reference), max(lengths), batch_size)
        means = values.reference_means(model, units, batches, mean_positions == "per_position", max(lengths))
    ctx = _Context(model, method, metric, means, mean_positions == "per_position")
    frames = []
    for start in range(0, n, batch_size):
        group = list(range(start, min(n, start + batch_size)))
        todo = [(p, a) for p in group for a in ablations if (p, a.label) not in done]
        if not todo:
            continue
        for frame in _sweep_group(ctx, prompts, group, todo, target_ids, baseline_ids, donors, batch_size, progress):
            if store is not None:
                store.write(frame)
            frames.append(frame)
    result = store.finish() if store is not None else pd.concat(frames, ignore_index=True) if frames else None
    if result is None or result.empty:
        return pd.DataFrame(columns=[*KEY, "layer", "part", "head", "neuron", "method", "metric",
                                     "clean_metric", "ablated_metric", "delta"])
    order = {a.label: i for i, a in enumerate(ablations)}
    result = result.assign(_order=result["site"].map(order)).sort_values(["prompt_idx", "_order"], kind="stable")
    return result.drop(columns="_order").reset_index(drop=True)


def _sweep_group(ctx, prompts, group, todo, target_ids, baseline_ids, donors, batch_size, progress):
    """Clean pass over one group of prompts, then every pending ablation, layer by layer."""
    model = ctx.model
    texts = [prompts[p] for p in group]
    units = {values.unit_of(s) for _, a in todo for s in a.sites}
    if donors is not None:
        texts += [prompts[donors[p]] if isinstance(donors[p], int) else donors[p] for p in group]
    tokens = model.to_tokens(texts)
    capture = values.capture_for(units, model.config.n_layers)
    clean = model.run(tokens, capture=capture, logits_at="last")
    k = len(group)
    donor_stream = None
    if donors is not None:
        donor_stream, tokens = clean.stream, tokens.rows(torch.arange(k))
    targets = torch.tensor([target_ids[p] for p in group], device=model.device)
    baselines = None if baseline_ids is None else torch.tensor([baseline_ids[p] for p in group], device=model.device)
    clean_metric = metric_values(ctx.metric, clean.logits[:k, 0], targets, baselines)
    local = {p: i for i, p in enumerate(group)}
    by_layer: dict[int, list] = {}
    for p, a in todo:
        by_layer.setdefault(a.start_layer, []).append((local[p], a))
    resid = clean.stream.resid_pre(0)
    for layer in range(model.config.n_layers):
        if layer in by_layer:
            def work(rows, layer=layer, resid_pre=resid):
                index = torch.tensor([i for i, _ in rows], device=model.device)
                edits = _edits(ctx, [a for _, a in rows], index, tokens, donor_stream, k)
                logits = model.resume(layer, resid_pre[index], tokens.rows(index), edits, logits_at="last")[:, 0]
                return metric_values(ctx.metric, logits, targets[index], None if baselines is None else baselines[index])

            for rows, ablated in run_batched(by_layer[layer], work, batch_size, progress, f"layer {layer}"):
                yield _frame(ctx, rows, group, clean_metric, ablated)
        record = clean.stream.layers[layer]
        resid = resid + record.attn.out + record.mlp.out


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
        if len(model._need_tokenizer().encode(donor)) != length:
            raise ResidError(f"Donor prompt {i} {donor!r} does not have the same token count as prompt {i} ({length}).")
    return donors
