"""QK attribution is exact: the writes into the residual at a position sum to the run's residual, and a head's
score splits into pairs (query-side term, key-side term) that sum to the run's own score, on every family resid
loads (pre-norm, GPT-2 biases and learned positions, parallel blocks, Gemma gains, sandwich norms with q/k norms, a
soft cap, GQA and sliding windows, post-norms only with q/k norms over every head), through per-layer or
cross-layer transcoders; contrasts and marginals sum to what they contrast; bad input gets one clear error."""

import pytest
import torch
from numerics import TINY
from random_models import make_random_model
from random_transcoders import cross_layer, per_layer

import resid
from resid.analyses.graphs.qk import QK
from resid.sites import Site

IDS = [11, 5, 7, 2, 9, 31, 3]
APPROX = dict(rel=TINY["rtol"], abs=TINY["atol"])


def _raw(qk: QK, layer: int, head: int, query: int, key: int) -> float:
    """The run's own score before any soft cap."""
    score = qk.run.stream.layers[layer].attn.scores[0, head, query, key].double()
    cap = qk.model.blocks[layer].attn.softcap
    return float(score if cap is None else cap * torch.atanh(score / cap))


def _check_exact(qk: QK) -> None:
    model = qk.model
    for layer in range(model.config.n_layers):
        resid_pre = qk.run.read(Site(layer, "resid_pre"))[0].float()
        for position in range(len(IDS)):
            terms = qk.terms(layer, position)
            torch.testing.assert_close(terms.vectors.sum(0), resid_pre[position], **TINY)
        for head in range(model.config.n_heads):
            for key in range(len(IDS)):
                if not bool(torch.isfinite(qk.run.stream.layers[layer].attn.scores[0, head, -1, key])):
                    continue
                result = qk.score(layer, head, query=-1, key=key)
                expected = _raw(qk, layer, head, len(IDS) - 1, key)
                assert result.raw == pytest.approx(expected, **APPROX)
                assert result.run_raw == pytest.approx(expected, rel=1e-6, abs=1e-6)


def test_pairs_sum_to_every_score_of_every_family(random_model) -> None:
    _check_exact(QK(random_model, IDS, per_layer(random_model)))


@pytest.mark.parametrize("changes", [dict(nope_layers=(1,)), dict(qk_norm="head", qk_norm_after_rotary=True),
                                     dict(attn_sinks=True)],
                         ids=["nope_layers", "qk_norm_after_rotary", "attn_sinks"])
def test_pairs_sum_to_the_scores_of_the_issue_58_attention_options(changes) -> None:
    """SmolLM3's NoPE layers (no rotation there), Hunyuan's q/k norms after the rotary (rotate, then norm) and
    gpt-oss's sinks (the scores are as without them; only the pattern's softmax has the sink)."""
    model = make_random_model("llama_gqa", **changes)
    _check_exact(QK(model, IDS, per_layer(model)))


@pytest.mark.parametrize("kind", ["llama_gqa", "gemma3_like", "neox_parallel"])
def test_pairs_sum_to_the_scores_through_a_cross_layer_transcoder(kind) -> None:
    model = make_random_model(kind)
    _check_exact(QK(model, IDS, cross_layer(model)))


def test_terms_name_the_graphs_nodes_and_the_heads() -> None:
    """The query side holds the embedding, each earlier head's write, the active features and error nodes of the
    layers below at that position, and the map's constant; with skip_bos position 0's MLP writes are constants."""
    model = make_random_model("gpt2_like")
    transcoders = per_layer(model)
    qk = QK(model, IDS, transcoders, skip_bos=True)
    result = qk.score(2, 1, query=-1, key=3)
    labels = [s.label for s in result.query_sites]
    assert labels[:2] == ["embed@6", "pos_embed@6"]
    assert {f"layers[{l}].attn.head[{h}]@6" for l in range(2) for h in range(4)} <= set(labels)
    assert {"layers[0].mlp.error@6", "layers[1].mlp.skip@6", "layers[2].attn.b_Q@6"} <= set(labels)
    features = [s for s in result.query_sites if s.feature is not None]
    assert features and all(s.layer < 2 and s.positions == (6,) for s in features)
    assert labels.count("layers[2].attn.b_Q@6") == 1 and result.key_sites[-1].label == "layers[2].attn.b_K@3"
    at_zero = [s.label for s in qk.terms(2, 0).sites]
    assert "layers[0].mlp@0" in at_zero and not any(Site.parse(s).feature is not None for s in at_zero)
    _check_exact(qk)


def test_contrasts_and_marginals_sum_to_what_they_contrast() -> None:
    model = make_random_model("llama_gqa")
    qk = QK(model, IDS, per_layer(model))
    layer, head, q = 2, 3, len(IDS) - 1
    raw = [_raw(qk, layer, head, q, k) for k in range(len(IDS))]
    versus = qk.score(layer, head, key=4, versus=1)
    assert versus.raw == pytest.approx(raw[4] - raw[1], **APPROX)
    mean = qk.score(layer, head, key=4, versus="mean")
    pattern = qk.run.stream.layers[layer].attn.pattern[0, head, q].double()
    assert mean.raw == pytest.approx(raw[4] - float((pattern * torch.tensor(raw)).sum()), **APPROX)
    for result in (versus, mean):
        assert result.query_marginal()["value"].sum() == pytest.approx(result.raw, **APPROX)
        assert result.key_marginal()["value"].sum() == pytest.approx(result.raw, **APPROX)
        pairs = result.pairs()
        assert float(pairs.double().sum()) == pytest.approx(result.raw, **APPROX)
        top = result.top(5)
        assert torch.allclose(torch.tensor(top["value"].abs().to_numpy()).float(),
                              pairs.flatten().abs().topk(5).values, **TINY)
    best = qk.score(layer, head)  # key None: the most attended key
    assert best.weights == {int(pattern.argmax()): 1.0}


