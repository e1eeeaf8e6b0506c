"""Geva-style neuron analyses on post-normed MLPs (values and sub-updates as written into the residual, through
the post-norm) and on mixtures of experts (neurons addressed as (expert, neuron))."""

import pytest
import torch
from random_models import make_random_model
from tiny_fixtures import Tiny

import resid
from resid.analyses import neurons
from resid.errors import ResidError

MIXTRAL = pytest.mark.parametrize("tiny", ["mixtral"], indirect=True)
POST_NORMED = pytest.mark.parametrize("kind", ["gemma3_like", "olmo2_like"])
PROMPTS = ["The quick brown fox jumps over the lazy", "Hello there"]


@POST_NORMED
def test_values_are_read_through_the_post_norm(kind, gpt2_tokenizer):
    model = make_random_model(kind, gpt2_tokenizer)
    df = neurons.value_top_tokens(model, layers=[1], k=3)
    block = model.blocks[1]
    written = block.ln_mlp_post.gain.detach().double() * block.mlp.W_out.detach().double()  # RMSNorm: no centering
    expected = model.readout.unembedding().double()
    top = (written @ expected).topk(3, dim=-1).indices.numpy()
    rows = df[df["direction"] == "top"]
    assert (rows["token_id"].to_numpy().reshape(-1, 3) == top).all()
    assert list(df.columns) == list(neurons.values.COLUMNS)


@POST_NORMED
def test_sub_updates_with_the_frozen_post_norm_scale_sum_to_the_write(kind, gpt2_tokenizer):
    model = make_random_model(kind, gpt2_tokenizer)
    run = model.run(PROMPTS, capture=resid.Capture(mlp={"post", "post_norm_scale", "out"}))
    for layer in range(model.config.n_layers):
        record = run.stream.layers[layer].mlp
        for row, pos in ((0, -1), (1, 1)):
            raw = neurons.sub_update_vectors(model, layer, record.post[row, pos])  # before the post-norm
            written = neurons.sub_update_vectors(model, layer, record.post[row, pos],
                                                 post_norm_scale=record.post_norm_scale[row, pos])
            torch.testing.assert_close(written.sum(0), record.out[row, pos], atol=1e-5, rtol=1e-5)
            norm = model.blocks[layer].ln_mlp_post
            torch.testing.assert_close(norm(raw.sum(0), record.post_norm_scale[row, pos])[0], record.out[row, pos],
                                       atol=1e-5, rtol=1e-5)


@POST_NORMED
def test_sub_updates_on_post_normed_models_are_exact(kind, gpt2_tokenizer):
    model = make_random_model(kind, gpt2_tokenizer)
    d_mlp = model.config.d_mlp
    df = neurons.sub_updates(model, PROMPTS[0], k=d_mlp, target=" dog")
    run = model.run(PROMPTS[0], capture=resid.Capture(positions=[-1], mlp={"out"}), logits_at=[-1])
    direction = model.readout.logit_direction([model.to_single_token(" dog")], run.stream.final_norm_scale[:, 0])
    for layer in range(model.config.n_layers):
        rows = df[(df["layer"] == layer) & (df["ranking"] == "target")]
        write = direction.project(run.stream.layers[layer].mlp.out[:, 0])[0]  # no b_out, RMSNorm: no bias
        assert rows["target_contribution"].sum() == pytest.approx(float(write), rel=1e-4, abs=1e-5)
        assert rows["layer_target"].iloc[0] == pytest.approx(float(write), rel=1e-4, abs=1e-5)
        assert rows["explained_target"].iloc[0] == pytest.approx(1.0, abs=1e-4)


def test_sub_update_vectors_refuse_a_scale_without_post_norms(gpt2_tokenizer):
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    with pytest.raises(ResidError, match="has no post-norms"):
        neurons.sub_update_vectors(model, 0, torch.zeros(model.config.d_mlp), post_norm_scale=torch.ones(1))


