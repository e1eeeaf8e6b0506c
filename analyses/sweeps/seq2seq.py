"""Sweeps of encoder-decoder models (resid.EncoderDecoder): the prompts are the decoder's target prefixes, each
with its source, and the metric is read at the decoder's next token, as for any model.

Sites are on either stack: the decoder's (self-attention, cross-attention, MLP: `layers[l].cross.head[h]`) and the
encoder's (Site(..., stack="encoder"): `encoder.layers[l].attn.head[h]`, `encoder.layers[l].mlp`). A decoder row
resumes the decoder from its layer with the clean encoded source; an encoder row resumes the encoder from its layer
and runs the whole decoder on what it encodes (an encoder edit changes every cross-attention).

Methods: zero; mean, over the sweep's own pairs (a decoder site's mean over the prompts' real tokens, an encoder
site's over the sources' real tokens; per position: by each side's position ids), since reference texts would
need reference sources; resample, from another pair whose prompt and source have the same token lengths.
"""

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from resid.analyses import site_words
from resid.analyses.distributed.driver import drive
from resid.analyses.distributed.execution import Execution
from resid.analyses.distributed.executor import Executor, InProcess, Job
from resid.analyses.sweeps import values
from resid.capture import Capture
from resid.errors import ResidError, param
from resid.model import Memory
from resid.seq2seq import EncoderDecoder
from resid.sites import Site
from resid.tokenizer import Tokens


@dataclass(frozen=True)
class SourceIds:
    """The sources of a sweep's prompts, as plain data (token ids): one per prompt, and for patching one per donor."""

    sequences: list[list[int]]  # each prompt's source's real token ids
    pad: int
    donors: list[list[int]] | None = None  # patching: each prompt's donor's source (resample: the donor prompt's own)

    def of(self, group: Sequence[int], donors: list | None) -> list[list[int]]:
        """The sources of these prompts, then (with donors) of their donors, in the order of a clean pass."""
        chosen = [self.sequences[p] for p in group]
        if donors is not None:
            chosen += [self.sequences[donors[p]] if isinstance(donors[p], int) else self.donors[p] for p in group]
        return chosen

    def digest(self) -> list:
        return [self.sequences, self.donors]


def plain(site: Site) -> Site:
    """The site as its own stack's Transformer names it (an encoder site without its stack)."""
    return dataclasses.replace(site, stack=None) if site.stack is not None else site


def resume_encoder(ctx, group, layer: int, resid_pre: Tensor, index: Tensor, edits: list, at) -> Tensor:
    """Logits [rows 1 d_vocab] of rows whose edits are on the encoder: the encoder resumed from `layer` with
    them, then the decoder over the clean target prefixes reading what it encoded."""
    sources = group.sources.rows(index)
    on_encoder = [dataclasses.replace(edit, site=plain(edit.site)) for edit in edits]
    hidden = ctx.encoder.resume(layer, resid_pre, sources, on_encoder)  # the final hidden state, every position
    memory = Memory(hidden, sources.attention_mask)
    return ctx.model.resume(0, group.clean.stream.resid_pre(0)[index], group.tokens.rows(index), logits_at=at,
                            memory=memory)


def expand(model: EncoderDecoder, sites, n_positions: int, n_source: int, name: str = "sites") -> list[Site]:
    """The Sites of a word on both stacks (the encoder's first, labelled "encoder.<label>"), or of a list of Sites
    / labels, each resolved against the stack it names."""
    if not isinstance(sites, str):
        return site_words.expand(sites, model.config, n_positions, name, resolve=model.resolve)
    encoder = site_words.expand(sites, model.encoder.config, n_source, name)
    return [*(dataclasses.replace(s, stack="encoder") for s in encoder),
            *site_words.expand(sites, model.config, n_positions, name)]


def donors(lengths: list[int], source_lengths: list[int], seed: int, reference) -> list[int]:
    """Resample donors: for each pair, another pair whose prompt and source have the same token lengths."""
    if reference is not None:
        raise ResidError(f"Resample ablation of an encoder-decoder model draws its donors among the pairs; drop "
                         f"{param('reference')}.")
    try:
        pairs = list(zip(lengths, source_lengths))
        kinds = {pair: i for i, pair in enumerate(sorted(set(pairs)))}  # donors are drawn among equal kinds
        return values.random_donors([kinds[pair] for pair in pairs], seed)
    except ResidError:
        raise ResidError("Resample ablation of an encoder-decoder model needs, for each pair, another pair whose "
                         "target prefix and source have the same token counts; some pair has none. Give pairs of "
                         "equal lengths.") from None


