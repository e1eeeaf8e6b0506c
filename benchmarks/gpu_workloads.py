"""The analysis workloads of bench_gpu.py, each on a loaded model on its own device; each returns a record (a dict
of what it measured) for bench_gpu.py to print and keep.

Multiply-add bound: an analysis that must run the model's layers over some rows and positions cannot beat that
many multiply-adds at the rate of the model's own plain forward over the same prompts (measured here, on the same
device, in the same dtype). `bound_fraction` = bound time / measured time (1.0: as fast as the forward's rate
allows; the targets: sweeps and patching >= 0.8, head DLA >= 0.5).
  head DLA         one forward of the prompts, the last position unembedded
  head ablation    the clean forward, then per head at layer l the layers l.. rerun at every position (zero
                   ablation changes the residual from l on) and the last position unembedded
  head patching    the clean and the corrupt forward, then per head as above
"""

import math
import statistics

import torch
from bench_ablation import make_prompts
from bench_patching import corrupt_of
from gpu_profile import Profiles
from gpu_timing import Peak, interleaved, once

import resid
from resid.analyses import Execution, ablation, attribution, patching
from resid.batching import model_batch_size


def layer_macs(config, n_pos: int) -> float:
    """Multiply-adds per token of one layer at a context of n_pos tokens (causal: (n_pos + 1) / 2 keys on average,
    each read by q.k and by the pattern's sum over v)."""
    d, heads, kv, d_head = config.d_model, config.n_heads, config.n_kv_heads, config.d_head
    projections = d * (heads + 2 * kv) * d_head + heads * d_head * d
    scores = heads * d_head * (n_pos + 1)
    return projections + scores + (3 if config.gated_mlp else 2) * d * config.d_mlp


def forward_macs(config, rows: int, n_pos: int, from_layer: int = 0, unembedded: int | None = None) -> float:
    """Multiply-adds of running layers from_layer.. over rows x n_pos tokens and unembedding `unembedded`
    positions of each row (default: all)."""
    unembedded = n_pos if unembedded is None else unembedded
    layers = config.n_layers - from_layer
    return rows * (n_pos * layers * layer_macs(config, n_pos) + unembedded * config.d_model * config.d_vocab)


def mac_rate(model, ids: torch.Tensor, repeats: int, rows: int = 0) -> float:
    """Multiply-adds per second of the plain forward (no capture) over the rows of `ids` repeated to `rows` rows
    (0: the batch an analysis runs at this length, resid.batching.model_batch_size: the rate a well-batched engine
    can reach)."""
    rows = max(len(ids), rows or model_batch_size(model, ids.shape[1]))
    ids = ids.repeat(math.ceil(rows / len(ids)), 1)[:rows].to(model.device)
    seconds, _ = interleaved({"forward": lambda: model.run(ids, capture=resid.Capture.none())}, repeats,
                             model.device)["forward"]
    return forward_macs(model.config, *ids.shape) / seconds


def median_of(fn, device, repeats: int) -> tuple[float, object, int]:
    """The median of `repeats` calls (after one warm-up call): seconds, the last result, the largest peak memory.
    The median, as `mac_rate` takes of the forward it divides by: a bound fraction compares one statistic on both
    sides (the fastest call against a median forward would flatter the analysis)."""
    once(fn, device)
    runs = [once(fn, device) for _ in range(repeats)]
    return statistics.median(r[0] for r in runs), runs[-1][1], max(r[2] for r in runs)


def _record(name: str, rows: int, seconds: float, bound_s: float | None, peak: int, **extra) -> dict:
    out = dict(workload=name, rows=rows, seconds=seconds, rows_per_s=rows / seconds, peak_bytes=peak, **extra)
    if bound_s is not None:
        out.update(bound_s=bound_s, bound_fraction=bound_s / seconds)
    return out


def ioi(model, n: int) -> tuple[list[str], list[str], list[str], torch.Tensor]:
    prompts, targets, baselines = make_prompts(model, n)
    return prompts, targets, baselines, model.to_tokens(prompts).ids


def _measured(name: str, fn, model, repeats: int, macs: float, rate: float, profiles: Profiles | None, **extra
              ) -> tuple[dict, object]:
    """fn's record (the median of `repeats` calls, its bound `macs` at `rate`) and its last result; given
    `profiles`, fn is left there to profile."""
    seconds, df, peak = median_of(fn, model.device, repeats)
    if profiles is not None:
        profiles.later(name, fn)
    return _record(name, len(df), seconds, macs / rate, peak, **extra), df


