"""Mean-ablation reference statistics as a reduction on an executor: each chunk of reference texts gives sums and
token counts per unit, and the driver adds the chunks up in chunk order, so the means are the same whoever
computed which chunk (and equal to the in-process ones).

The rules are those of resid.analyses.sweeps.values: texts are cut to the longest prompt's token count and right-
padded; agnostic means average every real token, per-position means average each position id (0 = first real
token) and need the texts to reach every position the prompts use.
"""

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from resid.analyses.distributed.driver import drive
from resid.analyses.distributed.execution import Execution, as_execution
from resid.analyses.distributed.executor import Job
from resid.batching import BatchSize, model_batch_size, with_backoff
from resid.capture import Capture
from resid.dictionaries.check import on_device
from resid.errors import ResidError, param
from resid.model import Transformer
from resid.sites import Site
from resid.tokenizer import Tokens

Sums = tuple[dict, np.ndarray]  # ({site: float64 [slot dim...]}, float64 [slot] token counts); slot: position id or 0


@dataclass
class MeanJob(Job):
    """Per chunk of reference texts (token ids), the sums of every site over their real tokens; `finish` adds
    the chunks up in chunk order."""

    sites: list[Site]  # whole sites (no positions)
    per_position: bool
    n_positions: int
    pad: int
    batch_size: int | str
    chunks: list[list[list[int]]]  # the reference texts' token ids, in chunks of a batch
    dictionaries: tuple = ()  # learned dictionaries whose features are among the sites

    name = "reference means"

    def plan(self, done: set, workers: int | None, per_worker: int) -> list[list[list[int]]]:
        planned, self.chunks = self.chunks, []  # the texts travel with their chunks, not with the job
        return planned

    def setup(self, model: Transformer) -> tuple[Transformer, BatchSize, tuple]:
        size = model_batch_size(model, self.n_positions) if self.batch_size == "auto" else self.batch_size
        return model, BatchSize(size), on_device(self.dictionaries, model)

    def run(self, state: tuple[Transformer, BatchSize, tuple], chunk: list[list[int]]) -> Iterator[Sums]:
        """The chunk's sums and counts, added up on the model's device (padding adds exact zeros) and moved to the
        host once, at the chunk's end."""
        model, size, dictionaries = state
        slots = self.n_positions if self.per_position else 1
        counts = torch.zeros(slots, dtype=torch.float64, device=model.device)
        sums: dict = {}
        start = 0
        while start < len(chunk):
            def work(rows: int, start: int = start) -> tuple[int, Tokens, list]:
                tokens = Tokens.pad(chunk[start : start + rows], self.pad, "right").to(model.device)
                run = model.run(tokens, capture=Capture.of(self.sites), logits_at="last", dictionaries=dictionaries)
                return min(rows, len(chunk) - start), tokens, [run.read(site) for site in self.sites]

            done, tokens, found = with_backoff(work, size)  # summed only once the batch is through
            mask = tokens.attention_mask  # [batch pos]
            slot = (tokens.position_ids if self.per_position else torch.zeros_like(tokens.position_ids)).flatten()
            counts.index_add_(0, slot, mask.flatten().double())
            for site, values in zip(self.sites, found):  # [batch pos dim...]
                real = mask.view(*mask.shape, *([1] * (values.ndim - 2)))
                values = torch.where(real, values.double(), 0.0).flatten(0, 1)
                total = sums.setdefault(site, torch.zeros((slots, *values.shape[1:]), dtype=torch.float64,
                                                          device=model.device))
                total.index_add_(0, slot, values)
            start += done
        flat = torch.cat([counts, *(total.flatten() for total in sums.values())]).cpu().numpy()
        on_host, at = {}, slots
        for site, total in sums.items():
            on_host[site] = flat[at:at + total.numel()].reshape(total.shape)
            at += total.numel()
        yield on_host, flat[:slots]

    def combine(self, pieces: list) -> Sums:
        return pieces[0]


def reference_means(
    model: Transformer, sites: list[Site], texts: list[str], n_positions: int, per_position: bool, batch: int,
    dictionaries: tuple = (), execution: Execution | None = None,
) -> dict:
    """{site: float64 array}: [dim...] agnostic, [n_positions dim...] per position; chunks of `batch` texts, each
    run in forward passes of execution.batch_size texts ("auto": from the worker's device) on its executor (the
    sweep's: resid.analyses.sweeps.chunks.SweepJob.prepare), with its progress bar. The means keep no store: an
    Execution with `out` is refused by the driver."""
    patterns = [site for site in sites if site.what == "pattern"]
    if patterns:
        raise ResidError(f"Attention patterns have no mean over reference texts (their key axis is each text's own "
                         f"length): {patterns[0].label}. Ablate patterns with {param('method', 'zero')} or "
                         f"{param('method', 'resample')}.")
    tokenizer = model.require_tokenizer()
    encoded = [ids[:n_positions] for ids in (tokenizer.encode(t) for t in texts) if ids]
    chunks = [encoded[start : start + batch] for start in range(0, len(encoded), batch)]
    execution = as_execution(execution)
    job = MeanJob(sites, per_position, n_positions, tokenizer.pad_token_id, execution.batch_size, chunks, dictionaries)
    parts = drive(model, job, execution)
    slots = n_positions if per_position else 1
    counts = np.zeros(slots)
    sums: dict = {}
    for part_sums, part_counts in parts:  # in chunk order: float64 sums do not depend on who finished first
        counts += part_counts
        for site, total in part_sums.items():
            sums[site] = sums[site] + total if site in sums else total.copy()
    if counts.sum() == 0:
        raise ResidError("The reference texts gave no tokens to average over.")
    if per_position and (counts == 0).any():
        first = int(np.flatnonzero(counts == 0)[0])
        raise ResidError(
            f"Per-position means need reference texts at least as long as the prompts ({n_positions} tokens); "
            f"no reference text reaches position {first}. Add longer texts or use position-agnostic means."
        )
    means = {site: total / counts.reshape(-1, *([1] * (total.ndim - 1))) for site, total in sums.items()}
    return means if per_position else {site: mean[0, ...] for site, mean in means.items()}  # 0-d for a neuron