def in_process(executor: Executor | str | None) -> None:
    """Encoder-decoder jobs run in the driver's process for now (an Execution's executor None, or InProcess): Ray
    workers load decoder-only models."""
    if executor not in (None, "inprocess") and not isinstance(executor, InProcess):
        raise ResidError(f"Encoder-decoder models are swept and patched in process for now: drop "
                         f"{param('executor')} (and workers).")


def means(model: EncoderDecoder, sites: list[Site], sequences: list[list[int]], pad: int, sources: SourceIds,
          per_position: bool, batch: int, execution: Execution) -> dict:
    """{whole site: float64 array} over the sweep's own pairs: [dim...] agnostic, [n_positions dim...] per position
    (each side's positions); a reduction of the one driver over chunks of `batch` pairs, with the sweep's progress
    (`execution`: the sweep's, in process)."""
    patterns = [site for site in sites if site.what == "pattern"]
    if patterns:
        raise ResidError(f"Attention patterns have no mean (their key axis is each text's own length): "
                         f"{patterns[0].label}. Ablate patterns with {param('method', 'zero')} or "
                         f"{param('method', 'resample')}.")
    return drive(model, MeansJob(sites, sequences, pad, sources, per_position, batch), execution)


@dataclass
class MeansJob(Job):
    """The means over the pairs as a reduction: each chunk (a range of pairs, one forward) gives every site's sums
    and each stack's token counts on the host; `finish` adds them up in chunk order and divides."""

    sites: list[Site]  # whole sites on either stack
    sequences: list[list[int]]  # the prompts' (target prefixes') token ids
    pad: int
    sources: SourceIds
    per_position: bool
    batch: int  # pairs per forward

    name = "means over the pairs"
    unit = "pair"

    def plan(self, done: set, workers: int | None, per_worker: int) -> list[range]:
        n = len(self.sequences)
        return [range(start, min(n, start + self.batch)) for start in range(0, n, self.batch)]

    def size(self, rows: range) -> int:
        return len(rows)

    def width(self) -> dict:
        return {None: max(map(len, self.sequences)), "encoder": max(map(len, self.sources.sequences))}

    def setup(self, model: EncoderDecoder) -> EncoderDecoder:
        return model

    def run(self, model: EncoderDecoder, rows: range) -> Iterator[tuple[dict, dict]]:
        by_stack = {None: [s for s in self.sites if s.stack is None],
                    "encoder": [s for s in self.sites if s.stack is not None]}
        width = self.width()
        counts = {stack: torch.zeros(width[stack] if self.per_position else 1, dtype=torch.float64) for stack in width}
        sums: dict = {}
        run = model.run(Tokens.pad([self.sources.sequences[i] for i in rows], self.sources.pad, "right"),
                        Tokens.pad([self.sequences[i] for i in rows], self.pad, "right"),
                        capture=Capture.of(by_stack[None]), encoder_capture=Capture.of(map(plain, by_stack["encoder"])))
        for stack, tokens in ((None, run.tokens), ("encoder", run.encoder.tokens)):
            mask = tokens.attention_mask
            slot = (tokens.position_ids[mask] if self.per_position
                    else torch.zeros(int(mask.sum()), dtype=torch.long)).cpu()
            counts[stack] += torch.bincount(slot, minlength=len(counts[stack]))[: len(counts[stack])].double()
            for site in by_stack[stack]:
                found = run.read(site)[mask].double().cpu()
                total = sums.setdefault(site, torch.zeros((len(counts[stack]), *found.shape[1:]), dtype=torch.float64))
                total.index_add_(0, slot, found)
        yield counts, sums

    def combine(self, pieces: list) -> tuple[dict, dict]:
        return pieces[0]

    def finish(self, results: list) -> dict:
        counts: dict = {}
        sums: dict = {}
        for part_counts, part_sums in results:  # in chunk order
            for stack, count in part_counts.items():
                counts[stack] = counts[stack] + count if stack in counts else count
            for site, total in part_sums.items():
                sums[site] = sums[site] + total if site in sums else total
        out = {}
        for site, total in sums.items():
            mean = (total / counts[site.stack].reshape(-1, *([1] * (total.ndim - 1)))).numpy()
            out[site] = mean if self.per_position else mean[0, ...]
        return out
