"""resid.load("gemma-3-270m") finds its GGUF through package metadata: assembled once into resid's cache folder
(a second load re-uses it without re-assembling), and a clear error naming the pip extra when it is missing."""

import importlib
import importlib.metadata

import pytest

import resid
from resid.load import gguf_packages
from resid.load.gguf_packages import GEMMA3_PACKAGE, gemma3_270m_path


def test_assembled_once_into_the_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RESID_CACHE", str(tmp_path))
    path = gemma3_270m_path()
    assert path.parent.parent == tmp_path and path.name == "gemma-3-270m-q4_k_m.gguf"
    assert path.stat().st_size == 253_113_024
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind
    package = importlib.import_module(GEMMA3_PACKAGE.replace("-", "_"))

    def no_second_assembly(*args, **kwargs):
        raise AssertionError("assembled twice")

    monkeypatch.setattr(package, "assemble", no_second_assembly)
    assert gemma3_270m_path() == path


def test_a_truncated_cache_file_is_reassembled(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RESID_CACHE", str(tmp_path))
    path = gemma3_270m_path()
    path.write_bytes(b"GGUF")
    assert gemma3_270m_path().stat().st_size == 253_113_024


def test_missing_package_says_what_to_install(monkeypatch) -> None:
    real = importlib.metadata.distribution

    def distribution(name: str):
        if name.startswith(GEMMA3_PACKAGE):
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(gguf_packages.importlib.metadata, "distribution", distribution)
    with pytest.raises(resid.ResidError, match=r"pip install 'resid-stream\[gemma3\]'"):
        resid.load("gemma-3-270m")


def test_known_models_lists_gemma3() -> None:
    assert "Gemma terms of use" in resid.known_models()["gemma-3-270m"]
