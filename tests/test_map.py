"""The map stays true: every path the README's Layout and docs/design.md name exists, and the Layout names every
package and module of resid/ and analyses/ (a new one that it does not name fails here, as does a renamed one)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP = ("resid", "analyses", "tests", "benchmarks", "notebooks", "docs", "examples")
PATH = re.compile(rf"(?<![\w./-])(?:{'|'.join(TOP)})/[\w./-]*")


def layout() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("\n## Layout\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def named_paths(text: str) -> set[str]:
    return {match.rstrip(".") for match in PATH.findall(text)}


def test_every_path_the_map_names_exists() -> None:
    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    named = named_paths(layout()) | named_paths(design)
    assert len(named) > 40, sorted(named)  # the map names paths at all
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert not missing, f"the README's Layout or docs/design.md names paths that do not exist: {missing}"


def test_the_layout_names_every_package_and_module() -> None:
    named = named_paths(layout())
    entries = [path for folder in ("resid", "analyses") for path in sorted((ROOT / folder).iterdir())
               if path.name not in ("__init__.py", "__pycache__", "py.typed") and not path.name.startswith(".")]
    unnamed = [f"{p.relative_to(ROOT)}{'/' if p.is_dir() else ''}" for p in entries]
    unnamed = [p for p in unnamed if p not in named and p.rstrip("/") not in named]
    assert not unnamed, f"the README's Layout does not name: {unnamed}"


def test_the_path_reader_reads_paths_and_nothing_else() -> None:
    text = "see `resid/forward.py`, analyses/graphs/edges.py. and tests/ but not my_resid/x.py or resid.analyses"
    assert named_paths(text) == {"resid/forward.py", "analyses/graphs/edges.py", "tests/"}
