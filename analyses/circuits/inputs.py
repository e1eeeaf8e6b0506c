"""The (clean, corrupt) pairs a circuit is found and measured on, and its metric: the one place resid.analyses.circuits
reads the patching package (resid.analyses.patching.pairs: tokenized pairs, target and baseline ids, the checks).

Pairs must have equal token lengths (an edge is patched position for position). The metric is one of
resid.analyses.metrics' names ("logit_diff" with baselines, "logit", "target_prob", "loss"), "kl" (the KL divergence
of the patched run's next-token distribution from the clean run's: 0 at the clean model), or a function
f(logits [rows d_vocab], targets [rows], baselines [rows] or None) -> [rows].

Encoder-decoder models (resid.EncoderDecoder): the prompts are the decoder's target prefixes and each reads its own
source, `source` for the clean prompts and `corrupt_source` for the corrupt ones (resid.analyses.patching.sources),
of equal token lengths too (the encoder's edges are patched position for position).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from resid.analyses.circuits.seq2seq import Model
from resid.analyses.metrics import metric_values
from resid.analyses.patching.pairs import Pairs, PairsJob, PromptPairs, n_prompts, prepare
from resid.analyses.patching.sources import pair_sources
from resid.errors import ResidError, param
from resid.model import Inputs

__all__ = ["CircuitPairs", "PairsJob", "PromptPairs", "measure", "pairs_of"]

KL = "kl"


@dataclass(frozen=True)
class CircuitPairs:
    """Tokenized pairs with each pair's target (and baseline) token id and the metric."""

    pairs: PromptPairs
    targets: list[int]
    baselines: list[int] | None
    metric: str | Callable
    label: str  # the metric's name in tables
    sources: tuple = ()  # encoder-decoders: (clean sources' ids, corrupt sources' ids, pad id); () otherwise

    def __len__(self) -> int:
        return len(self.pairs.clean)


def pairs_of(model: Model, clean: Inputs, corrupt: Inputs, targets: Sequence[str | int] | str | int,
             baselines: Sequence[str | int] | str | int | None, metric: str | Callable | None,
             source: Inputs | None = None, corrupt_source: Inputs | None = None) -> CircuitPairs:
    """The pairs, checked: one corrupt prompt per clean one, of the same token length, targets (and baselines) one
    per pair; an encoder-decoder model's sources too (see the module docstring)."""
    kl = metric == KL
    decoder, sources = pair_sources(model, source, corrupt_source, n_prompts(clean))
    given = Pairs(clean, corrupt, targets, baselines, None if kl else metric)
    pairs, target_ids, baseline_ids, metric, label = prepare(decoder, given, "denoise")
    pairs.require_same_positions("An edge circuit")
    if kl:
        metric = label = KL
    ids = ()
    if sources is not None:
        lengths = zip(sources.clean.tokens.lengths.tolist(), sources.corrupt.tokens.lengths.tolist())
        for i, (a, b) in enumerate(lengths):
            if a != b:
                raise ResidError(f"Pair {i}: the clean source has {a} tokens and the corrupt one {b}. An edge circuit "
                                 "patches the encoder's edges position for position: give sources of equal token "
                                 "lengths.")
        every = range(len(pairs.clean))
        ids = (sources.clean.sequences(every), sources.corrupt.sequences(every), sources.clean.pad_token_id)
    return CircuitPairs(pairs, list(target_ids), None if baseline_ids is None else list(baseline_ids), metric, label,
                        ids)


def measure(
    metric: str | Callable,
    logits: Float[Tensor, "rows d_vocab"],
    targets: Int[Tensor, "rows"],
    baselines: Int[Tensor, "rows"] | None,
    clean: Float[Tensor, "rows d_vocab"] | None = None,
) -> Float[Tensor, "rows"]:
    """The metric of each row's last-token logits; "kl" needs the clean run's logits of the same rows."""
    if metric != KL:
        return metric_values(metric, logits, targets, baselines)
    if clean is None:
        raise ResidError(f"{param('metric', KL)} compares with the clean run's logits, which were not given.")
    log_p = torch.log_softmax(clean.float(), dim=-1)
    log_q = torch.log_softmax(logits.float(), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)
