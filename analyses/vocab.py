"""Tokens for the analyses: a user's target / baseline as exactly one token id (or a clear error), and token
ids decoded for tables."""

import weakref
from collections.abc import Sequence

import numpy as np

from resid.errors import ResidError
from resid.model import Transformer

Token = str | int  # a token as users give it: its text (which must be one token) or its id
_VOCAB: "weakref.WeakKeyDictionary[object, np.ndarray]" = weakref.WeakKeyDictionary()


def single_token_id(model: Transformer, token: str | int, role: str = "target") -> int:
    """The id of `token` (a string that must tokenize to one token, or an id)."""
    vocab = model.config.d_vocab
    if isinstance(token, int) and not isinstance(token, bool):
        if not 0 <= token < vocab:
            raise ResidError(f"The {role} id {token} is not a token: ids lie in 0..{vocab - 1}.")
        return token
    if not isinstance(token, str) or token == "":
        raise ResidError(f"The {role} must be a non-empty string or a token id, got {token!r}.")
    ids = model.require_tokenizer().encode(token, prepend_bos=False)
    if len(ids) != 1:
        pieces = model.to_str_tokens(ids)
        raise ResidError(
            f"The {role} {token!r} is {len(ids)} tokens, {pieces} (ids {ids}), but it must be one token. Pass "
            f"the first token, {pieces[0]!r} (id {ids[0]}), or an explicit token id. Mind the leading space: "
            "' Paris' and 'Paris' are different tokens."
        )
    return ids[0]


def token_ids(model: Transformer, tokens: Sequence[str | int] | str | int, n: int, role: str) -> list[int]:
    """One id per prompt; a single target is used for every prompt."""
    if isinstance(tokens, (str, int)):
        tokens = [tokens] * n
    if len(tokens) != n:
        raise ResidError(f"Got {len(tokens)} {role}s for {n} prompts: give one per prompt (or a single one for all).")
    return [single_token_id(model, t, role) for t in tokens]


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
