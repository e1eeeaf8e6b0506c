"""Attribution graphs are exact for the local replacement model: run forward from its node writes it reproduces the
model's logits; the edges into every node plus its constant terms (the same forward with every node write zero)
equal its value; an edge equals the product through the frozen attention written out in the test; the batching
changes no edge; pruning keeps what it is asked to keep."""

import pytest
import torch
from graph_checks import check_sums
from numerics import TINY
from random_transcoders import cross_layer, per_layer

import resid
from resid.analyses import Execution, graphs

IDS = [11, 5, 7, 2, 9, 31, 3]


def _check_sums(model, transcoders, **options) -> graphs.Graph:
    return check_sums(model, transcoders, IDS, TINY, **options)


def test_edges_into_every_node_sum_to_its_value_minus_its_bias(random_model) -> None:
    """Every family (pre-norm, GPT-2 biases, parallel, Gemma gains, sandwich norms with soft caps, post-norms
    only), per-layer transcoders with a skip path on one layer."""
    _check_sums(random_model, per_layer(random_model))


@pytest.mark.parametrize("kind", ["llama_gqa", "gemma3_like", "neox_parallel"])
def test_a_cross_layer_transcoder_graph_is_exact(kind, gpt2_tokenizer) -> None:
    from random_models import make_random_model
    model = make_random_model(kind)
    _check_sums(model, cross_layer(model))


def test_a_mixture_of_experts_model_is_exact() -> None:
    """Transcoders replace the whole MoE MLP (router and experts) like any MLP."""
    from moe_models import make_moe_model
    model = make_moe_model(post_norms=True)
    _check_sums(model, per_layer(model))


def test_a_deepseek_model_is_exact() -> None:
    """Latent attention (its pattern and its latent's norm scale frozen), a dense first layer and shared experts,
    all replaced by transcoders."""
    from moe_models import make_deepseek_model
    model = make_deepseek_model()
    _check_sums(model, per_layer(model))


def test_other_transcoder_hooks_are_exact() -> None:
    """JumpReLU transcoders reading the MLP's normalized input (after the gain) of a sandwich-norm model; ones
    writing before the post-norm (circuit-tracer's mlp.hook_out there) are refused, as in every resid run."""
    from random_models import make_random_model
    model = make_random_model("gemma3_like")
    _check_sums(model, per_layer(model, activation="jumprelu", standardized=False))
    with pytest.raises(resid.ResidError, match="before its post-norm"):
        graphs.attribute(model, IDS, per_layer(model, before_post_norm=True))


def test_skipping_bos_makes_position_0s_mlp_writes_constants() -> None:
    """As circuit-tracer's zero_bos: no feature node at position 0 and its error nodes write nothing; the sums
    still hold with those writes among the constants."""
    from random_models import make_random_model
    model = make_random_model("llama_gqa")
    graph = _check_sums(model, per_layer(model), skip_bos=True)
    assert graph.skip_bos and not bool((graph.features[:, 1] == 0).any())
    errors_at_0 = [graph.n_features + layer * graph.n_pos for layer in range(graph.n_layers)]
    assert not bool(graph.rows[:, errors_at_0].any())
    kept = graphs.attribute(model, IDS, per_layer(model))
    assert not kept.skip_bos and bool((kept.features[:, 1] == 0).any())  # no tokenizer BOS: kept by default


