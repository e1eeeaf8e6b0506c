"""The top-k merge behind corpus scans is associative and order-independent: random shards merged in random
orders give the brute-force top-k of all their tokens under (score descending, flat id ascending), ties
included. No Ray needed."""

import random

import numpy as np
import pytest
import torch
from random_models import make_random_model

from resid.analyses import Execution, neurons
from resid.analyses.neurons import scan as scan_module
from resid.analyses.neurons.topk import EMPTY_FLAT, TopK

K, N_NEURONS = 5, 7


def _tokens(seed: int, n_tokens: int):
    """Scores from a small set of values (many exact ties), unique flat ids, some tokens masked."""
    generator = torch.Generator().manual_seed(seed)
    post = torch.randint(-3, 4, (n_tokens, N_NEURONS), generator=generator).float() / 2
    flat = torch.randperm(10 * n_tokens, generator=generator)[:n_tokens].sort().values
    valid = torch.rand(n_tokens, generator=generator) > 0.2
    return post, flat, valid


def _brute_force(post, flat, valid, sign: str) -> tuple[np.ndarray, np.ndarray]:
    """[K neuron] coefficients and flat ids of the best K valid tokens per neuron (-1: fewer than K)."""
    score = {"positive": post, "negative": -post, "abs": post.abs()}[sign].numpy()
    coefficient, ids = np.zeros((K, N_NEURONS), np.float32), np.full((K, N_NEURONS), EMPTY_FLAT)
    keep = valid.numpy()
    for neuron in range(N_NEURONS):
        order = np.lexsort((flat.numpy()[keep], -score[keep, neuron]))[:K]
        coefficient[: len(order), neuron] = post.numpy()[keep, neuron][order]
        ids[: len(order), neuron] = flat.numpy()[keep][order]
    return coefficient, ids


def _scan_shard(post, flat, valid, sign: str, batch: int) -> TopK:
    best = TopK.empty(K, N_NEURONS, torch.device("cpu"))
    for start in range(0, len(post), batch):
        rows = slice(start, start + batch)
        best = best.add(post[rows][None], valid[rows][None], flat[rows][None], sign)
    return best


@pytest.mark.parametrize("sign", ["positive", "negative", "abs"])
@pytest.mark.parametrize("seed", range(6))
def test_random_shards_in_random_order_equal_the_brute_force(seed: int, sign: str):
    rng = random.Random(seed)
    post, flat, valid = _tokens(seed, n_tokens=rng.randint(3, 60))
    cuts = sorted(rng.sample(range(1, len(post)), k=min(len(post) - 1, rng.randint(0, 5))))
    bounds = list(zip([0, *cuts], [*cuts, len(post)]))
    shards = [_scan_shard(post[a:b], flat[a:b], valid[a:b], sign, rng.randint(1, 8)) for a, b in bounds]
    rng.shuffle(shards)
    merged = shards[0]
    for shard in shards[1:]:
        merged = merged.merge(shard) if rng.random() < 0.5 else shard.merge(merged)
    coefficient, ids = _brute_force(post, flat, valid, sign)
    np.testing.assert_array_equal(merged.flat.numpy(), ids)
    np.testing.assert_array_equal(merged.coefficient.numpy(), coefficient)


def test_merge_is_associative_and_commutative():
    parts = [_scan_shard(*_tokens(seed, 20), "abs", 6) for seed in range(3)]
    a, b, c = parts
    left, right = a.merge(b).merge(c), a.merge(b.merge(c))
    for x, y in ((left, right), (a.merge(b), b.merge(a))):
        for name in ("score", "coefficient", "flat"):
            torch.testing.assert_close(getattr(x, name), getattr(y, name), rtol=0, atol=0)


def test_ties_go_to_the_earliest_tokens():
    """All scores equal: torch.topk may pick any K; the list must hold the K smallest flat ids."""
    post = torch.ones(1, 12, N_NEURONS)
    flat = torch.arange(12)[None] * 3
    valid = torch.ones(1, 12, dtype=torch.bool)
    best = TopK.empty(K, N_NEURONS, torch.device("cpu")).add(post, valid, flat, "positive")
    assert (best.flat == (torch.arange(K) * 3)[:, None]).all()


def test_sharding_does_not_change_the_table(gpt2_tokenizer, monkeypatch):
    """Shards are whole batches, so any shard size gives the same batches and the very same table."""
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    texts = ["The weather was fine and the garden was green, so we walked to the river and back again.",
             "My neighbour has a cat that sleeps all day.", "Numbers such as 12 and 40 appear here."] * 3
    tables = []
    for per_shard in (1, 3, 1000):
        monkeypatch.setattr(scan_module, "SHARD_BATCHES", per_shard)
        tables.append(neurons.top_activating(model, texts, layers=[0, 2], k=4, window=7,
                                             execution=Execution(batch_size=3)))
    assert tables[0].equals(tables[1]) and tables[0].equals(tables[2])
