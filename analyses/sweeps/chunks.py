"""The job of a sweep (an ablation sweep, or exact patching: resample ablation with the other prompt of each pair as
the donor), and its chunks, which the one driver (resid.analyses.distributed.driver) runs on any executor.

A chunk is a block of prompts x a block of sites, minus the rows a resumed sweep already stored (and the rows
that do not exist: a residual site at a position past a prompt's end). In process, the blocks are `batch`
prompts (one clean pass) x every site: the engine's loop as it always ran, each batch of rows persisted as soon
as it is computed. On W remote workers the chunks are as few and as large as
the work allows, because each one costs a fixed overhead: W x chunks_per_worker of them, more when chunks
would hold more than about MAX_CHUNK_ROWS rows. Two ways to cut, with different overheads:
- prompts: every layer's rows of a prompt block go through one resumed forward, so a smaller block means more,
  smaller forwards (on a CPU, a forward of a few rows costs about as much as three more rows);
- sites: each block of sites runs its own clean pass of the prompts (one full forward per prompt).
Prompt blocks are therefore kept at a quarter of a batch or more, and sites are cut after that, into runs of
consecutive layers (each layer's rows stay in one forward) of about equal cost: an ablation entering layer L
reruns the n_layers - L layers after it, plus what every row costs wherever it starts (ROW_COST).
Chunks depend on the inputs, the batch size and the executor's workers; the rows they compute do not.
A job's signature (what a resumed store must match) records its inputs; `dictionaries_digest` is what it records
of learned dictionaries, for every job whose sites name features (attribution patching's too).
"""

import hashlib
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pandas as pd
import torch

from resid.analyses.distributed.execution import Execution
from resid.analyses.distributed.executor import Job
from resid.analyses.sweeps import seq2seq
from resid.analyses.sweeps.means import reference_means
from resid.analyses.sweeps.rows import Context, ablate_group, clean_pass, edited, start_layer
from resid.analyses.sweeps.seq2seq import SourceIds
from resid.batching import BatchSize, model_batch_size, with_backoff
from resid.dictionaries.check import on_device
from resid.model import Transformer
from resid.seq2seq import EncoderDecoder
from resid.sites import RESID_PARTS, Site

MAX_CHUNK_ROWS = 4096  # remote chunks: about this many (prompt, site) rows at most, so a lost chunk costs little
# What a row costs besides its layers, in layers: its unembedding, metric and share of its forward's fixed costs
# (SmolLM2-135M on a CPU, 14-token prompts: two halves split by layer cost alone took 15.2 s and 17.5 s; this
# weight evens them out).
ROW_COST = 4


@dataclass(frozen=True)
class SweepChunk:
    prompts: tuple[int, ...]  # global indices of the prompts with rows to compute, ascending
    rows: tuple[tuple[int, int], ...]  # (prompt index, site index) pairs to compute, prompt-major


