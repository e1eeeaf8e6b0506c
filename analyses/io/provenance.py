"""Provenance of an analysis result: which model (its identity, resid.identity: the weights' content as they
are, dtype and config; plus the files it was read from), device, resid version, which analysis with which
parameters, on which prompts, when. Analyses put it in `df.attrs["provenance"]`; `tables.export` writes it beside
the table as `path + ".json"`."""

import hashlib
import os
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import resid
from resid.identities import identity
from resid.model import Transformer

_HASHES: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256: hash each file once


def sha256(path: str | Path) -> str:
    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _HASHES:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
        _HASHES[key] = digest.hexdigest()
    return _HASHES[key]


def describe(
    model: Transformer,
    analysis: str,
    parameters: dict,
    prompts: Sequence[str] | Sequence[Sequence[int]] | str | None = None,  # texts, or token ids per prompt
    target: object = None,
    baseline: object = None,
) -> dict:
    """A JSON-ready record of how a result was produced."""
    return {
        "analysis": analysis,
        "parameters": parameters,
        "prompts": [prompts] if isinstance(prompts, str) else (list(prompts) if prompts is not None else None),
        "target": target,
        "baseline": baseline,
        "model": model.name,
        "identity": identity(model, reuse=True).as_dict(),  # the weights as they are now (an edit changes it)
        "weight_files": [{"path": os.fspath(f), "sha256": sha256(f)} for f in model.weight_files],
        "dtype": str(model.dtype).removeprefix("torch."),
        "device": str(model.device),
        "resid_version": resid.__version__,
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
