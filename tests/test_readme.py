"""The README's Python runs as printed, each ```python block alone in a fresh interpreter (a reader copies one
block, not the page): every name a block uses it imports or defines itself (checked statically on every run of the
suite), and each block runs to the end in its own process and working directory (slow: they load the real
SmolLM2). Any error fails, naming the block and its first line."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number of the block's first code line, code) for every ```python block."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)]


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def undefined_names(code: str) -> list[str]:
    """pyflakes' undefined-name and unused-import findings (through ruff, without the project's settings)."""
    found = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F821,F401,F811",
                            "--output-format", "concise", "--stdin-filename", "block.py", "-"],
                           input=code, capture_output=True, text=True)
    return [line for line in found.stdout.splitlines() if line.startswith("block.py")]


def test_python_blocks_are_found():
    assert len(BLOCKS) >= 10 and BLOCKS[0][1].startswith("import resid")


def test_the_checker_finds_a_name_from_another_block():
    assert undefined_names("import resid\n\nmodel.run('hi')\n") and not undefined_names("x = 1\nprint(x)\n")


@pytest.mark.parametrize("line,code", BLOCKS, ids=[f"line{line}" for line, _ in BLOCKS])
def test_each_block_defines_what_it_uses(line, code):
    problems = undefined_names(code)
    assert not problems, f"README.md, the ```python block at line {line}: " + "; ".join(problems)


@pytest.mark.slow  # each block loads the real SmolLM2 in a fresh interpreter (a few minutes in all)
@pytest.mark.parametrize("line,code", BLOCKS, ids=[f"line{line}" for line, _ in BLOCKS])
def test_each_block_runs_alone_in_a_fresh_interpreter(line, code, tmp_path):
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"README.md, the ```python block at line {line} failed:\n{done.stderr[-3000:]}"
    if "tables.export" in code:  # what the blocks say they write, they write
        assert {"heads.tex", "heads.csv"} <= {p.name for p in tmp_path.iterdir()}
    if "results.parquet" in code:
        assert (tmp_path / "results.parquet").is_file()
