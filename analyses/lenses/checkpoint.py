"""The state of a lens's training on disk, so that a killed run resumes where it stopped.

FOLDER/checkpoint.safetensors holds the translators, SGD's momentum buffers and, in its metadata, the steps done,
the losses so far and the run's `settings` (model, sites, recipe, data fingerprint). It is written with
resid.analyses.io.atomic after a step, so a kill leaves the previous checkpoint or the new one, never a torn file.
A run resumes only with the settings it was written with: anything else would not continue the same run.
Everything after the checkpointed step is recomputed from it and the seed (the data order is a function of
the step: resid.analyses.lenses.data.window_order), so a resumed run gives the run that was never stopped.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from resid.analyses.io import checkpoints

FORMAT = "resid.tuned_lens.checkpoint"


@dataclass
class State:
    step: int  # steps done
    weight: Tensor  # [site d_model d_model]
    bias: Tensor | None  # [site d_model]
    momentum_weight: Tensor | None  # SGD's momentum buffers (None before the first step)
    momentum_bias: Tensor | None
    losses: list[float]  # mean KL over sites, one per step done


def save(folder: str | Path, state: State, settings: dict) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    parts = {"weight": state.weight, "bias": state.bias, "momentum_weight": state.momentum_weight,
             "momentum_bias": state.momentum_bias}
    tensors = {name: t.detach().float().cpu().contiguous() for name, t in parts.items() if t is not None}
    metadata = {"format": FORMAT, "step": str(state.step), "losses": json.dumps(state.losses)}
    return checkpoints.write(folder, tensors, metadata, settings)


def load(folder: str | Path, settings: dict) -> State | None:
    """The state saved in `folder`, None if there is none; an error if it was saved with other settings."""
    found = checkpoints.read(folder, FORMAT, "tuned-lens", settings)
    if found is None:
        return None
    tensors, metadata = found
    return State(int(metadata["step"]), tensors["weight"], tensors.get("bias"), tensors.get("momentum_weight"),
                 tensors.get("momentum_bias"), json.loads(metadata["losses"]))