def head_dla(model, n: int, repeats: int, rate_rows: int = 0, profiles: Profiles | None = None) -> dict:
    prompts, targets, baselines, ids = ioi(model, n)
    rate = mac_rate(model, ids, repeats, rate_rows)
    return _measured("head DLA", lambda: attribution.direct(model, prompts, targets, baselines, level="head"),
                     model, repeats, forward_macs(model.config, *ids.shape, unembedded=1), rate, profiles,
                     prompts=n, tokens=ids.shape[1])[0]


def head_sweep(model, n: int, repeats: int, rate_rows: int = 0, profiles: Profiles | None = None) -> dict:
    prompts, targets, baselines, ids = ioi(model, n)
    config, (rows, n_pos) = model.config, ids.shape
    rate = mac_rate(model, ids, repeats, rate_rows)
    macs = forward_macs(config, rows, n_pos, unembedded=1) + config.n_heads * sum(
        forward_macs(config, rows, n_pos, layer, unembedded=1) for layer in range(config.n_layers))
    record, df = _measured("head ablation sweep", lambda: ablation.sweep(
        model, prompts, targets, baselines, sites="head", method="zero", metric="logit_diff",
        execution=Execution(progress=False)), model, repeats, macs, rate, profiles, prompts=n, tokens=n_pos)
    assert len(df) == rows * config.n_layers * config.n_heads, f"{len(df)} rows"
    return record


def head_patching(model, n: int, repeats: int, rate_rows: int = 0, profiles: Profiles | None = None) -> dict:
    clean, targets, baselines, ids = ioi(model, n)
    corrupt = corrupt_of(clean, targets, baselines)
    config, (rows, n_pos) = model.config, ids.shape
    rate = mac_rate(model, ids, repeats, rate_rows)
    macs = 2 * forward_macs(config, rows, n_pos, unembedded=1) + config.n_heads * sum(
        forward_macs(config, rows, n_pos, layer, unembedded=1) for layer in range(config.n_layers))
    record, df = _measured("exact head patching", lambda: patching.activation(
        model, clean, corrupt, targets, baselines, sites="head", execution=Execution(progress=False)),
        model, repeats, macs, rate, profiles, pairs=n, tokens=n_pos)
    assert len(df) == rows * config.n_layers * config.n_heads, f"{len(df)} rows"
    return record


def backoff(model, n_pos: int, max_rows: int, small: int) -> dict:
    """A zero-ablation sweep of the last MLP over random prompts of n_pos tokens, as many as 1.5x the free GPU
    memory holds in one batch (by the sweep's own memory per row, measured), run three ways: batch_size=every row
    (one batch that cannot fit: the back-off must halve it), batch_size="auto", and batch_size=`small` (the
    reference). The three must give the same rows."""
    device, config = model.device, model.config
    site = [resid.Site(config.n_layers - 1, "mlp")]
    g = torch.Generator().manual_seed(0)

    def sweep(ids, size):
        targets = ids[:, 1].tolist()  # any fixed token per row
        return ablation.sweep(model, ids, targets, sites=site, method="zero",
                              execution=Execution(batch_size=size, progress=False))

    def peak_of(rows: int) -> int:
        ids = torch.randint(0, config.d_vocab, (rows, n_pos), generator=g)
        with Peak(device) as peak:
            sweep(ids, rows)
        return peak.bytes

    per_row = max(1, (peak_of(2 * small) - peak_of(small)) // small)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        rows = min(max_rows, math.ceil(1.5 * free / per_row))
    else:  # nothing to exceed on the CPU: the same three runs, small
        free, rows = None, 4 * small
    ids = torch.randint(0, config.d_vocab, (rows, n_pos), generator=g)
    reference_s, reference, reference_peak = once(lambda: sweep(ids, small), device)
    escaped = []
    results = {}
    for label, size in (("one batch", rows), ("auto", "auto")):
        try:
            results[label] = once(lambda size=size: sweep(ids, size), device)
        except torch.cuda.OutOfMemoryError as error:
            escaped.append(f"{label}: {error}".splitlines()[0])
            torch.cuda.empty_cache()
    key = ["prompt_idx", "layer", "part"]
    expected = reference.sort_values(key)["ablated_metric"].to_numpy()
    gaps = {}
    for label, (_, df, _) in results.items():
        got = df.sort_values(key)["ablated_metric"].to_numpy()
        gaps[label] = float(abs(got - expected).max()) if len(got) == len(expected) else float("inf")
    return dict(workload="OOM back-off", rows=rows, tokens=n_pos, per_row_bytes=per_row, free_bytes=free,
                exceeds_memory=free is not None and rows * per_row > free, escaped=escaped,
                seconds={"small": reference_s, **{k: v[0] for k, v in results.items()}},
                peak_bytes={"small": reference_peak, **{k: v[2] for k, v in results.items()}},
                max_gap=gaps, same_rows=all(len(df) == len(reference) for _, df, _ in results.values()))