def test_an_edge_is_the_product_through_the_frozen_attention() -> None:
    """Token p -> a layer-0 feature at q: the embedding read through layer 0's pre-norm (scale frozen), each head's
    V and O with the run's pattern, plus the residual path when p == q, then the MLP's norm and the encoder."""
    from random_models import make_random_model
    model = make_random_model("llama_gqa")
    transcoders = per_layer(model, standardized=False)
    graph = graphs.attribute(model, IDS, transcoders)
    run = model.run(torch.tensor([IDS]), capture=resid.Capture(attn={"pattern", "norm_scale"}, mlp={"norm_scale"}))
    block, record = model.blocks[0], run.stream.layers[0]
    attn = block.attn
    embed = run.stream.embed[0]
    rep = attn.n_heads // attn.n_kv_heads
    checked = 0
    for row, (layer, q, f) in enumerate(graph.features.tolist()):
        if layer != 0 or q < 2:
            continue
        for p in range(q + 1):
            x = embed[p] * record.attn.norm_scale[0, p] * block.ln_attn.gain  # RMSNorm, scale frozen, no bias
            through = sum(record.attn.pattern[0, h, q, p] * (x @ attn.W_V[h // rep] @ attn.W_O[h])
                          for h in range(attn.n_heads))
            at_q = through + (embed[p] if p == q else 0)
            read = at_q * record.mlp.norm_scale[0, q] * block.ln_mlp.gain
            expected = read @ transcoders[0].W_enc[:, f]
            column = graph.n_features + graph.n_errors + p
            torch.testing.assert_close(graph.adjacency[row, column], expected.detach(), **TINY)
            checked += 1
    assert checked > 10


def test_the_batching_changes_no_edge() -> None:
    from random_models import make_random_model
    model = make_random_model("gemma3_like")
    transcoders = per_layer(model)
    one = graphs.attribute(model, IDS, transcoders, execution=Execution(batch_size=7))
    many = graphs.attribute(model, IDS, transcoders, execution=Execution(batch_size=500))
    torch.testing.assert_close(one.adjacency, many.adjacency, **TINY)


def test_a_feature_budget_keeps_the_rows_of_the_features_it_visits() -> None:
    from random_models import make_random_model
    model = make_random_model("llama_gqa")
    transcoders = per_layer(model)
    full = graphs.attribute(model, IDS, transcoders)
    part = graphs.attribute(model, IDS, transcoders, max_feature_nodes=30, update_interval=1,
                            execution=Execution(batch_size=8))
    assert part.n_features == 30
    index = [full.features.tolist().index(f) for f in part.features.tolist()]
    columns = torch.cat([torch.tensor(index), torch.arange(full.n_features, full.n_nodes)])
    rows = torch.cat([torch.tensor(index), torch.arange(full.n_nodes - full.n_logits, full.n_nodes)])
    torch.testing.assert_close(part.adjacency[:30], full.adjacency[index][:, columns], **TINY)
    torch.testing.assert_close(part.adjacency[-part.n_logits:], full.adjacency[rows[-full.n_logits:]][:, columns],
                               **TINY)
    # the visited features are among the most influential as the full graph ranks them
    influence = full.influence()[:full.n_features]
    assert influence[index].mean() > influence.mean()


def test_pruning_keeps_the_requested_share_of_influence() -> None:
    from random_models import make_random_model
    model = make_random_model("llama_gqa")
    graph = graphs.attribute(model, IDS, per_layer(model))
    for node_threshold in (0.5, 0.8, 0.95):
        result = graph.prune(node_threshold, 0.98)
        kept = result.node_mask
        fixed = graph.n_logits + graph.n_pos
        assert bool(kept[-fixed:].all())  # tokens and logits always stay
        # a kept feature or error is among the most influential nodes holding node_threshold of the influence
        ranked = result.cumulative_scores[:-fixed][kept[:-fixed]]
        cutoff = result.cumulative_scores[result.cumulative_scores >= node_threshold].min()
        assert bool((ranked <= cutoff + 1e-6).all())
        edges = result.edge_mask
        assert not bool(edges[~kept[graph.row_nodes]].any()) and not bool(edges[:, ~kept].any())
        assert not bool((edges & (graph.rows == 0)).any())  # only real edges are kept
        assert bool(edges[:graph.n_features][kept[:graph.n_features]].any(1).all())  # kept features have inputs
        assert bool(edges[:, :graph.n_features][:, kept[:graph.n_features]].any(0).all())  # ... and outputs
    small, large = graph.prune(0.5).node_mask.sum(), graph.prune(0.95).node_mask.sum()
    assert small < large


def test_bad_transcoder_sets_are_refused_with_what_to_pass() -> None:
    from random_models import make_random_model
    model = make_random_model("llama_gqa")
    transcoders = per_layer(model)
    with pytest.raises(resid.ResidError, match=r"no transcoder replaces layer\(s\) \[2\]"):
        graphs.attribute(model, IDS, transcoders[:2])
    with pytest.raises(resid.ResidError, match="Two transcoders replace layer 0"):
        graphs.attribute(model, IDS, [transcoders[0], *transcoders])
    with pytest.raises(resid.ResidError, match="one cross-layer transcoder"):
        graphs.attribute(model, IDS, [transcoders[0], "layer 1"])
    with pytest.raises(resid.ResidError, match=r"max_n_logits=0 must be at least 1"):
        graphs.attribute(model, IDS, transcoders, max_n_logits=0)