@MIXTRAL
def test_values_of_experts(tiny: Tiny):
    model = tiny.model
    df = neurons.value_top_tokens(model, layers=[1], experts=[0, 3], neurons=[5, 2], k=2)
    assert list(df.columns) == ["site", "layer", "expert", *neurons.values.COLUMNS[2:]]
    unembed = model.readout.unembedding()
    top = df[df["direction"] == "top"]
    assert top["expert"].unique().tolist() == [0, 3] and top["neuron"].unique().tolist() == [2, 5]
    for expert in (0, 3):
        expected = (model.blocks[1].mlp.W_out[expert, [2, 5]].detach() @ unembed).topk(2, dim=-1).indices
        assert (top[top["expert"] == expert]["token_id"].to_numpy().reshape(2, 2) == expected.numpy()).all()
    everything = neurons.value_top_tokens(model, k=1)
    assert len(everything) == 2 * 4 * 96 * 2
    with pytest.raises(ResidError, match=r"Experts \[4\] are not valid: each MLP has 4 experts"):
        neurons.value_top_tokens(model, experts=4)


def test_dense_models_take_no_experts(gpt2_tokenizer):
    with pytest.raises(ResidError, match="dense, not mixtures of experts"):
        neurons.value_top_tokens(make_random_model("llama_gqa", gpt2_tokenizer), experts=[0])


@MIXTRAL
def test_sub_updates_of_experts_are_exact(tiny: Tiny):
    model = tiny.model
    run = model.run(PROMPTS, capture=resid.Capture(mlp={"post", "expert_weights", "out"}))
    record = run.stream.layers[0].mlp
    updates = neurons.sub_update_vectors(model, 0, record.post[0, -1], record.expert_weights[0, -1])
    assert updates.shape == (4, 96, 48)
    torch.testing.assert_close(updates.sum((0, 1)), record.out[0, -1], atol=1e-5, rtol=1e-5)
    with pytest.raises(ResidError, match="mixture of 4 experts: pass post"):
        neurons.sub_update_vectors(model, 0, record.post[0, -1])

    df = neurons.sub_updates(model, PROMPTS[1], k=4 * 96)
    assert df.columns[:3].tolist() == ["site", "layer", "expert"]
    for layer in range(2):
        rows = df[(df["layer"] == layer) & (df["ranking"] == "target")]
        assert len(set(zip(rows["expert"], rows["neuron"]))) == 4 * 96
        assert rows["explained_target"].iloc[0] == pytest.approx(1.0, abs=1e-4)
        assert rows["target_contribution"].sum() == pytest.approx(rows["layer_target"].iloc[0], rel=1e-4, abs=1e-6)
        weights = run.stream.layers[layer].mlp.expert_weights[1, -1]  # PROMPTS[1]'s last token (left padding)
        unrouted = (weights == 0).nonzero()[:, 0].tolist()
        assert len(unrouted) == 2 and (rows[rows["expert"].isin(unrouted)]["target_contribution"] == 0).all()


@MIXTRAL
def test_top_activating_experts_counts_routed_tokens_only(tiny: Tiny):
    model = tiny.model
    texts = ["The quick brown fox jumps over the lazy dog.", "Hello there, general Kenobi."]
    df = neurons.top_activating(model, texts, layers=[1], neurons=[3], k=2)
    assert df.columns[:6].tolist() == ["site", "layer", "expert", "neuron", "rank", "coefficient"]
    run = model.run(texts, capture=resid.Capture(mlp={"post", "expert_weights"}))
    record = run.stream.layers[1].mlp
    real = run.tokens.attention_mask.clone()
    if model.tokenizer.prepend_bos:  # a BOS is never a trigger
        real[torch.arange(2), run.tokens.first_positions()] = False
    for expert in range(4):
        routed = real & (record.expert_weights[..., expert] > 0)
        best = record.post[..., expert, 3][routed].float()
        best = best.topk(min(2, len(best))).values  # an expert routed fewer than k tokens lists fewer
        got = df[df["expert"] == expert].sort_values("rank")["coefficient"].to_numpy()
        torch.testing.assert_close(torch.tensor(got), best.double(), atol=1e-5, rtol=1e-5)


@MIXTRAL
def test_coefficient_edits_of_experts(tiny: Tiny):
    model = tiny.model
    edits = neurons.set_coefficients(model, PROMPTS, [(1, 2, 7)], 5.0, positions=[-1])
    assert edits[0].site == resid.Site(1, "mlp", neuron=7, positions=[-1], expert=2)
    neurons.prediction_change(model, PROMPTS, edits, k=3)
    with pytest.raises(ResidError, match=r"\(layer, expert, neuron\) triples .*mixtures of experts"):
        neurons.set_coefficients(model, PROMPTS, [(1, 7)], 5.0)
