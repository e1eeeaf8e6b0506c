"""The state of a training run on disk, so that a killed run resumes where it stopped and ends with the weights
an uninterrupted run ends with.

FOLDER/checkpoint.safetensors holds, for dictionary i, its parameters and buffers (`i.coder.W_enc`, ...,
`i.coder.since_fired`) and Adam's moments and step counts (`i.adam.W_enc.exp_avg`, ...); its metadata (JSON) the
steps done, the data stream's Position (block, batch in block: resid.analyses.training.activations) and the run's
settings (model, hooks, recipe, corpus fingerprint, pipeline options). It is written with
resid.analyses.io.atomic, so a kill leaves the previous checkpoint or the new one, never a torn file; a run resumes
only with the settings it was written with. FOLDER/progress.json repeats the metadata for people (never read).
"""

import json
from dataclasses import dataclass
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from resid.analyses.io import atomic
from resid.analyses.training.activations import Position
from resid.errors import ResidError

FILE = "checkpoint.safetensors"
FORMAT = "resid.training.checkpoint"


@dataclass
class Saved:
    step: int
    position: Position
    tensors: list[dict[str, Tensor]]  # one state per dictionary (Trainer.state)


def save(folder: str | Path, step: int, position: Position, states: list[dict[str, Tensor]], settings: dict) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"{i}.{name}": t.contiguous() for i, state in enumerate(states) for name, t in state.items()}
    metadata = {"format": FORMAT, "step": str(step), "block": str(position.block), "batch": str(position.batch),
                "dictionaries": str(len(states)), "settings": json.dumps(settings, sort_keys=True)}
    path = folder / FILE
    atomic.write(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
    readable = {**{k: v for k, v in metadata.items() if k != "settings"}, "settings": settings}
    atomic.write(folder / "progress.json", json.dumps(readable, indent=1, sort_keys=True))
    return path


def load(folder: str | Path, settings: dict) -> Saved | None:
    """The run saved in `folder`, None if there is none; an error if it was saved with other settings."""
    path = Path(folder) / FILE
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
        if metadata.get("format") != FORMAT:
            raise ResidError(f"{path} is not a resid training checkpoint: delete it or choose another folder.")
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    saved = json.loads(metadata["settings"])
    ours = json.loads(json.dumps(settings, sort_keys=True))
    if saved != ours:
        changed = sorted(k for k in set(saved) | set(ours) if saved.get(k) != ours.get(k))
        raise ResidError(f"The checkpoint in {path} is of a run with other settings ({', '.join(changed)} differ), so "
                         "it cannot be resumed with these: rerun with the same ones, or delete it (or choose another "
                         "folder) to start over.")
    states: list[dict[str, Tensor]] = [{} for _ in range(int(metadata["dictionaries"]))]
    for name, tensor in tensors.items():
        index, rest = name.split(".", 1)
        states[int(index)][rest] = tensor
    return Saved(int(metadata["step"]), Position(int(metadata["block"]), int(metadata["batch"])), states)
