"""Activation patching (exact): run one prompt of a (clean, corrupt) pair, put the other prompt's activation in at
one site, and measure how much of the clean behaviour that restores.

    direction="denoise"  run the corrupt prompt, patch in the clean activation (what is sufficient)
    direction="noise"    run the clean prompt, patch in the corrupt activation (what is necessary)

score = (patched - corrupt) / (clean - corrupt): 0 is the corrupt run's metric, 1 the clean run's, in both
directions. Sites:

    "resid_pre"   the residual stream entering each layer, one position at a time (the layer x position map)
    "sublayer", "head", "layer", "q", "k", "v", "pattern" (each head's query, key / value of each key/value
                  head, attention pattern), or a list of resid.Site (writes, heads, head inputs, neurons; with
                  positions=[...] for one position): the activation of the other prompt, by the ablation engine's
                  resample path (batched rows, the clean prefix reused, the last token unembedded, out-of-memory
                  back-off)

With `out=` (a .parquet or .csv file) finished rows are stored chunk by chunk, for every kind of site: a killed
run, called again the same way, resumes where it stopped. Chunks run in process, or on Ray workers
(executor="ray", workers=N; resid.analyses.distributed), with the same rows. The file holds each (pair, site)'s
patched metric (for the engine's sites, in the ablation sweep's columns); the returned frame adds the clean and
corrupt metrics and the score.

The pairs must have the same token length (the positions correspond one to one), or, for "resid_pre", an
alignment (align="end" or explicit positions; resid.analyses.patching.pairs); positions are the clean prompt's.
"""

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from resid.analyses.ablation import sweep
from resid.analyses.distributed.executor import Executor
from resid.analyses.io.store import ResultStore
from resid.analyses.patching.pairs import Align, Direction, prepare, scored
from resid.analyses.patching.residual import residual_stream
from resid.interventions import Site
from resid.model import Transformer

HEAD_INPUTS = ("q", "k", "v", "pattern")  # sites= words for every head's input
# One row per (pair, site); patched_metric is the metric with the site patched, score its normalized value.
COLUMNS = ("prompt_idx", "site", "layer", "part", "head", "neuron", "position", "direction", "metric",
           "clean_metric", "corrupt_metric", "patched_metric", "score")


def activation(
    model: Transformer,
    clean: Sequence[str],
    corrupt: Sequence[str],
    targets: Sequence[str | int] | str | int,
    baselines: Sequence[str | int] | str | int | None = None,
    sites: str | Sequence = "resid_pre",
    direction: Direction = "denoise",
    metric: str | Callable | None = None,
    batch_size: int | str = "auto",
    out: str | Path | None = None,
    progress: bool = False,
    align: Align = None,
    executor: Executor | str | None = None,
    workers: int | None = None,
) -> pd.DataFrame:
    """Exact activation patching of every site on every (clean, corrupt) pair; the columns of COLUMNS. executor:
    None (in process), "ray" (with `workers`) or a resid.analyses.distributed executor: the same rows on each."""
    pairs, target_ids, baseline_ids, metric, label = prepare(model, clean, corrupt, targets, baselines, metric,
                                                              direction, align)
    clean_metric = pairs.metric(model, "clean", metric, target_ids, baseline_ids)
    corrupt_metric = pairs.metric(model, "corrupt", metric, target_ids, baseline_ids)
    base, donor = ("corrupt", "clean") if direction == "denoise" else ("clean", "corrupt")
    if isinstance(sites, str) and sites == "resid_pre":
        store = None
        if out is not None:
            record = [pairs.texts("clean"), pairs.texts("corrupt"), target_ids, baseline_ids]
            record += [pairs.aligned] if pairs.aligned is not None else []
            digest = hashlib.sha256(json.dumps(record, default=str).encode()).hexdigest()[:16]
            store = ResultStore(out, ("prompt_idx", "site"), {
                "model": model.name, "dtype": str(model.dtype), "analysis": "patching.activation resid_pre",
                "pairs": digest, "direction": direction, "metric": label,
            })
        df = residual_stream(model, pairs, base, target_ids, baseline_ids, metric, batch_size, store, executor,
                             workers, progress)
    else:
        pairs.require_same_positions(f"Patching sites={sites!r}" if isinstance(sites, str) else "Patching Sites")
        if isinstance(sites, str) and sites in HEAD_INPUTS:
            sites = input_sites(model, sites)
        df = sweep(model, pairs.texts(base), targets, baselines, sites=sites, method="resample",
                   reference=pairs.texts(donor), metric=metric, batch_size=batch_size, out=out, progress=progress,
                   executor=executor, workers=workers)
        df = df.rename(columns={"ablated_metric": "patched_metric"}).drop(columns=["clean_metric", "delta", "method"])
        df["position"] = pd.array([None] * len(df), dtype="Int64")
    df["clean_metric"] = clean_metric[df["prompt_idx"].to_numpy()]
    df["corrupt_metric"] = corrupt_metric[df["prompt_idx"].to_numpy()]
    return scored(df, direction, label)[list(COLUMNS)].reset_index(drop=True)


def input_sites(model: Transformer, kind: str) -> list[Site]:
    """Every head's `kind` input ("q", "pattern"), or every key/value head's ("k", "v")."""
    cfg = model.config
    heads = cfg.n_kv_heads if kind in ("k", "v") else cfg.n_heads
    return [Site(l, "attn", head=h, input=kind) for l in range(cfg.n_layers) for h in range(heads)]
