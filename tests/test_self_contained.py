"""A fresh clone must pass with nothing beside it: no file of the project may point at this machine's folders
or at a folder next to the checkout (test data lives in tests/data)."""

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Assembled from pieces so that this file does not contain what it forbids. The folder beside the checkout is
# caught as a relative path, as os.path.join arguments and as a pathlib parent joined with it (examples below).
WORK = "/" + "work" + "/"
SHARED = "shared"
FORBIDDEN = [
    re.compile(re.escape(WORK)),
    re.compile(r"\.\.[/\\]" + SHARED + r"\b"),
    re.compile(r"""["']\.\.["']\s*,\s*["']""" + SHARED + "[\"']"),
    re.compile(r"\.parents?\b.*/\s*[\"']" + SHARED + "[\"'/]"),
]
# The walk has no .gitignore to honour: skip the environment, caches and build outputs by name.
SKIP_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache", ".mypy_cache",
             ".ipynb_checkpoints", "build", "out"}
# Copied binary data (weights, reference numbers) is not ours to police; its prose, scripts and JSON are.
DATA = Path("tests", "data")
DATA_SCANNED_SUFFIXES = {".py", ".md", ".json"}  # json: fixtures resid or its scripts wrote (configs, manifests)


def project_files() -> list[Path]:
    """Tracked files plus new ones git does not ignore (so a file is checked before its first commit); a walk
    of the tree where git is unavailable, e.g. an unpacked source archive."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT, capture_output=True, check=True,
        ).stdout.decode()
        files = [Path(name) for name in listed.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for folder, dirs, names in os.walk(ROOT):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
            files += [Path(folder, name).relative_to(ROOT) for name in names]
    return [
        f for f in files
        if not (f.parts[0] in SKIP_DIRS or (f.is_relative_to(DATA) and f.suffix not in DATA_SCANNED_SUFFIXES))
    ]


def test_no_paths_outside_the_checkout():
    files = project_files()
    assert Path("tests", "test_self_contained.py") in files, "the file list is wrong: it misses this test"
    found = []
    for relative in files:
        path = ROOT / relative
        if not path.is_file():  # deleted in the work tree but still tracked
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            if any(pattern.search(line) for pattern in FORBIDDEN):
                found.append(f"{relative}:{number}: {line.strip()}")
    assert not found, (
        "These lines point outside the checkout, so a fresh clone would fail; put the data under tests/data and "
        "build its path from the file that reads it (Path(__file__).resolve().parent / ...):\n" + "\n".join(found)
    )


def test_patterns_catch_the_known_forms():
    # Built, not written out, for the same reason as FORBIDDEN.
    bad = [
        f'TOKENIZER = Path("{WORK}{SHARED}/models/gpt2-tokenizer/tokenizer.json")',
        f'See `../{SHARED}/DESIGN.md`.',
        f'{SHARED.upper()} = Path(__file__).resolve().parents[1].parent / "{SHARED}"',
        f'os.path.join(ROOT, "..", "{SHARED}", "models")',
    ]
    good = ['DATA = Path(__file__).resolve().parent / "data"', "a shared BatchSize, so later calls start from it"]
    assert all(any(p.search(line) for p in FORBIDDEN) for line in bad)
    assert not any(p.search(line) for p in FORBIDDEN for line in good)
