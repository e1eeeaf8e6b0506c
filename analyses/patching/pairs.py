"""(clean, corrupt) prompt pairs: what the three patching methods share, as one value (`Pairs`), which positions of
one prompt correspond to which of the other, and what every patching analysis checks first.

    pairs = patching.Pairs(clean, corrupt, targets, baselines=None, metric=None, align=None)
    patching.activation(model, pairs, sites="head")      # patching.atp(model, pairs), patching.path(model, pairs, ...)

Patching puts position p of one prompt into position p of the other, so by default a pair must have the same token
length. Pairs of different lengths need an alignment, `align=`:

    "end"                 the prompts correspond from their last tokens back (-1 to -1, -2 to -2, ...), as far as
                          the shorter one reaches: e.g. a longer subject early in one prompt
    [[(0, 0), (3, 5)], ...]  per pair, (clean position, corrupt position) tuples, prompt-relative (0 = the first
                          real token); positions named nowhere are not patched

Only the aligned positions are patched: a base position without a partner keeps its own activation.

    Pairs        the caller's value: prompts, targets, baselines, metric, alignment (checked when a method runs)
    PromptPairs  the pairs tokenized once, with each pair's aligned positions, as a method's chunks read them
"""

import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import pandas as pd
import torch
from torch import Tensor

from resid.analyses.checks import check_choice
from resid.analyses.distributed.executor import Job
from resid.analyses.inputs import Prompts
from resid.analyses.inputs import prompts as as_prompts
from resid.analyses.metrics import check_metric
from resid.analyses.vocab import token_ids
from resid.batching import BatchSize, run_batched
from resid.errors import ResidError, param
from resid.model import Inputs, Transformer
from resid.seq2seq import EncoderDecoder
from resid.tokenizer import Tokens

PatchDirection = Literal["denoise", "noise"]  # which prompt of a pair is run, which patched in
Align = Literal["end"] | Sequence[Sequence[tuple[int, int]]] | None


@dataclass(frozen=True)
class Pairs:
    """What the three patching methods (activation, atp, path) share, as one value (see the module docstring):
    each clean prompt, its corrupt partner, its target token, its baseline token (None: the metric is
    "target_prob"), the metric ("logit_diff" with baselines, else "target_prob"; or a function of the logits) and
    the alignment of pairs of different token lengths. Prompts are texts (a string is one), resid.Tokens or token
    ids; a target or baseline given once holds for every pair."""

    clean: Inputs
    corrupt: Inputs
    targets: Sequence[str | int] | str | int
    baselines: Sequence[str | int] | str | int | None = None
    metric: str | Callable | None = None
    align: Align = None


# The separate arguments the patching methods took before Pairs, in their old order after the clean prompts.
OLD_ARGUMENTS = ("corrupt", "targets", "baselines", "metric", "align")
DEPRECATED = ("{what}(model, clean, corrupt, targets, baselines, metric=..., align=...) is deprecated and goes in the "
              "next release: pass the pairs as one value, {what}(model, patching.Pairs(clean, corrupt, targets, "
              "baselines, metric=..., align=...), ...).")


def pairs_of(pairs, what: str, **old) -> Pairs:
    """The Pairs value a patching method `what` was given, or, for one release (with a DeprecationWarning), made from
    the old separate arguments (`old`: corrupt, targets, baselines, metric, align as the call gave them)."""
    given = {name: value for name, value in old.items() if value is not None}
    if isinstance(pairs, Pairs):
        if given:
            raise ResidError(f"{what} was given a patching.Pairs value and {', '.join(given)}: those belong to the "
                             f"Pairs (patching.Pairs(clean, corrupt, targets, baselines, metric=..., align=...)); "
                             "drop them here.")
        return pairs
    if "corrupt" not in given or "targets" not in given:
        raise ResidError(f"{what} takes the pairs as one value: {what}(model, patching.Pairs(clean, corrupt, targets, "
                         f"baselines=None, metric=None, align=None), ...); got {type(pairs).__name__} without "
                         "corrupt prompts and targets.")
    warnings.warn(DEPRECATED.format(what=what), DeprecationWarning, stacklevel=3)
    return Pairs(pairs, **given)


