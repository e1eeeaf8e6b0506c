"""One safetensors checkpoint file of a resumable run (the tuned lens's, a dictionary training's): tensors plus
string metadata, one of which is the run's `settings` as JSON. Written with resid.analyses.io.atomic, so a kill
leaves the previous checkpoint or the new one, never a torn file; read back only with the settings it was written
with (anything else would not continue the same run)."""

import json
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from resid.analyses.io import atomic
from resid.errors import ResidError

FILE = "checkpoint.safetensors"


def write(folder: Path, tensors: dict[str, Tensor], metadata: dict[str, str], settings: dict) -> Path:
    """folder/FILE with `tensors` and `metadata` plus the settings; the file's path."""
    path = folder / FILE
    metadata = {**metadata, "settings": json.dumps(settings, sort_keys=True)}
    atomic.write(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
    return path


def read(folder: str | Path, fmt: str, what: str, settings: dict) -> tuple[dict[str, Tensor], dict[str, str]] | None:
    """(tensors, metadata) of folder/FILE, None if there is none; an error if it is not a checkpoint of format `fmt`
    (`what` names it: "tuned-lens", ...) or was saved with other settings."""
    path = Path(folder) / FILE
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
        if metadata.get("format") != fmt:
            raise ResidError(f"{path} is not a resid {what} checkpoint: delete it or choose another folder.")
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    saved = json.loads(metadata["settings"])
    ours = json.loads(json.dumps(settings, sort_keys=True))  # the same JSON round trip as the saved ones
    if saved != ours:
        changed = sorted(k for k in set(saved) | set(ours) if saved.get(k) != ours.get(k))
        raise ResidError(
            f"The checkpoint in {path} is of a run with other settings ({', '.join(changed)} differ), so it cannot "
            "be resumed with these: rerun with the same ones, or delete it (or choose another folder) to start over."
        )
    return tensors, metadata
