"""resid's relu and jumprelu recipes against SAELens's own SAETrainer (tests/data/saelens-steps, made by
tests/data/make_saelens_steps_reference.py in SAELens 6.54.12's own environment): from the same initial weights on
the same batches, through its warm-up, the same loss at every step and the same weights after them.

SAELens's trainer always clips the gradient norm at 1.0 (SAETrainer._train_step), so resid's Recipe takes clip=1.0
here; resid's default for these recipes is no clipping."""

import json
from pathlib import Path

import torch
from oracle_steps import assert_steps_match, replay
from safetensors.torch import load_file

from resid.analyses.training.recipe import Recipe
from resid.analyses.training.trainer import Trainer

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "saelens-steps"
# float32 on both sides; relu is the same operations in the same order (equal bitwise today); the tolerance allows
# float32 rounding of values of size ~1, far below what the steps move the weights (~6e-3)
TOLERANCE = 1e-5
SETTINGS = json.loads((FIXTURE / "settings.json").read_text())


def _run(recipe: str) -> tuple[Trainer, list[float], dict]:
    theirs, options = load_file(str(FIXTURE / f"{recipe}.safetensors")), SETTINGS["recipes"][recipe]
    extra = dict(l1_coefficient=options["l1_coefficient"]) if recipe == "relu" else dict(
        l0_coefficient=options["l0_coefficient"], bandwidth=options["jumprelu_bandwidth"],
        init_threshold=options["jumprelu_init_threshold"])
    trainer, losses = replay(Recipe(activation=recipe, d_sae=SETTINGS["d_sae"], steps=SETTINGS["steps"],
                                    batch_size=SETTINGS["batch"], lr=SETTINGS["lr"],
                                    warmup_steps=SETTINGS["warmup_steps"], clip=1.0, b_dec_init="zeros", **extra),
                             SETTINGS["d_in"], theirs)
    return trainer, losses, theirs


def test_relu_steps_equal_saelens_standard():
    trainer, losses, theirs = _run("relu")
    assert_steps_match(trainer, losses, theirs, TOLERANCE)


def test_jumprelu_steps_equal_saelens():
    """SAELens 6.54 trains the threshold itself (not its log) and keeps it non-negative: so does resid."""
    trainer, losses, theirs = _run("jumprelu")
    assert_steps_match(trainer, losses, theirs, TOLERANCE)
    torch.testing.assert_close(trainer.coder.threshold.detach(), theirs["final.threshold"], rtol=TOLERANCE,
                               atol=TOLERANCE)
    assert (theirs["final.threshold"] - theirs["initial.threshold"]).abs().max() > 100 * TOLERANCE