def prepare(model: Transformer, pairs: Pairs, direction: str) -> tuple:
    """What every patching analysis checks first: (the pairs tokenized, target ids, baseline ids or None, the
    metric, its name for the table)."""
    check_choice(direction, "direction", ("denoise", "noise"))
    prompts = PromptPairs.of(model, pairs.clean, pairs.corrupt, pairs.align)
    n = len(prompts.clean)
    target_ids = token_ids(model, pairs.targets, n, "target")
    baseline_ids = None if pairs.baselines is None else token_ids(model, pairs.baselines, n, "baseline")
    metric = pairs.metric or ("logit_diff" if baseline_ids is not None else "target_prob")
    return prompts, target_ids, baseline_ids, metric, check_metric(metric, baseline_ids is not None)


def scored(df: pd.DataFrame, direction: str, label: str) -> pd.DataFrame:
    """The direction and metric columns, and score = (patched - corrupt) / (clean - corrupt) (NaN without a span)."""
    df["direction"], df["metric"] = direction, label
    span = df["clean_metric"] - df["corrupt_metric"]
    df["score"] = (df["patched_metric"] - df["corrupt_metric"]) / span.where(span != 0)
    return df


def n_prompts(prompts: Inputs) -> int:
    """How many prompts `prompts` holds: texts (a string is one), resid.Tokens or token ids ([pos] is one)."""
    if isinstance(prompts, Tokens):
        return prompts.ids.shape[0]
    if isinstance(prompts, Tensor):
        return 1 if prompts.dim() == 1 else prompts.shape[0]
    return 1 if isinstance(prompts, str) else len(prompts)