def layout(n_prompts: int, sites: list[Site], todo: Callable[[int, int], bool], batch: int, n_layers: int,
         workers: int | None = None, per_worker: int = 1, encoder_layers: int = 0) -> list[SweepChunk]:
    """The chunks of a sweep (see the module docstring): the in-process layout for workers=None, else at least
    workers x per_worker chunks where the rows allow. Only rows (prompt, site index) with todo(...) true are
    kept (not stored by a resumed sweep, and existing for that prompt); empty chunks are left out."""
    n_sites = len(sites)
    if workers is None:
        prompt_blocks, site_blocks = [range(s, min(n_prompts, s + batch)) for s in range(0, n_prompts, batch)], 1
    else:
        wanted = workers * max(per_worker, math.ceil(n_prompts * n_sites / (MAX_CHUNK_ROWS * workers)))
        count = max(math.ceil(n_prompts / batch), min(wanted, n_prompts // max(1, batch // 4)))
        prompt_blocks = [range(n_prompts * i // count, n_prompts * (i + 1) // count) for i in range(count)]
        site_blocks = min(n_sites, math.ceil(wanted / count))
    chunks = []
    for prompts in prompt_blocks:
        for block in _site_blocks(sites, n_layers, site_blocks, encoder_layers):
            rows = tuple((p, s) for p in prompts for s in block if todo(p, s))
            if rows:
                chunks.append(SweepChunk(tuple(sorted({p for p, _ in rows})), rows))
    return chunks


def _site_blocks(sites: list[Site], n_layers: int, blocks: int, encoder_layers: int = 0) -> list[list[int]]:
    """Site indices in `blocks` runs of consecutive start layers, each of about the same cost; whole layers
    (one forward each) unless more blocks than layers are asked for (encoder layers count before the decoder's)."""
    units: dict[object, list[int]] = {}
    start = [start_layer(site, encoder_layers) for site in sites]
    for s in sorted(range(len(sites)), key=lambda s: (start[s], s)):
        units.setdefault(start[s] if blocks <= n_layers + encoder_layers else s, []).append(s)
    cost = [sum(n_layers - start[s] + ROW_COST for s in unit) for unit in units.values()]
    total, before, out = sum(cost), 0, [[] for _ in range(blocks)]
    for unit, c in zip(units.values(), cost):
        out[min(blocks - 1, int((before + c / 2) * blocks / total))] += unit  # by the cost at its middle
        before += c
    return [sorted(block) for block in out if block]


@dataclass
class SweepJob(Job):
    """Every (prompt, site) row of a sweep or of exact patching, as plain data (token ids, never weights)."""

    sequences: list[list[int]]  # every prompt's real token ids
    pad: int
    target_ids: list[int]
    baseline_ids: list[int] | None
    donors: list | None  # resample / patching: per prompt, another prompt's index or the donor's token ids
    sites: list[Site]
    method: str
    metric: str | Callable
    means: dict  # mean ablation: Site -> float64 array, [dim...] or [position dim...] (per_position)
    per_position: bool
    read_at: list[int] | None  # masked-LM models: each prompt's [MASK]
    batch_size: int | str  # "auto": from the worker's own device
    chunk_batch: int  # prompts per in-process chunk (the driver's batch size)
    n_layers: int
    settings: dict = field(default_factory=dict)  # the rest of the signature (analysis, reference digest, ...)
    # patching: per prompt, {named position: (base position, donor position)} (None: each position itself)
    aligned: list[dict[int, tuple[int, int]]] | None = None
    donor_metric: bool = False  # rows carry the donor run's metric (patching)
    reference: list[str] | None = None  # mean ablation: the reference texts the means are taken over
    dictionaries: tuple = ()  # learned dictionaries whose features are sites (they travel with the job)
    sources: SourceIds | None = None  # encoder-decoder models: each prompt's source (resid.analyses.sweeps.seq2seq)
    encoder_layers: int = 0  # encoder-decoder models: the encoder's layers

    name = "sites"
    key = ("prompt_idx", "site")
    finite = ("clean_metric", "ablated_metric", "delta")

    def plan(self, done: set, workers: int | None, per_worker: int) -> list[SweepChunk]:
        labels = [site.label for site in self.sites]
        lengths = [len(ids) for ids in self.sequences]
        sources = None if self.sources is None else [len(ids) for ids in self.sources.sequences]

        def todo(prompt: int, s: int) -> bool:
            site = self.sites[s]
            length = lengths[prompt] if site.stack is None else sources[prompt]
            return (prompt, labels[s]) not in done and self._exists(prompt, site, length)

        return layout(len(self.sequences), self.sites, todo, self.chunk_batch, self.n_layers, workers, per_worker,
                      self.encoder_layers)

    def key_values(self) -> dict[str, range | set[str]]:
        return {"prompt_idx": range(len(self.sequences)), "site": {site.label for site in self.sites}}

    def size(self, chunk: SweepChunk) -> int:
        """The rows a chunk returns: one per (prompt, site) it computes (the progress bar counts rows of rows)."""
        return len(chunk.rows)

    def prepare(self, model: Transformer | EncoderDecoder, execution: Execution, chunks: list) -> None:
        """Mean ablation: the reference means of every edited site, by the sweep's Execution (its started executor,
        its progress), if rows are left."""
        if self.method != "mean" or not chunks or self.means:
            return
        whole = sorted({edit.whole for site in self.sites for edit in edited(site, model.config)}, key=str)
        if self.sources is not None:  # encoder-decoder models: means over the pairs themselves
            self.means = seq2seq.means(model, whole, self.sequences, self.pad, self.sources, self.per_position,
                                       self.chunk_batch, execution)
            return
        width = max(len(ids) for ids in self.sequences)
        self.means = reference_means(model, whole, self.reference, width, self.per_position, self.chunk_batch,
                                     self.dictionaries, execution)

    def _exists(self, prompt: int, site: Site, length: int) -> bool:
        """Residual sites of a layer x position map exist only at the prompt's own (aligned) positions."""
        if site.part not in RESID_PARTS or site.positions is None:
            return True
        if self.aligned is not None and site.stack is None:
            return all(p in self.aligned[prompt] for p in site.positions)
        return all(-length <= p < length for p in site.positions)

    def signature(self) -> dict:
        def digest(value) -> str:
            return hashlib.sha256(json.dumps(value, default=str).encode()).hexdigest()[:16]

        return {
            "prompts": digest([self.sequences, self.target_ids, self.baseline_ids]),
            "sites": digest([site.label for site in self.sites]),
            "donors": digest(self.donors),
            "aligned": digest(None if self.aligned is None else [sorted(a.items()) for a in self.aligned]),
            "method": self.method,
            "read_at": self.read_at,
            **({} if self.sources is None else {"sources": digest(self.sources.digest())}),
            **self.settings,
        }

    def setup(self, model: Transformer | EncoderDecoder) -> Context:
        width = max(len(ids) for ids in self.sequences)
        decoder = model.decoder if isinstance(model, EncoderDecoder) else model
        size = model_batch_size(decoder, width) if self.batch_size == "auto" else self.batch_size
        means = {site: torch.tensor(mean).to(decoder.dtype).to(model.device) for site, mean in self.means.items()}
        encoder = model.encoder if isinstance(model, EncoderDecoder) else None
        return Context(decoder, self.method, self.metric, means, self.per_position, BatchSize(size), self.read_at,
                       self.aligned, self.donor_metric, on_device(self.dictionaries, decoder), encoder)

    def run(self, state: Context, chunk: SweepChunk) -> Iterator[pd.DataFrame]:
        prompts, start = list(chunk.prompts), 0
        while start < len(prompts):
            def clean(rows: int, start: int = start):
                group = prompts[start : start + rows]
                members = set(group)
                todo = [(p, self.sites[s]) for p, s in chunk.rows if p in members]
                return todo, clean_pass(state, self.sequences, self.pad, group, todo, self.target_ids,
                                        self.baseline_ids, self.donors, self.sources)

            todo, group = with_backoff(clean, state.size)  # out of memory: fewer prompts per clean pass
            yield from ablate_group(state, group, todo)
            start += len(group.prompts)

    def combine(self, pieces: list) -> pd.DataFrame:
        return pd.concat(pieces, ignore_index=True)


def dictionaries_digest(dictionaries: tuple) -> str | None:
    """What the signature records of the dictionaries: a hash of their names and weights (None without any), so
    that a store written with other dictionaries is refused, never resumed."""
    if not dictionaries:
        return None
    digest = hashlib.sha256()
    for d in dictionaries:
        digest.update(f"{d.name};".encode())
        for name, parameter in d.named_parameters():
            data = parameter.detach().float().contiguous().cpu()
            digest.update(f"{name} {tuple(data.shape)};".encode())
            digest.update(data.view(torch.uint8).reshape(-1).numpy().data)
    return digest.hexdigest()
