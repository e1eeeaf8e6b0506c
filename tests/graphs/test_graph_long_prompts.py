"""What keeps a long prompt's graph linear in memory changes no number: the patterns rebuilt from the run's queries
and keys (the default) give the graph the stored patterns give, to float32 rounding, on every attention variant
(causal, sliding windows shorter than the prompt, soft-capped scores, q/k norms, parallel blocks, latent
attention), truncated (a sweep below the last position) as well, and hold nothing of size pos x pos; the ranking of
max_feature_nodes from the rows in place (influence_of_rows) equals the series over the normalized rows."""

import pytest
import torch
from moe_models import make_deepseek_model
from numerics import TINY
from random_models import make_random_model
from random_transcoders import per_layer

from resid.analyses.graphs import influence
from resid.analyses.graphs.edges import Sweeper
from resid.analyses.graphs.frozen import Rebuilt
from resid.analyses.graphs.replacement import replace
from resid.analyses.graphs.rows import Batch, sweep

IDS = [11, 5, 7, 2, 9, 31, 3, 40, 8, 17]  # longer than gemma3_like's window of 4


def _model(kind: str):
    return make_deepseek_model() if kind == "deepseek" else make_random_model(kind)


@pytest.mark.parametrize("kind", ["llama_gqa", "gemma3_like", "neox_parallel", "deepseek"])
def test_rebuilt_patterns_give_the_stored_patterns_graph(kind) -> None:
    model = _model(kind)
    transcoders = per_layer(model)
    stored = replace(model, IDS, transcoders, store_patterns=True)
    rebuilt = replace(model, IDS, transcoders)
    assert isinstance(rebuilt.frozen.values, Rebuilt) and isinstance(stored.frozen.values, dict)
    assert set(rebuilt.frozen.values) == set(stored.frozen.values)
    for n_pos in (len(IDS), 6):
        a, b = stored.frozen.truncated(n_pos).values, rebuilt.frozen.truncated(n_pos).values
        for site in a:
            torch.testing.assert_close(b[site], a[site], **TINY)
    assert torch.equal(rebuilt.features, stored.features)
    # every row of the graph: each active feature's (sweeps truncated below the last position) and the logits'
    batches = [Batch(features=torch.arange(len(stored.features))), Batch(logits=torch.randn(3, model.config.d_model))]
    for batch in batches:
        torch.testing.assert_close(sweep(rebuilt, Sweeper(rebuilt), batch), sweep(stored, Sweeper(stored), batch),
                                   **TINY)


def test_rebuilt_values_hold_nothing_quadratic_in_the_prompt() -> None:
    model = make_random_model("llama_gqa", n_ctx=512)
    ids = torch.randint(0, 97, (512,), generator=torch.Generator().manual_seed(0))
    values = replace(model, ids, per_layer(model)).frozen.values
    held = [*values.stored.values(), *values.q.values(), *values.k.values()]
    assert max(t.numel() for t in held) < 512 * 512  # one head's pattern would be this size
    patterns = model.config.n_layers * model.config.n_heads * 512 * 512 * 4
    assert sum(t.numel() * t.element_size() for t in held) < patterns / 20


def test_the_ranking_in_place_equals_the_series_over_normalized_rows(monkeypatch) -> None:
    monkeypatch.setattr(influence, "CHUNK_FLOATS", 100)  # several chunks of rows
    g = torch.Generator().manual_seed(0)
    n_sources, n_features, n_logits = 70, 40, 3
    # rows of 12 visited features (a DAG: a feature reads only features of lower index) and 3 logits
    visited = torch.randperm(n_features, generator=g)[:12]
    rows = torch.randn(12 + n_logits, n_sources, generator=g)
    for i, feature in enumerate(visited.tolist()):
        rows[n_logits + i, feature:n_features] = 0
    rows[0, :5] = 0
    nodes = torch.cat([torch.arange(n_logits) + n_sources, visited])
    probs = torch.tensor([0.5, 0.3, 0.1])
    padded = torch.cat([rows, torch.zeros(len(rows), n_logits)], dim=1)
    expected = influence.node_influence(padded, nodes, probs)[:n_sources]
    assert expected[visited].abs().sum() > 0  # influence passes through the visited features
    torch.testing.assert_close(influence.influence_of_rows(rows, nodes, probs, n_sources), expected, **TINY)
