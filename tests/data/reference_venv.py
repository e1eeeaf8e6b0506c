"""The virtual environment a reference-fixture script (make_*_reference.py) runs its reference library in: the CPU
torch wheel first, so that pip does not pull a CUDA build, then the library's pins with torch named again, so that
nothing replaces it; a `.installed` marker is written last, so that an interrupted build is redone rather than used.
Imported by the scripts beside it (no resid: the reference must not agree by construction), with what they share:
writing or checking their files (write_or_check), comparing tensors (same_tensors), copying the library's licence
(copy_licence) and, for the scripts that only generate inside the venv and compare outside it, their whole command
line (main)."""

import argparse
import importlib.metadata as md
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path


def build_venv(venv: Path, torch: str, pins: list[str]) -> Path:
    python = venv / "bin" / "python"
    if not (venv / ".installed").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q", "install"]
        subprocess.run([*pip, torch], check=True)
        subprocess.run([*pip, *pins, torch], check=True)
        (venv / ".installed").touch()
    return python


def same_tensors(new: Path, old: Path, atol: float) -> bool:
    """Whether two safetensors files hold the same names and values within `atol` (rtol 0; equal infinities,
    e.g. masked attention scores, count as equal)."""
    import torch
    from safetensors.torch import load_file

    a, b = load_file(str(new)), load_file(str(old))
    return a.keys() == b.keys() and all(torch.allclose(a[k].float(), b[k].float(), rtol=0, atol=atol) for k in a)


def write_or_check(python: Path, script: str | Path, out: Path, check: bool,
                   compare: Callable[[Path, Path], bool]) -> None:
    """Run `script --inside DIR` with the reference environment's `python`: DIR is `out` (the committed files,
    rewritten), or with `check` a scratch folder that `compare(scratch, out)` judges (exit status 1 if they
    disagree, nothing written)."""
    with tempfile.TemporaryDirectory() as scratch:
        target = Path(scratch) if check else out
        target.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(python), str(script), "--inside", str(target)], check=True)
        if check:
            sys.exit(0 if compare(target, out) else 1)
    print("wrote", out)


def copy_licence(distribution: str, out: Path) -> None:
    """The installed `distribution`'s LICENSE file into `out` (inside the reference venv), when it ships one."""
    licence = [f for f in md.distribution(distribution).files if f.name.startswith("LICENSE")]
    if licence:
        shutil.copy(licence[0].locate(), out / "LICENSE")


def main(script: str, description: str, generate: Callable[[Path], None], compare: Callable[[Path, Path], bool],
         out: Path, venv: Path, pins: list[str], prepare: Callable[[Path], None] | None = None) -> None:
    """The command line of a script that generates inside its reference venv: `--inside DIR` (in the venv) runs
    `generate(DIR)`; otherwise the venv is built (then `prepare(python)`, if given) and the files written or, with
    --check, compared (write_or_check)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    parser.add_argument("--venv", type=Path, default=venv)
    parser.add_argument("--inside", type=Path, default=None, help=argparse.SUPPRESS)  # in the reference's venv
    args = parser.parse_args()
    if args.inside is not None:
        generate(args.inside)
        return
    python = build_venv(args.venv, "torch==2.13.0", pins)
    if prepare is not None:
        prepare(python)
    write_or_check(python, script, out, args.check, compare)
