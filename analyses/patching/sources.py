"""The sources of (clean, corrupt) pairs of an encoder-decoder model (resid.EncoderDecoder): the prompts of a pair
are the decoder's target prefixes, and each prompt reads its own source, `source=` for the clean prompts and
`corrupt_source=` for the corrupt ones (default: the clean sources; give other sources to corrupt the source side,
e.g. one name swapped in the sentence to translate).

Patching a decoder site puts the donor run's activation (computed reading the donor's source) into the base run
(reading its own source); patching an encoder site puts the donor source's activation, position for position, into
the base source's encoder, so those pairs' sources need the same token lengths.
"""

from dataclasses import dataclass

from resid.analyses.inputs import Prompts, check_sources, decoder_of
from resid.analyses.inputs import prompts as as_prompts
from resid.analyses.sweeps.seq2seq import SourceIds
from resid.errors import ResidError, param
from resid.model import Inputs, Transformer
from resid.seq2seq import EncoderDecoder
from resid.sites import Site


@dataclass(frozen=True)
class PairSources:
    clean: Prompts  # each pair's clean source
    corrupt: Prompts

    def ids(self, base: str, donor: str) -> SourceIds:
        """The base prompts' sources and their donors' sources, as the sweep engine takes them."""
        every = range(len(self.clean))
        mine, theirs = getattr(self, base), getattr(self, donor)
        return SourceIds(mine.sequences(every), mine.pad_token_id, theirs.sequences(every))

    def check(self, sites: list[Site]) -> None:
        """Encoder sites are patched position for position: each pair's sources need equal token lengths."""
        encoder = [site for site in sites if site.stack is not None]
        if not encoder:
            return
        lengths = zip(self.clean.tokens.lengths.tolist(), self.corrupt.tokens.lengths.tolist())
        for i, (a, b) in enumerate(lengths):
            if a != b:
                raise ResidError(f"Pair {i}: the clean source has {a} tokens and the corrupt one {b}. Patching an "
                                 f"encoder site ({encoder[0].label}) puts source position p into source position p: "
                                 "give sources of equal token lengths, or patch decoder sites only.")


def pair_sources(model: Transformer | EncoderDecoder, source: Inputs | None, corrupt_source: Inputs | None,
                 n: int) -> tuple[Transformer, PairSources | None]:
    """(the model whose prediction is patched: an encoder-decoder model's decoder, the pairs' sources or None)."""
    if corrupt_source is not None and source is None:
        raise ResidError(f"{param('corrupt_source')} goes with {param('source')} (the clean sources) on an "
                         "encoder-decoder model; give both, or neither.")
    decoder, sources = decoder_of(model, source)
    if sources is None:
        return decoder, None
    check_sources(sources, n)
    corrupt = sources.prompts if corrupt_source is None else as_prompts(model.encoder, corrupt_source)
    if len(corrupt) != n:
        raise ResidError(f"Got {len(corrupt)} corrupt sources for {n} pairs: give one corrupt source per pair.")
    return decoder, PairSources(sources.prompts, corrupt)
