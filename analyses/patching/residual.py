"""Exact patching of the residual stream (sites="resid_pre"): each layer's entering residual, patched at one
position at a time, resumed from that layer (the prefix is the base run's); one row per (pair, layer, aligned
position). The pairs are cut into chunks of `batch` pairs that any executor runs (resid.analyses.distributed): the job
carries the token ids, never weights. A chunk's pairs are stored whole, so a pair with any stored row is done.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pandas as pd
import torch
from tqdm.auto import tqdm

from resid.analyses.distributed.executor import Executor, Job, resolve
from resid.analyses.inputs import Prompts, batch_size_for
from resid.analyses.io.store import ResultStore
from resid.analyses.metrics import metric_values
from resid.analyses.patching.pairs import Pairs
from resid.batching import BatchSize, run_batched
from resid.capture import Capture
from resid.model import Transformer
from resid.tokenizer import Tokens


def residual_stream(model: Transformer, pairs: Pairs, base: str, targets, baselines, metric, batch_size,
                    store: ResultStore | None, executor: Executor | str | None, workers: int | None,
                    progress: bool) -> pd.DataFrame:
    """Every (pair, layer, position) row, pair-major; finished chunks go to `store` as they arrive."""
    size = batch_size_for(model, pairs.clean.tokens, batch_size)
    done = {prompt for prompt, _ in store.done()} if store is not None else set()
    todo = [i for i in range(len(pairs.clean)) if i not in done]
    chunks = [tuple(todo[i : i + size.value]) for i in range(0, len(todo), size.value)]
    every = range(len(pairs.clean))
    job = ResidJob(pairs.clean.sequences(every), pairs.corrupt.sequences(every), pairs.clean.pad_token_id,
                   pairs.aligned, base, list(targets), None if baselines is None else list(baselines), metric,
                   size.value)
    runner, owned = resolve(executor, workers)
    frames = []
    try:
        with tqdm(total=len(chunks), desc="resid_pre patching", disable=not progress) as bar:
            for _, frame in runner.map(model, job, chunks):
                if store is not None:
                    store.write(frame)
                frames.append(frame)
                bar.update(1)
    finally:
        if owned:
            runner.close()
    if store is not None:
        df = store.finish().astype({name: "Int64" for name in ("layer", "position", "head", "neuron")})
    else:
        df = pd.concat(frames, ignore_index=True)
    return df.sort_values(["prompt_idx", "layer", "position"], kind="stable").reset_index(drop=True)


@dataclass
class ResidJob(Job):
    """What a worker needs for resid_pre rows, as plain data."""

    clean: list[list[int]]  # each pair's clean token ids
    corrupt: list[list[int]]
    pad: int
    aligned: list[list[tuple[int, int]]] | None
    base: str  # "corrupt" (denoising) or "clean"
    targets: list[int]
    baselines: list[int] | None
    metric: str | Callable
    batch: int  # pairs per forward, halved on out-of-memory

    def setup(self, model: Transformer) -> tuple[Transformer, Pairs, BatchSize]:
        prompts = [Prompts(Tokens.pad(ids, self.pad, "left").to(model.device), None, self.pad)
                   for ids in (self.clean, self.corrupt)]
        return model, Pairs(*prompts, self.aligned), BatchSize(self.batch)

    def run(self, state, chunk: tuple[int, ...]) -> Iterator[pd.DataFrame]:
        model, pairs, size = state
        def work(rows):
            return _chunk(model, pairs, self.base, rows, self.targets, self.baselines, self.metric)

        for _, frame in run_batched(list(chunk), work, size):
            yield frame

    def combine(self, pieces: list) -> pd.DataFrame:
        return pd.concat(pieces, ignore_index=True)


@torch.no_grad()
def _chunk(model: Transformer, pairs: Pairs, base: str, chunk, targets, baselines, metric) -> pd.DataFrame:
    donor = "clean" if base == "corrupt" else "corrupt"
    base_tokens, donor_tokens = pairs.batch(base, chunk), pairs.batch(donor, chunk)
    base_run = model.run(base_tokens, capture=Capture(final_norm_scale=False), logits_at="last")
    donor_run = model.run(donor_tokens, capture=Capture(final_norm_scale=False), logits_at="last")
    at = pairs.mapping(base, chunk, base_tokens, donor_tokens)  # one row per aligned position
    t = torch.tensor([targets[chunk[b]] for b in at.rows.tolist()], device=model.device)
    bl = None if baselines is None else torch.tensor([baselines[chunk[b]] for b in at.rows.tolist()],
                                                     device=model.device)
    records, rows = [], torch.arange(len(at.rows), device=model.device)
    running = zip(base_run.stream.running("layer"), donor_run.stream.running("layer"))
    for layer, ((_, _, resid), (_, _, patch)) in zip(range(model.config.n_layers), running):
        patched = resid[at.rows].clone()
        patched[rows, at.base] = patch[at.rows, at.donor]
        logits = model.resume(layer, patched, base_tokens.rows(at.rows), logits_at="last")
        values = metric_values(metric, logits[:, 0], t, bl).double().cpu().numpy()
        records += [(chunk[b], f"resid_pre {layer} pos {p}", layer, p, v)
                    for b, p, v in zip(at.rows.tolist(), at.clean, values)]
    frame = pd.DataFrame(records, columns=["prompt_idx", "site", "layer", "position", "patched_metric"])
    frame["part"] = "resid_pre"
    for name in ("head", "neuron"):
        frame[name] = pd.array([None] * len(frame), dtype="Int64")
    frame["layer"] = frame["layer"].astype("Int64")
    frame["position"] = frame["position"].astype("Int64")
    return frame
