"""Prompts and prompt-relative positions for the analyses that read one or a few positions per prompt.

A position is an index into the prompt's own tokens, as `model.to_str_tokens(prompt)` lists them (BOS
included when the tokenizer prepends it); negative counts from the end, so -1 is the last token. In a
left-padded batch, prompt i's position p sits at padded index `n_pos - length_i + p % length_i`.
"""

from collections.abc import Sequence

import torch
from jaxtyping import Int
from torch import Tensor

from analyses.vocab import decode_ids
from resid.batching import BatchSize, model_batch_size
from resid.errors import ResidError
from resid.model import Transformer
from resid.tokenizer import Tokens


def as_prompt_list(prompts: str | Sequence[str]) -> list[str]:
    """One prompt or several; every prompt must be a non-empty string."""
    texts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not texts:
        raise ResidError("No prompts given: pass a prompt string or a list of prompts.")
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not text.strip():
            raise ResidError(f"Prompt {i} is empty ({text!r}): give text to analyse.")
    return texts


def batch_size_for(model: Transformer, texts: Sequence[str], batch_size: int | str) -> BatchSize:
    """Prompts per forward pass: as given, or "auto" from the longest prompt and the device."""
    if batch_size == "auto":
        batch_size = model_batch_size(model, max(len(model.require_tokenizer().encode(t)) for t in texts))
    return BatchSize(batch_size)


def prompt_positions(lengths: Sequence[int], positions: Sequence[int] | str) -> list[list[int]]:
    """Per prompt, the non-negative prompt-relative positions asked for ("all", or indices, negative from
    the end), each checked against that prompt's length."""
    if isinstance(positions, str):
        if positions != "all":
            raise ResidError(f"positions must be 'all', an index or a list of indices, got {positions!r}.")
        return [list(range(n)) for n in lengths]
    result = []
    for i, n in enumerate(lengths):
        bad = [p for p in positions if not -n <= p < n]
        if bad:
            raise ResidError(
                f"Position(s) {bad} are out of range for prompt {i}, which has {n} tokens: use 0..{n - 1}, "
                f"or -{n}..-1 from the end (see model.to_str_tokens(prompt))."
            )
        result.append([p % n for p in positions])
    return result


def padded_index(tokens: Tokens, rel: Sequence[Sequence[int]]) -> Int[Tensor, "batch k"]:
    """Padded-batch indices of prompt-relative positions (each prompt has the same count k)."""
    rows = [[start + p for p in ps] for start, ps in zip(first_positions(tokens), rel)]
    return torch.tensor(rows, dtype=torch.long, device=tokens.ids.device)


def first_positions(tokens: Tokens) -> list[int]:
    """Each prompt's first real token in the padded batch. The real tokens are contiguous whichever side is
    padded, so they start at last - length + 1."""
    return (tokens.last_positions() - tokens.lengths + 1).tolist()


def input_tokens(model: Transformer, tokens: Tokens, index: Int[Tensor, "batch k"]) -> list[list[str]]:
    """The decoded input token at each selected padded position."""
    return decode_ids(model, tokens.ids.gather(1, index).cpu().numpy()).tolist()
