"""Checks of the strings resid tokenizes, apart from the tokenizer so that the readers of prompt files (and the
command line's checks before a model loads) use them without importing torch."""

from resid.errors import ResidError


def check_unicode(text: str, where: str = "The text") -> None:
    """Refuse a lone surrogate (U+D800..U+DFFF): half of a UTF-16 pair, not a character, which no tokenizer can
    encode. It comes from a JSON escape such as "\\ud83d" without its pair, or bytes decoded with
    errors="surrogateescape"."""
    if text.isascii():  # the common case, checked at C speed
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ResidError(
            f"{where} {text[:40]!r}{'...' if len(text) > 40 else ''} holds a lone surrogate "
            f"U+{ord(text[error.start]):04X} at character {error.start}: half of a UTF-16 pair, not a character, so "
            "it cannot be tokenized. Fix the text (a JSON escape like \\ud83d needs its pair) or drop that character."
        ) from None
