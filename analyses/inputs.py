"""What every analysis takes: what `model.run` takes (texts, `resid.Tokens`, or a tensor of token ids),
tokenized once per call, then cut into batches of prompts.

Positions in every analysis are prompt-relative (0 = a prompt's first token, -1 its last); `resid.Tokens`
maps them to padded indices.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from jaxtyping import Int
from torch import Tensor

from resid.analyses.vocab import decode_ids
from resid.batching import BatchSize, model_batch_size
from resid.errors import ResidError, param
from resid.model import Inputs, Memory, Transformer
from resid.seq2seq import EncoderDecoder
from resid.tokenizer import Tokens


@dataclass(frozen=True)
class Prompts:
    tokens: Tokens  # every prompt, left-padded (unless given otherwise), on the model's device
    texts: list[str] | None  # the texts when texts were given (provenance, error messages)
    pad_token_id: int  # for re-padding some of the prompts together (any id works: padding is masked)

    def __len__(self) -> int:
        return self.tokens.ids.shape[0]

    def batch(self, rows: Sequence[int]) -> Tokens:
        """These prompts, without the padding columns none of them needs."""
        return self.tokens.rows(list(rows)).trim()

    def sequences(self, rows: Sequence[int]) -> list[list[int]]:
        """The real token ids of these prompts (no padding)."""
        picked = self.tokens.rows(list(rows))
        return [ids[keep].tolist() for ids, keep in zip(picked.ids.cpu(), picked.attention_mask.cpu())]

    def record(self) -> list[str] | list[list[int]]:
        """The prompts for provenance: the texts, or each prompt's real token ids."""
        return self.texts if self.texts is not None else self.sequences(range(len(self)))


def prompts(model: Transformer, inputs: Inputs) -> Prompts:
    """Texts (a string or a list of strings), Tokens, or ids [batch pos] / [pos], checked and tokenized once."""
    texts = None
    if isinstance(inputs, str) or (isinstance(inputs, Sequence) and not isinstance(inputs, Tokens)):
        texts = [inputs] if isinstance(inputs, str) else list(inputs)
        bad = [i for i, text in enumerate(texts) if not isinstance(text, str)]
        if bad:
            raise ResidError(
                f"Prompt(s) {bad[:10]} are not strings: pass texts, a resid.Tokens, or a [batch pos] tensor of ids."
            )
    pad = model.tokenizer.pad_token_id if model.tokenizer is not None else 0
    return Prompts(model.as_tokens(texts if texts is not None else inputs), texts, pad)


def batch_size_for(model: Transformer, tokens: Tokens, batch_size: int | str, backward: bool = False) -> BatchSize:
    """Prompts per forward pass: as given, or "auto" from the batch's width and the device (backward: for a pass
    that is differentiated; resid.batching.model_batch_size)."""
    if batch_size == "auto":
        batch_size = model_batch_size(model, tokens.ids.shape[1], backward=backward)
    return BatchSize(batch_size)


def input_tokens(model: Transformer, tokens: Tokens, index: Int[Tensor, "batch k"]) -> np.ndarray:
    """The decoded input token at each padded position of `index` ([batch k] object array)."""
    return decode_ids(model, tokens.ids.gather(1, index).cpu().numpy())


@dataclass(frozen=True)
class Sources:
    """The sources of an encoder-decoder model's prompts (the decoder's target prefixes), one per prompt."""

    model: EncoderDecoder
    prompts: Prompts

    def memory(self, rows: Sequence[int]) -> Memory:
        """The encoded sources of these prompts, for the decoder's cross-attention."""
        return self.model.memory(self.model.encode(self.prompts.batch(rows)))


def decoder_of(model: Transformer | EncoderDecoder, source: Inputs | None) -> tuple[Transformer, Sources | None]:
    """(the model whose prediction is analysed, the sources its cross-attention reads): an encoder-decoder model's
    decoder and `source` encoded per chunk, or the model itself (which takes no source)."""
    if isinstance(model, EncoderDecoder):
        if source is None:
            raise ResidError(
                f"{model.name} is an encoder-decoder model: pass source= (one source text, or token ids, per prompt); "
                "the prompts are then the decoder's target prefixes."
            )
        return model.decoder, Sources(model, prompts(model.encoder, source))
    if source is not None:
        raise ResidError(f"source= is for encoder-decoder models; {model.name} reads only its prompts.")
    return model, None


def check_sources(sources: Sources | None, n_prompts: int) -> None:
    if sources is not None and len(sources.prompts) != n_prompts:
        raise ResidError(
            f"Got {len(sources.prompts)} sources for {n_prompts} prompts: give one source per target prefix."
        )


def prediction_positions(model: Transformer, given: Prompts, position: int | None, mask: bool) -> list[int]:
    """Each prompt's analysed position (prompt-relative): `position`; else, with `mask` (masked-LM models), each
    prompt's one [MASK]; else the last token. Checked here, before any forward pass."""
    n = len(given)
    if position is not None or not mask:
        position = -1 if position is None else position
        given.tokens.padded_index([position])  # an out-of-range position fails here
        return [position] * n
    mask_id = None if model.tokenizer is None else model.tokenizer.mask_token_id
    if mask_id is None:
        raise ResidError(f"{model.name} is a masked-LM model but has no [MASK] token id: pass {param('position')} "
                         "explicitly.")
    found = []
    for i, ids in enumerate(given.sequences(range(n))):
        at = [p for p, token in enumerate(ids) if token == mask_id]
        if len(at) != 1:
            raise ResidError(
                f"Prompt {i} has {len(at)} [MASK] tokens, but a masked-LM prediction is read at exactly one: "
                "put one [MASK] where the word to predict goes (e.g. 'Paris is the [MASK] of France.'), or pass "
                f"{param('position')}."
            )
        found.append(at[0])
    return found
