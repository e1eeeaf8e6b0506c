"""The virtual environment a reference-fixture script (make_*_reference.py) runs its reference library in: the CPU
torch wheel first, so that pip does not pull a CUDA build, then the library's pins with torch named again, so that
nothing replaces it; a `.installed` marker is written last, so that an interrupted build is redone rather than used.
Imported by the scripts beside it (no resid: the reference must not agree by construction)."""

import subprocess
import sys
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
