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

from torch import Tensor

from resid.analyses.io import atomic, checkpoints
from resid.analyses.training.activations import Position

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
                "dictionaries": str(len(states))}
    path = checkpoints.write(folder, tensors, metadata, settings)
    atomic.write(folder / "progress.json", json.dumps({**metadata, "settings": settings}, indent=1, sort_keys=True))
    return path


def load(folder: str | Path, settings: dict) -> Saved | None:
    """The run saved in `folder`, None if there is none; an error if it was saved with other settings."""
    found = checkpoints.read(folder, FORMAT, "training", settings)
    if found is None:
        return None
    tensors, metadata = found
    states: list[dict[str, Tensor]] = [{} for _ in range(int(metadata["dictionaries"]))]
    for name, tensor in tensors.items():
        index, rest = name.split(".", 1)
        states[int(index)][rest] = tensor
    return Saved(int(metadata["step"]), Position(int(metadata["block"]), int(metadata["batch"])), states)
