"""The README's Python runs as printed: its ```python blocks, in order, in one namespace (a later block uses
the `model` and `prompts` of an earlier one), in a temporary working directory so the files they write land
there. Any error fails, naming the block and its first line."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number of the block's first code line, code) for every ```python block."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)]


def test_python_blocks_are_found():
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) >= 4 and blocks[0][1].startswith("import resid")


@pytest.mark.slow  # the README's examples load the real SmolLM2 end to end (about a minute)
def test_readme_python_runs_as_printed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "readme"}
    for line, code in python_blocks(README.read_text(encoding="utf-8")):
        try:
            exec(compile(code, f"README.md:{line}", "exec"), namespace)
        except Exception as error:
            pytest.fail(f"README.md, the ```python block at line {line}: {type(error).__name__}: {error}")
    # what the blocks say they write, they write
    assert {"heads.tex", "heads.csv", "results.parquet"} <= {p.name for p in tmp_path.iterdir()}