class PromptPairs:
    """(clean, corrupt) prompt pairs, tokenized once, with each pair's aligned positions (None: position p to p)."""

    def __init__(self, clean, corrupt, aligned: list[list[tuple[int, int]]] | None = None,
                 ids: dict[str, list[list[int]]] | None = None):
        self.clean, self.corrupt, self.aligned = clean, corrupt, aligned
        # every prompt's real token ids on the host ("clean", "corrupt"; read once when not given): a chunk's
        # batches and positions are laid out from them without asking the device
        self.ids = ids if ids is not None else {"clean": _real_ids(clean.tokens), "corrupt": _real_ids(corrupt.tokens)}

    @classmethod
    def of(cls, model: Transformer, clean: Inputs, corrupt: Inputs, align: Align = None) -> "PromptPairs":
        """The pairs from texts (a string or a list), resid.Tokens or [batch pos] token ids, one corrupt prompt per
        clean one."""
        listed = [x if isinstance(x, Tensor | Tokens) else ([x] if isinstance(x, str) else list(x))
                  for x in (clean, corrupt)]
        pairs = cls(as_prompts(model, listed[0]), as_prompts(model, listed[1]))
        if len(pairs.clean) != len(pairs.corrupt) or not len(pairs.clean):
            raise ResidError(
                f"Patching needs one corrupt prompt per clean prompt: got {len(pairs.clean)} and "
                f"{len(pairs.corrupt)}."
            )
        lengths = [(len(a), len(b)) for a, b in zip(pairs.ids["clean"], pairs.ids["corrupt"])]
        if align is None:
            for i, (a, b) in enumerate(lengths):
                if a != b:
                    raise ResidError(
                        f"Pair {i}: the clean prompt has {a} tokens and the corrupt one {b}. Patching puts position p "
                        "of one into position p of the other, so each pair needs the same token length (e.g. swap "
                        "names that are one token each), or an alignment: align='end' or align=[[(clean position, "
                        "corrupt position), ...] per pair]."
                    )
            return pairs
        pairs.aligned = _alignment(align, lengths)
        return pairs

    @property
    def same_positions(self) -> bool:
        """True when position p of each prompt is position p of its partner (equal lengths, no alignment)."""
        return self.aligned is None

    def require_same_positions(self, what: str) -> None:
        if not self.same_positions:
            raise ResidError(f"{what} needs pairs of equal token lengths patched position for position; align= is "
                             f"taken by the residual sites ({param('sites', 'resid_pre')}, resid_mid, resid_post) "
                             f"and by "
                             "attribution patching. Drop align= and give pairs of equal lengths.")

    def positions(self, which: str, row: int) -> list[tuple[int, int]]:
        """Pair `row`'s aligned positions as (`which` prompt's position, its partner's position)."""
        if self.aligned is None:
            return [(p, p) for p in range(len(self.ids["clean"][row]))]
        return [(a, b) if which == "clean" else (b, a) for a, b in self.aligned[row]]

    def batch(self, which: str, rows: Sequence[int]) -> Tokens:
        """These pairs' `which` prompts, left-padded to the chunk's width (equal lengths: the same layout)."""
        return Tokens.pad([self.ids[which][row] for row in rows], getattr(self, which).pad_token_id, "left")

    def mapping(self, base: str, rows: Sequence[int], base_tokens: Tokens, donor_tokens: Tokens) -> "Mapping":
        """Where each aligned position of these pairs sits in the base batch and in the donor batch (`batch`'s
        left-padded layout, computed on the host)."""
        donor = "clean" if base == "corrupt" else "corrupt"
        width = {side: max(len(self.ids[side][row]) for row in rows) for side in (base, donor)}
        index, base_cols, donor_cols, clean = [], [], [], []
        for i, row in enumerate(rows):
            aligned = self.positions(base, row)
            shift = {side: width[side] - len(self.ids[side][row]) for side in (base, donor)}
            index += [i] * len(aligned)
            base_cols += [shift[base] + ours for ours, _ in aligned]
            donor_cols += [shift[donor] + theirs for _, theirs in aligned]
            clean += [ours if base == "clean" else theirs for ours, theirs in aligned]
        return Mapping(index, base_cols, donor_cols, clean, self.same_positions, base_tokens.ids.device)


class Mapping:
    """Aligned positions of a chunk: row i of the batch, its column in the base batch and in the donor batch, and
    its position in the clean prompt (how tables name it, whichever prompt is the base); on the host (`*_list`) and
    on the device."""

    def __init__(self, rows: list[int], base: list[int], donor: list[int], clean: list[int], identity: bool,
                 device: torch.device):
        self.row_list, self.base_list, self.clean, self.identity = rows, base, clean, identity
        as_tensor = lambda values: torch.tensor(values, dtype=torch.long, device=device)  # noqa: E731
        self.rows, self.base, self.donor = as_tensor(rows), as_tensor(base), as_tensor(donor)

    def donor_at_base(self, donor: Tensor, base: Tensor) -> Tensor:
        """The patched value of a [batch pos ...] activation: the donor's at each aligned base position, the base
        run's own elsewhere (with equal lengths, the donor's tensor as it is)."""
        if self.identity:
            return donor
        out = base.detach().clone()
        out[self.rows.to(out.device), self.base.to(out.device)] = donor[self.rows.to(out.device),
                                                                        self.donor.to(out.device)]
        return out


def _real_ids(tokens: Tokens) -> list[list[int]]:
    """Each prompt's real token ids (no padding), from two reads of the batch to the host."""
    ids, mask = tokens.ids.tolist(), tokens.attention_mask.tolist()
    return [[token for token, real in zip(row, keep) if real] for row, keep in zip(ids, mask)]


