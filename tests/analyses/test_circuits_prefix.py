"""The positions clean and corrupt prompts share (resid.analyses.circuits.prefix) run once: every edge-patched pass
over the positions after them equals the whole pass (learned positions, sliding windows, latent attention, parallel
blocks, padding), and circuit evaluation and exact patching use it only where it holds."""

import dataclasses

import pytest
import torch
from random_models import make_random_model

import resid
from resid.analyses.circuits.evaluation import _forwards, circuit_values
from resid.analyses.circuits.exact import edge_effects
from resid.analyses.circuits.graph import EdgeGraph
from resid.analyses.circuits.patched import patched_logits, plain_writes
from resid.analyses.circuits.prefix import SharedPrefix
from resid.tokenizer import Tokens


def model_of(kind: str):
    if kind == "deepseek":
        from moe_models import make_deepseek_model

        return make_deepseek_model()
    return make_random_model(kind)


def late_pairs(n_pos: int = 10, first: int = 6, vocab: int = 97, lengths=None) -> tuple[Tokens, Tokens]:
    """Three pairs that differ from column `first` on (and at the second-last real token); `lengths`: each row's
    real tokens, right-padded (the pads equal in both)."""
    g = torch.Generator().manual_seed(4)
    clean = torch.randint(0, vocab, (3, n_pos), generator=g)
    corrupt = clean.clone()
    corrupt[:, first] = (clean[:, first] + 1 + torch.arange(3)) % vocab
    corrupt[:, -2] = torch.randint(0, vocab, (3,), generator=g)
    if lengths is None:
        return Tokens.from_ids(clean), Tokens.from_ids(corrupt)
    mask = torch.arange(n_pos)[None] < torch.tensor(lengths)[:, None]
    corrupt = torch.where(mask, corrupt, clean)
    positions = (mask.long().cumsum(1) - 1).clamp(min=0)
    return Tokens(clean, mask, positions), Tokens(corrupt, mask, positions)


@pytest.mark.parametrize("kind", ["llama_gqa", "gpt2_like", "gemma3_like", "deepseek", "neox_parallel"])
def test_passes_after_the_prefix_equal_whole_passes(kind):
    model = model_of(kind)
    graph = EdgeGraph.of(model.config)
    clean, corrupt = late_pairs()
    prefix = SharedPrefix.of(model, clean, corrupt)
    assert prefix.start == 6
    whole, after = plain_writes(model, corrupt), plain_writes(model, corrupt, prefix)
    torch.testing.assert_close(after.logits, whole.logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(after.mlp[-1], whole.mlp[-1][:, 6:], atol=1e-4, rtol=1e-4)
    g = torch.Generator().manual_seed(1)
    masks = [graph.valid & (torch.rand(graph.valid.shape, generator=g) < p) for p in (0.05, 0.3, 0.9)]
    keep = torch.stack([*masks, graph.full(), graph.empty()]).float()
    expected = patched_logits(model, graph, clean, whole, keep)  # the large circuits' form: terms patched
    got = patched_logits(model, graph, clean, after, keep, prefix)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    for i in range(3):  # one circuit a pass: the small ones skip the sublayers where they have no live term
        one = patched_logits(model, graph, clean, after, keep[i:i + 1], prefix)
        torch.testing.assert_close(one, expected[i:i + 1], atol=1e-4, rtol=1e-4)
    assert len({round(float(row.abs().sum()), 2) for row in expected}) >= 3  # the circuits differ


def test_padded_rows_keep_their_last_token_after_the_prefix():
    """Right-padded pairs: the prefix ends no later than the shortest prompt's last token, and the patched passes
    and exact scores equal the whole passes'."""
    model = make_random_model("llama_gqa")
    graph = EdgeGraph.of(model.config)
    clean, corrupt = late_pairs(lengths=[5, 10, 8])
    prefix = SharedPrefix.of(model, clean, corrupt)
    assert prefix.start == 4
    t, b = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])
    g = torch.Generator().manual_seed(2)
    mask = graph.valid & (torch.rand(graph.valid.shape, generator=g) < 0.2)
    got = circuit_values(model, graph, clean, corrupt, t, b, "logit_diff", [mask])
    whole = plain_writes(model, corrupt)
    logits = patched_logits(model, graph, clean, whole, torch.stack([mask, graph.full(), graph.empty()]).float())
    expected = (logits[..., 1:4].diagonal(dim1=1, dim2=2) - logits[..., 4:7].diagonal(dim1=1, dim2=2))
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    chosen = torch.arange(0, graph.n_edges, 37).numpy()
    scores = edge_effects(model, graph, clean, corrupt, t, b, "logit_diff", chosen)
    writers, readers = graph.edges
    keep = graph.full().float().expand(len(chosen), -1, -1).clone()
    keep[torch.arange(len(chosen)), writers[chosen], readers[chosen]] = 0
    alone = patched_logits(model, graph, clean, whole, keep)
    diff = alone[..., 1:4].diagonal(dim1=1, dim2=2) - alone[..., 4:7].diagonal(dim1=1, dim2=2)
    torch.testing.assert_close(scores[writers[chosen], readers[chosen]], (diff - expected[1]).sum(1),
                               atol=1e-4, rtol=1e-4)


def test_no_prefix_where_none_is_shared():
    model = make_random_model("llama_gqa")
    clean, corrupt = late_pairs(first=0)
    assert SharedPrefix.of(model, clean, corrupt) is None  # the first tokens differ
    clean, corrupt = late_pairs()
    assert SharedPrefix.of(model, clean, corrupt, reference="mean") is None  # a mean differs everywhere
    assert SharedPrefix.of(model, clean, Tokens.from_ids(corrupt.ids[:, :-1])) is None  # unequal widths
    bidirectional = resid.Transformer(dataclasses.replace(model.config, causal=False), name="bidirectional")
    assert SharedPrefix.of(bidirectional, clean, corrupt) is None  # every position reads the later ones


def test_small_circuits_share_a_pass_and_large_ones_run_alone():
    """The curve's passes (_forwards): consecutive circuits of one form, small ones together while a shared pass
    computes no more than their own passes, large ones each alone once their differences pass the bound."""
    model = make_random_model("llama_gqa")
    graph = EdgeGraph.of(model.config)
    g = torch.Generator().manual_seed(3)
    scores = torch.rand(graph.valid.shape, generator=g)
    from resid.analyses.circuits.selection import top_ks

    masks = top_ks(graph, scores, [2, 3, 4, graph.n_edges - 3, graph.n_edges - 2])
    elements = 1 << 22  # a writer's difference in one circuit's rows: two large circuits pass the bound together
    blocks = _forwards(masks, graph, True, True, 3, elements)
    assert blocks[-2:] == [[3], [4]]
    assert [i for block in blocks for i in block] == list(range(5))
    assert len(blocks[0]) > 1  # the smallest circuits touch the same few sublayers
    assert _forwards(masks, graph, True, True, 3, 1)[-1] == [3, 4]  # small differences: together
