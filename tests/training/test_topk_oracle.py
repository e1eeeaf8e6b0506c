"""resid's topk recipe against sparsify's own SparseCoder (tests/data/topk-training, made by
tests/data/make_topk_training_reference.py in sparsify's own environment, following its Trainer's step): from the same
initial weights on the same batches, the same loss at every step and the same weights after them, through sparsify's
learning-rate schedule (a warm-up from zero, then a linear decay).

Not covered by the fixture: dead features (none within a few steps, so AuxK is zero on both sides)."""


import pytest
from oracle_steps import assert_steps_match, fixture, replay

from resid.analyses.training.recipe import Recipe

# float32 on both sides, the same operations in another order (a sparse decode by embedding_bag against sparsify's
# gather, the norm's eps): a few steps of Adam keep the differences near float32 rounding of values of size ~1
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def reference():
    return fixture("topk-training")


def test_steps_equal_sparsifys(reference):
    theirs, settings = reference
    recipe = Recipe(activation="topk", d_sae=settings["d_sae"], k=settings["k"], steps=settings["steps"],
                    batch_size=settings["batch"], lr=settings["lr"], warmup_steps=settings["warmup_steps"],
                    decay_steps=settings["decay_steps"], auxk_alpha=settings["auxk_alpha"], b_dec_init="mean")
    assert_steps_match(*replay(recipe, settings["d_in"], theirs), theirs, TOLERANCE)