def test_the_prediction_of_removing_a_term_is_the_frozen_form() -> None:
    """validate: each removed term's predicted score is the run's score minus that term's marginal (for a key-side
    term at the key, no soft cap), and the measured one comes from the real model with the term removed."""
    model = make_random_model("llama_gqa")
    qk = QK(model, IDS, per_layer(model))
    result = qk.score(2, 1, key=3)
    table = qk.validate(result, top=3)
    assert list(table["side"]) == ["query"] * 3 + ["key"] * 3
    marginal = result.key_marginal().set_index("site")["value"]
    for row in table[table["side"] == "key"].itertuples():
        if row.position == 3:
            assert row.predicted_score == pytest.approx(result.run_scores[3] - marginal[row.term], **APPROX)
    assert (table["measured_score"] != result.run_scores[3]).all()
    assert table["measured_pattern"].between(0, 1).all() and table["predicted_pattern"].between(0, 1).all()


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(site=1, head=0, query=2, key=5), "cannot read position 5"),
    (dict(site=1, head=0, query=-1, key=2, versus=2), "the key itself"),
    (dict(site=1, head=4, query=-1, key=2), "has 4 heads"),
    (dict(site=1, head=0, query=9, key=2), "outside the prompt's 7 positions"),
    (dict(site=3, head=0, query=-1, key=2), "layer"),
    (dict(site=1, head=0, query=-1, key=2, versus="median"), "'mean'"),
    (dict(site=1, key=2), r"score\(1\) needs the head: score\(Site\(1, 'attn', head=H\)\) or score\(1, H\)"),
    (dict(site=Site(1, "attn", head=4), key=2), "head 4 is out of range; the model has 4 heads"),
    (dict(site=Site(1, "mlp", neuron=3), key=2), "is not an attention head"),
    (dict(site=Site(1, "attn"), key=2), "is not an attention head"),
    (dict(site=Site(1, "attn", head=0), head=0, key=2), "names the head already"),
    (dict(site=Site(1, "attn", head=0, positions=(6,)), query=6, key=2), "one query position"),
    (dict(site=Site(1, "attn", head=0, positions=(5, 6)), key=2), "one query position"),
])
def test_bad_positions_heads_and_layers_get_one_clear_error(kwargs, match) -> None:
    model = make_random_model("llama_gqa")
    qk = QK(model, IDS, per_layer(model))
    with pytest.raises(resid.ResidError, match=match):
        qk.score(**kwargs)


def test_a_head_site_is_the_layer_and_head_and_its_position_the_query() -> None:
    model = make_random_model("llama_gqa")
    qk = QK(model, IDS, per_layer(model))
    by_ints = qk.score(2, 1, query=5, key=3, versus=1)
    for site, query in ((Site(2, "attn", head=1, positions=(5,)), None), (Site(2, "attn", head=1), 5),
                        (Site(-1, "attn", head=-3, field="pattern", positions=(-2,)), None)):
        result = qk.score(site, query=query, key=3, versus=1)
        assert (result.layer, result.head, result.query, result.weights) == (2, 1, 5, by_ints.weights)
        assert result.raw == by_ints.raw and result.head_site == Site(2, "attn", head=1, positions=(5,))


def test_a_key_outside_a_sliding_window_is_refused() -> None:
    model = make_random_model("gemma3_like")  # layer 0 slides over 4 positions
    qk = QK(model, IDS, per_layer(model))
    with pytest.raises(resid.ResidError, match="within its window"):
        qk.score(0, 0, query=6, key=1)


def test_summaries_hold_the_pairs_and_the_contrast_of_each_head_and_key() -> None:
    """What the viewer shows for a head carrying an edge: the same numbers as score(), as plain JSON values."""
    model = make_random_model("llama_gqa")
    qk = QK(model, IDS, per_layer(model))
    head = Site(2, "attn", head=1, positions=(6,))
    found = qk.summaries([(head, 3), (head, 3), (Site(1, "attn", head=0, positions=(5,)), 5)], top=3)
    assert list(found) == ["layers[2].attn.head[1]@6->3", "layers[1].attn.head[0]@5->5"]
    entry, result = found["layers[2].attn.head[1]@6->3"], qk.score(2, 1, query=6, key=3)
    assert entry["raw"] == pytest.approx(result.raw) and entry["pattern"] == pytest.approx(result.pattern[3])
    assert [row[:2] for row in entry["pairs"]] == result.top(3)[["query", "key"]].values.tolist()
    assert entry["versus_mean"]["raw"] == pytest.approx(qk.score(2, 1, query=6, key=3, versus="mean").raw)
    assert len(entry["key_terms"]) == 3 and all(isinstance(v, float) for _, v in entry["query_terms"])


def test_latent_attention_is_refused_with_what_to_do() -> None:
    """DeepSeek's queries and keys read normed latents and a shared rotary key, which QK attribution does not
    decompose: refused by name, not computed wrong."""
    from moe_models import make_deepseek_model
    model = make_deepseek_model()
    with pytest.raises(resid.ResidError, match=r"Layer \d is latent attention \(DeepSeek\).*does not decompose yet"):
        QK(model, IDS, per_layer(model)).score(1, 0, query=-1, key=2)
