"""The distribution as a user gets it (issue 27): an sdist and a wheel built from the project's files, the wheel
installed into an empty virtual environment, and `resid predict` and `resid attribute` run from there, in a
folder with no source tree on the path, so a package or package-data file missing from pyproject.toml fails here.

Building runs setuptools from this environment (no build isolation, no network). The new environment gets the
dependencies, not resid, from this one: a .pth file adds this environment's site-packages to its path. A path
line in a .pth does not run the .pth files of the folder it adds, so this environment's editable install of
resid stays inactive there; the test checks that every resid module comes from the new environment."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

import resid

pytestmark = pytest.mark.slow  # builds the distribution and runs the real SmolLM2 from an empty environment

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ["pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "MANIFEST.in", "resid", "analyses"]
PROMPT = "The Eiffel Tower is located in the city of"
# Imports every module of both installed packages (the distributed executors need Ray, an extra: skipped) and
# reports where each package came from and its data files.
INSPECT = """
import importlib, json, pkgutil, sys
import resid, resid.analyses
skipped = ("resid.analyses.distributed.ray_executor", "resid.analyses.distributed.worker")
names = [m.name for p in (resid, resid.analyses) for m in pkgutil.walk_packages(p.__path__, p.__name__ + ".")]
for name in names:
    if name not in skipped:
        importlib.import_module(name)
from pathlib import Path
print(json.dumps({"files": sorted({sys.modules[n].__file__ for n in sys.modules if n.split(".")[0] == "resid"}),
                  "typed": [(Path(p.__file__).parent / "py.typed").is_file() for p in (resid, resid.analyses)],
                  "modules": len(names), "version": resid.__version__}))
"""


def _run(command: list, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"
    return result


def _build(tmp_path: Path) -> tuple[Path, Path]:
    """(sdist, wheel): the sdist from a copy of the project's files, the wheel from the unpacked sdist, as
    `python -m build` does."""
    source = tmp_path / "source"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, source / name)
    dist = tmp_path / "dist"
    build = "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))"
    sdist = dist / _run([sys.executable, "-c", build, dist], cwd=source).stdout.split()[-1]
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    unpacked = next((tmp_path / "unpacked").iterdir())
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, unpacked],
         cwd=tmp_path)
    return sdist, next(dist.glob("*.whl"))


def test_the_wheel_installs_and_runs_in_an_empty_environment(tmp_path):
    sdist, wheel = _build(tmp_path)
    assert wheel.name == f"resid_stream-{resid.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(f"resid_stream-{resid.__version__}.dist-info/METADATA").decode()
    assert "resid/py.typed" in names and "resid/analyses/py.typed" in names and "resid/analyses/cli/main.py" in names
    assert "resid/analyses/attention_view.js" in names  # package data the attention view inlines
    assert "resid/analyses/graphs/viewer.js" in names  # package data the graph viewer inlines
    assert not [n for n in names if n.startswith(("tests/", "notebooks/", "benchmarks/", "analyses/"))]
    assert f"resid_stream-{resid.__version__}.dist-info/licenses/LICENSE" in names
    assert "Name: resid-stream" in metadata and f"Version: {resid.__version__}" in metadata
    assert "License-Expression: Apache-2.0" in metadata and "Classifier: Typing :: Typed" in metadata
    with tarfile.open(sdist) as archive:
        assert any(n.endswith("/CHANGELOG.md") for n in archive.getnames())

    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path).stdout
                .strip())
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel], cwd=tmp_path)

    work = tmp_path / "work"  # no source tree here or on the path
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    report = json.loads(_run([python, "-c", INSPECT], work, env).stdout)
    assert report["files"] and all(Path(f).is_relative_to(site) for f in report["files"]), report["files"]
    assert report["typed"] == [True, True] and report["version"] == resid.__version__ and report["modules"] > 50

    resid_command = env_dir / "bin" / "resid"
    assert _run([resid_command, "--version"], work, env).stdout.strip() == f"resid {resid.__version__}"
    predicted = _run([resid_command, "predict", PROMPT, "--top", "3"], work, env).stdout
    assert "' Paris'" in predicted.splitlines()[2]
    _run([resid_command, "attribute", PROMPT, "--target", " Paris", "--level", "sublayer", "--out", "attr.csv"],
         work, env)
    sidecar = json.loads((work / "attr.csv.json").read_text())
    assert sidecar["resid_version"] == resid.__version__ and sidecar["table"]["rows"] > 0
