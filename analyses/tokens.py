"""Turning a user's target / baseline into exactly one token id, or a clear error."""

from collections.abc import Sequence

from resid.errors import ResidError
from resid.model import Transformer


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
