"""Each dictionary's initial weights are seeded by the recipe's seed and its Sites (coder.init_seed): dictionaries
trained in one call start from different matrices (one seed for all gave an SAE's and a transcoder's decoder rows a
cosine of 0.9998, two layers' transcoders 0.989), and a dictionary starts the same alone or beside others."""

import itertools
import subprocess
import sys

import torch
import torch.nn.functional as F

from resid.analyses.distributed.execution import Execution
from resid.analyses.training.coder import init_seed
from resid.analyses.training.loop import Spec, train
from resid.analyses.training.recipe import Recipe
from resid.sites import Site

# one step of about 1e-12 per weight: the dictionaries as initialised
RECIPE = Recipe(activation="topk", k=4, d_sae=64, steps=1, batch_size=96, warmup_steps=0, lr=1e-12)
QUIET = Execution(batch_size=4, progress=False)


def test_dictionaries_trained_together_start_apart_and_as_each_alone(bos_model, texts) -> None:
    specs = [Spec(Site(0, "resid_post")), Spec.transcoder(bos_model, 0), Spec.transcoder(bos_model, 1)]
    together = train(bos_model, texts, specs, RECIPE, QUIET, window=24, buffer_tokens=100)
    for a, b in itertools.combinations(together, 2):
        cosine = F.cosine_similarity(a.W_dec, b.W_dec, dim=1).abs()  # random 48-dim rows: about 0.1
        assert cosine.mean() < 0.3 and cosine.max() < 0.8, (a, b, cosine)
    alone = train(bos_model, texts, specs[2:], RECIPE, QUIET, window=24, buffer_tokens=100)[0]
    torch.testing.assert_close(alone.W_dec, together[2].W_dec, atol=1e-8, rtol=0)
    torch.testing.assert_close(alone.W_enc, together[2].W_enc, atol=1e-8, rtol=0)


def test_the_seed_is_stable_across_processes_and_differs_by_seed_and_site() -> None:
    """sha256, not Python's hash() (salted per process: a resumed or repeated run would start elsewhere)."""
    code = "from resid.analyses.training.coder import init_seed; print(init_seed(3, 'layers[2].mlp'))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(other.stdout) == init_seed(3, "layers[2].mlp")
    seeds = {init_seed(s, site) for s in (0, 1) for site in ("layers[2].mlp", "layers[3].mlp", "")}
    assert len(seeds) == 6 and all(0 <= s < 2**63 for s in seeds)
    assert init_seed(5, None) == 5  # a Trainer made without Sites: the recipe's seed
