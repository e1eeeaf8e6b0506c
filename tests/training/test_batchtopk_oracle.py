"""resid's batchtopk recipe against dictionary_learning's own BatchTopKTrainer (tests/data/batchtopk-training, made
by tests/data/make_batchtopk_training_reference.py in dictionary_learning's own environment): from the same initial
weights on the same batches, the same loss at every step and the same weights and threshold after them, through
dictionary_learning's warm-up (its factor step / warmup_steps, zero at step 0)."""


import pytest
from oracle_steps import WEIGHTS, assert_steps_match, fixture, replay

from resid.analyses.training.recipe import Recipe

# float32 throughout on both sides, the same operations in another order (topk over the flat batch, a sparse decode
# against a dense one): a few steps of Adam keep the differences near float32 rounding of values of size ~1
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def reference():
    return fixture("batchtopk-training")


def test_steps_equal_dictionary_learnings(reference):
    theirs, settings = reference
    recipe = Recipe(activation="batchtopk", d_sae=settings["d_sae"], k=settings["k"], steps=settings["steps"],
                    batch_size=settings["batch"], lr=settings["lr"], warmup_steps=settings["warmup_steps"],
                    threshold_start_step=settings["threshold_start_step"], clip=settings["clip"],
                    threshold_beta=settings["threshold_beta"], auxk_alpha=settings["auxk_alpha"],
                    b_dec_init="geometric_median")
    trainer, losses = replay(recipe, settings["d_in"], theirs)
    assert_steps_match(trainer, losses, theirs, TOLERANCE, (*WEIGHTS, "threshold"))
    assert float(theirs["final.threshold"]) > 0  # the threshold was tracked, so the comparison means something