def _alignment(align, lengths: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    if isinstance(align, str):
        if align != "end":
            raise ResidError(f"align must be 'end' or a list of (clean position, corrupt position) lists per pair, "
                             f"got {align!r}.")
        return [[(a - k, b - k) for k in range(min(a, b), 0, -1)] for a, b in lengths]
    align = [list(pair) for pair in align]
    if len(align) != len(lengths):
        raise ResidError(f"align gives {len(align)} alignments for {len(lengths)} pairs: give one list of (clean "
                         "position, corrupt position) per pair.")
    out = []
    for i, (pair, (a, b)) in enumerate(zip(align, lengths)):
        try:
            pair = [(int(p), int(q)) for p, q in pair]
        except (TypeError, ValueError):
            raise ResidError(f"align[{i}] must be a list of (clean position, corrupt position) tuples.") from None
        bad = [(p, q) for p, q in pair if not (0 <= p < a and 0 <= q < b)]
        if bad:
            raise ResidError(f"align[{i}] has positions {bad[:3]} out of range: the clean prompt has {a} tokens (0.."
                             f"{a - 1}) and the corrupt one {b} (0..{b - 1}).")
        if len({p for p, _ in pair}) != len(pair) or len({q for _, q in pair}) != len(pair):
            raise ResidError(f"align[{i}] names a position twice: each position pairs with at most one other.")
        out.append(sorted(pair))
    return out


@dataclass
class PairsJob(Job):
    """Rows of chunks of pairs (attribution and path patching), as plain data: each pair's token ids, the base
    side, the targets and the metric. A chunk's pairs are stored whole, so a pair is done or absent. Subclasses
    compute the rows of some pairs in `rows(model, pairs, indices)` (batched, halved on out-of-memory)."""

    clean: list[list[int]]  # each pair's clean token ids
    corrupt: list[list[int]]
    pad: int
    aligned: list[list[tuple[int, int]]] | None
    base: str  # "corrupt" (denoising) or "clean"
    targets: list[int]
    baselines: list[int] | None
    metric: str | Callable
    batch: int  # pairs per chunk and per forward (halved on out-of-memory)
    settings: dict  # the rest of the signature

    def plan(self, done: set, workers: int | None, per_worker: int) -> list[tuple[int, ...]]:
        finished = {prompt for prompt, _ in done}
        todo = [i for i in range(len(self.clean)) if i not in finished]
        step = self.batch if workers is None else max(1, min(self.batch, -(-len(todo) // (workers * per_worker))))
        return [tuple(todo[i : i + step]) for i in range(0, len(todo), step)]

    def key_values(self) -> dict[str, range]:
        return {"prompt_idx": range(len(self.clean))}

    def signature(self) -> dict:
        return {"pairs": [self.clean, self.corrupt, self.aligned], "base": self.base,
                "targets": [self.targets, self.baselines], **self.settings}

    def setup(self, model: Transformer | EncoderDecoder) -> tuple[Transformer | EncoderDecoder, PromptPairs, BatchSize]:
        prompts = [Prompts(Tokens.pad(ids, self.pad, "left").to(model.device), None, self.pad)
                   for ids in (self.clean, self.corrupt)]
        ids = {"clean": self.clean, "corrupt": self.corrupt}
        return model, PromptPairs(*prompts, self.aligned, ids), BatchSize(self.batch)

    def run(self, state, chunk: tuple[int, ...]) -> Iterator[pd.DataFrame]:
        model, pairs, size = state
        for _, frame in run_batched(list(chunk), lambda rows: self.rows(model, pairs, rows), size):
            yield frame

    def combine(self, pieces: list) -> pd.DataFrame:
        return pd.concat(pieces, ignore_index=True)

    def rows(self, model: Transformer, pairs: "PromptPairs", indices: list[int]) -> pd.DataFrame:
        raise NotImplementedError

    @classmethod
    def of(cls, pairs: "PromptPairs", base: str, targets, baselines, metric, batch: int, settings: dict, **fields):
        """The job over every pair of `pairs`."""
        return cls(pairs.ids["clean"], pairs.ids["corrupt"], pairs.clean.pad_token_id,
                   pairs.aligned, base, list(targets), None if baselines is None else list(baselines), metric,
                   batch, settings, **fields)
