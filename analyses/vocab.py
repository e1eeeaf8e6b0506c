"""Tokens for the analyses: a user's target / baseline as exactly one token id (or a clear error), a hint when
the same word with a leading space is the likelier token, and token ids decoded for tables.

Leading spaces: byte-level BPE tokenizers (GPT-2, SmolLM2, ...) give a word after a space its own token,
"Paris" != " Paris", and the next word of a prompt is nearly always the spaced form. A target without the
space is still accepted as given (it may be meant: after a newline or a quote); the analyses add
`spacing_hint` to `df.attrs["notes"]` when the spaced form is far likelier."""

import weakref
from collections.abc import Sequence

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from resid.errors import ResidError
from resid.model import Transformer

Token = str | int  # a token as users give it: its text (which must be one token) or its id
_VOCAB: "weakref.WeakKeyDictionary[object, np.ndarray]" = weakref.WeakKeyDictionary()
# How much likelier the spaced form must be before spacing_hint speaks: a clear preference, not noise
# between two unlikely tokens.
HINT_RATIO = 10.0


def single_token_id(model: Transformer, token: str | int, role: str = "target") -> int:
    """The id of `token` (a string that must tokenize to one token, or an id)."""
    vocab = model.config.d_vocab
    if isinstance(token, int) and not isinstance(token, bool):
        if not 0 <= token < vocab:
            raise ResidError(f"The {role} id {token} is not a token: ids lie in 0..{vocab - 1}.")
        return token
    if not isinstance(token, str) or token == "":
        raise ResidError(f"The {role} must be a non-empty string or a token id, got {token!r}.")
    return model.require_tokenizer().token_id(token, role)


def spacing_hint(model: Transformer, token: str | int | None, logits_row: Float[Tensor, "d_vocab"]) -> str | None:
    """A one-line note when `token` (a target string as the user gave it, one token) has no leading space,
    " " + token is one token too, and the model (`logits_row`: its logits where the target is read) gives the
    spaced form at least HINT_RATIO times the probability; else None. Ids and None are taken as meant."""
    if not isinstance(token, str) or model.tokenizer is None:
        return None
    spaced = model.tokenizer.spaced_id(token)
    if spaced is None:
        return None
    given = single_token_id(model, token)
    probs = torch.softmax(logits_row.float(), dim=-1)
    p_given, p_spaced = probs[given].item(), probs[spaced].item()
    if p_spaced < HINT_RATIO * p_given:
        return None
    return (f"target {token!r} (id {given}) has p = {p_given:.3g}, while {' ' + token!r} (id {spaced}, with a "
            f"leading space) has p = {p_spaced:.3g}: pass {' ' + token!r} if that is the answer you mean.")


def spacing_notes(model: Transformer, given: Sequence[str | int | None] | None,
                  logits: Float[Tensor, "batch d_vocab"], prompt_idx: Sequence[int]) -> list[str]:
    """`spacing_hint` for each row of `logits` (prompt `prompt_idx[b]`, whose target as given is
    `given[prompt_idx[b]]`), each note prefixed by its prompt when there are several."""
    if given is None:
        return []
    notes = []
    for row, i in enumerate(prompt_idx):
        hint = spacing_hint(model, given[i], logits[row])
        if hint is not None:
            notes.append(hint if len(given) == 1 else f"prompt {i}: {hint}")
    return notes


def as_list(tokens: Sequence[str | int | None] | str | int | None, n: int) -> list[str | int | None] | None:
    """One token (or None) per prompt, as given; a single token is used for every prompt."""
    if tokens is None:
        return None
    return [tokens] * n if isinstance(tokens, (str, int)) else list(tokens)


def token_ids(model: Transformer, tokens: Sequence[str | int | None] | str | int, n: int, role: str,
              optional: bool = False) -> list[int | None]:
    """One id per prompt; a single target is used for every prompt. With `optional`, a None entry stays None
    (the caller's default, e.g. that prompt's top prediction); without, it is an error naming the prompt."""
    tokens = as_list(tokens, n)
    if len(tokens) != n:
        raise ResidError(f"Got {len(tokens)} {role}s for {n} prompts: give one per prompt (or a single one for all).")
    if not optional and None in tokens:
        raise ResidError(f"The {role} of prompt {tokens.index(None)} (counting from 0) is missing: this analysis "
                         f"needs a {role} for every prompt.")
    return [None if t is None else single_token_id(model, t, role) for t in tokens]


def vocabulary(model: Transformer) -> np.ndarray:
    """Every token id decoded on its own (object array [d_vocab]); ids the tokenizer lacks are ''. Cached
    per tokenizer, so building a large table decodes by indexing rather than one call per row."""
    tokenizer = model.require_tokenizer()
    vocab = _VOCAB.get(tokenizer)
    if vocab is None or len(vocab) < model.config.d_vocab:
        known = min(tokenizer.vocab_size, model.config.d_vocab)
        decoded = tokenizer.tokenizer.decode_batch([[i] for i in range(known)], skip_special_tokens=False)
        vocab = np.array(decoded + [""] * (model.config.d_vocab - known), dtype=object)
        _VOCAB[tokenizer] = vocab
    return vocab


def decode_ids(model: Transformer, ids: np.ndarray) -> np.ndarray:
    """The decoded token of each id (same shape); '<id>' placeholders for a model without a tokenizer."""
    if model.tokenizer is None:
        return np.char.add(np.char.add("<", ids.astype(str)), ">").astype(object)
    return vocabulary(model)[ids]
