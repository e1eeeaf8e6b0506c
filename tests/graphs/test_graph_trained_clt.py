"""A cross-layer transcoder trained by resid (resid.analyses.training.crosslayer) gives exact attribution graphs:
the same checks as the random CLTs of test_graph_exact (graph_checks.check_sums), on a few steps' weights."""

import pytest
from graph_checks import check_sums
from numerics import TINY
from random_models import make_random_model

from resid.analyses.distributed.execution import Execution
from resid.analyses.io import corpus
from resid.analyses.training.crosslayer import train_crosslayer
from resid.analyses.training.recipe import Recipe

IDS = [11, 5, 7, 2, 9, 31, 3]
RECIPE = Recipe(activation="batchtopk", k=4, d_sae=32, steps=6, batch_size=96, warmup_steps=2, dead_tokens=200,
                threshold_start_step=2, lr=3e-2)


@pytest.mark.parametrize("kind", ["llama_gqa", "neox_parallel"])
def test_a_trained_clt_graph_is_exact(kind, gpt2_tokenizer) -> None:
    model = make_random_model(kind, gpt2_tokenizer)
    clt = train_crosslayer(model, corpus.demo(max_documents=20), RECIPE, Execution(batch_size=4, progress=False),
                           window=24, buffer_tokens=200)
    check_sums(model, clt, IDS, TINY)
