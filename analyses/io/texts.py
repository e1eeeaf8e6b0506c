"""Texts from files: the one rule for `.txt` and the one JSONL reader, shared by `--corpus`
(`resid.analyses.io.corpus`), the mean-ablation `--reference` (`resid.analyses.sweeps.values.read_reference`) and
prompt sets (`resid.analyses.io.prompts_file`).

Glossary: a *text* is one string a caller uses whole (a corpus document, a reference text); a *record* is one
JSON object of a JSONL file.

Rules (files are UTF-8; a byte-order mark is ignored; a UTF-16 or UTF-32 file, or bytes that are not UTF-8, are an
error saying so, and so is a lone surrogate escape such as "\\ud83d" in a JSON string):
- `.txt`: one text per paragraph, paragraphs being separated by one or more blank (or whitespace-only) lines;
  line breaks inside a paragraph are kept, and each paragraph is stripped. A file with no blank line at all is
  read as one text per non-empty line (stripped), so a plain list of sentences needs no blank lines between.
- `.jsonl` / `.ndjson`: one JSON object per line; blank lines are skipped (but counted, so a line number is the
  one an editor shows). The text is the string field the caller names ("text" for corpora and references);
  other fields are ignored. A line that is not JSON, not an object, or lacks a required field is an error
  naming the file and its line number; nothing is half-read.
"""

import codecs
import json
import os
from collections.abc import Mapping
from pathlib import Path

from resid.errors import ResidError
from resid.strings import check_unicode

SUFFIXES = (".txt", ".jsonl", ".ndjson")


def paragraphs(text: str) -> list[str]:
    """The texts of `.txt` content (see the module docstring): blank-line-separated paragraphs, or one per
    non-empty line if there is no blank line."""
    lines = text.replace("\r\n", "\n").strip().split("\n")
    if all(line.strip() for line in lines):
        return [line.strip() for line in lines if line.strip()]
    blocks, current = [], []
    for line in lines:
        if line.strip():
            current.append(line.rstrip())
        elif current:
            blocks.append("\n".join(current).strip())
            current = []
    if current:
        blocks.append("\n".join(current).strip())
    return blocks


def records(path: str | os.PathLike, fields: Mapping[str, type], example: str, role: str) -> list[tuple[int, dict]]:
    """(line number, object) for each non-blank line of the JSONL file `path`, each object holding every key
    of `fields` with a value of its type (`object`: any value). `example` (one valid line) and `role` (what the
    file is for: "corpus", "prompts", "reference") go into the errors."""
    path = Path(path)
    content = _content(path, role)
    found = []
    # Records are split at "\n" only: str.splitlines would also split at U+2028 or \x1c, which JSON strings
    # may hold unescaped. json.loads ignores the "\r" of a CRLF line end.
    for number, line in enumerate(content.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ResidError(f"{path}, line {number}: not valid JSON ({err.msg}). Each line must be one JSON "
                             f"object, like {example}.") from None
        if not isinstance(record, dict):
            raise ResidError(f"{path}, line {number}: not a JSON object. Each line must be one, like {example}.")
        for name, kind in fields.items():
            if name not in record or not isinstance(record[name], kind):
                described = "" if kind is object else "string " if kind is str else f"{kind.__name__} "
                raise ResidError(f'{path}, line {number} has no {described}field "{name}": each line must be a '
                                 f"JSON object like {example}.")
            if isinstance(record[name], str):
                check_unicode(record[name], f'{path}, line {number}: "{name}"')
        found.append((number, record))
    return found


def read(path: str | os.PathLike, role: str, field: str = "text") -> list[str]:
    """The texts of a `.txt` or `.jsonl` / `.ndjson` file, in file order (see the module docstring); from JSONL,
    the string `field` of each record. `role` ("corpus", "reference") names the file in errors. Blank texts
    are kept: callers decide whether one is an error."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ResidError(
            f"Cannot read a {role} from {path.name!r}: unknown suffix {path.suffix or '(none)'!r}. Use a .txt file "
            f'(paragraphs separated by blank lines, or one text per line) or a .jsonl file (one {{"{field}": ...}} '
            "object per line)."
        )
    if suffix == ".txt":
        return paragraphs(_content(path, role))
    return [record[field] for _, record in records(path, {field: str}, f'{{"{field}": "..."}}', role)]


# Byte-order marks of the encodings an editor may save in instead of UTF-8 (UTF-32 first: its LE mark begins with
# UTF-16's).
_OTHER_BOMS = {codecs.BOM_UTF32_LE: "UTF-32", codecs.BOM_UTF32_BE: "UTF-32", codecs.BOM_UTF16_LE: "UTF-16",
               codecs.BOM_UTF16_BE: "UTF-16"}


def _content(path: Path, role: str) -> str:
    if not path.is_file():
        raise ResidError(f"{role.capitalize()} file {path} does not exist (or is not a file).")
    data = path.read_bytes()
    encoding = next((name for bom, name in _OTHER_BOMS.items() if data.startswith(bom)), None)
    if encoding is None and b"\x00" in data[:4096]:
        encoding = "UTF-16 or UTF-32 (it holds zero bytes)"  # a UTF-16 file saved without a byte-order mark
    if encoding is not None:
        raise ResidError(f"{role.capitalize()} file {path} is encoded as {encoding}; resid reads UTF-8. Save it "
                         f"as UTF-8 (e.g. iconv -f UTF-16 -t UTF-8 {path.name} > utf8{path.suffix}).")
    try:
        return data.decode("utf-8-sig")  # "-sig": a byte-order mark is not part of the first text
    except UnicodeDecodeError as error:
        line = data[:error.start].count(b"\n") + 1
        raise ResidError(f"{role.capitalize()} file {path} is not UTF-8: line {line} holds the byte "
                         f"0x{data[error.start]:02x}, which UTF-8 does not allow there. Save the file as UTF-8.") \
            from None
