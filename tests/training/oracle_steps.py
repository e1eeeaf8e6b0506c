"""What the training oracles share (test_*_oracle.py): a reference library's few steps, made in its own environment,
replayed by resid's Trainer from the same initial weights on the same batches, and compared step by step.

A fixture holds `inputs` [step batch d_in], `losses` [step], `initial.<name>` and `final.<name>` for the
coder's W_enc, b_enc, W_dec, b_dec (and whatever else a recipe tracks)."""

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor

from resid.analyses.training.recipe import Recipe
from resid.analyses.training.trainer import Trainer

WEIGHTS = ("W_enc", "b_enc", "W_dec", "b_dec")
DATA = Path(__file__).resolve().parents[1] / "data"


def fixture(name: str) -> tuple[dict[str, Tensor], dict]:
    """(reference.safetensors, settings.json) of the fixture folder tests/data/<name>."""
    folder = DATA / name
    return load_file(str(folder / "reference.safetensors")), json.loads((folder / "settings.json").read_text())


def replay(recipe: Recipe, d_in: int, theirs: dict[str, Tensor]) -> tuple[Trainer, list[float]]:
    """A Trainer started from the fixture's initial weights, and its loss at each of the fixture's batches."""
    trainer = Trainer.new(recipe, d_in)
    with torch.no_grad():
        for name in WEIGHTS:
            getattr(trainer.coder, name).copy_(theirs[f"initial.{name}"])
        if "initial.threshold" in theirs:  # JumpReLU trains its threshold from the fixture's start
            trainer.coder.threshold.copy_(theirs["initial.threshold"])
    return trainer, [float(trainer.step(x).loss) for x in theirs["inputs"]]


def assert_steps_match(trainer: Trainer, losses: list[float], theirs: dict[str, Tensor], tolerance: float,
                       names: tuple[str, ...] = WEIGHTS) -> None:
    """The same loss at every step and the same `names` after them, within `tolerance` (relative and absolute),
    and the steps moved the weights well beyond it (so the comparison means something)."""
    torch.testing.assert_close(torch.tensor(losses), theirs["losses"], rtol=tolerance, atol=tolerance)
    for name in names:
        torch.testing.assert_close(getattr(trainer.coder, name).detach(), theirs[f"final.{name}"], rtol=tolerance,
                                   atol=tolerance, msg=lambda m, name=name: f"{name} after {len(losses)} steps: {m}")
    assert (theirs["final.W_enc"] - theirs["initial.W_enc"]).abs().max() > 100 * tolerance
