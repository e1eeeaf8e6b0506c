"""`--source` of the commands that take encoder-decoder models (resid ablate, resid patch): the source each prompt
(each target prefix) is read with. A text is every prompt's source; a file (.txt: one source per line, or per
paragraph when it has blank lines; .jsonl: {"text": ...} per line) gives one source per prompt, in order."""

from pathlib import Path

from resid.errors import ResidError


def add(parser, flag: str = "--source", what: str = "each prompt's source") -> None:
    parser.add_argument(flag, default=None, help=f"encoder-decoder models (Marian): {what}, a text (the same for "
                        "every prompt) or a .txt / .jsonl file with one source per prompt, in order")


def read(value: str | None, n: int, flag: str = "--source") -> list[str] | None:
    """The sources of `n` prompts (None without the flag); a file's count must be n."""
    if value is None:
        return None
    from resid.analyses.io import texts

    if not Path(value).is_file():
        if Path(value).suffix.lower() in texts.SUFFIXES:
            raise ResidError(f"{flag} {value}: no such file. Give an existing .txt / .jsonl file, or the source text.")
        return [value] * n
    found = texts.read(value, flag.removeprefix("--"))
    if len(found) != n:
        raise ResidError(f"{flag} {value} holds {len(found)} sources for {n} prompts: give one source per prompt, "
                         "in order (one per line).")
    return found
