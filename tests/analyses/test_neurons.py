"""FFN key-value neurons: values equal a brute-force W_out @ W_U top-k, sub-updates sum to the MLP output,
coefficient edits match brute-force recomputation, and a planted memory is found by all three tools."""

import pytest
import torch
from tiny_fixtures import Tiny

import resid
from resid.analyses import neurons
from resid.errors import ResidError

PROMPTS = ["The quick brown fox jumps over the lazy", "Hello there"]


def _brute_value_logits(model, through_final_norm: bool) -> list[torch.Tensor]:
    """[d_mlp d_vocab] per layer, normalizing each value vector itself (not the unembedding)."""
    out = []
    for block in model.blocks:
        # mixture of experts: every (expert, neuron), experts first
        values = block.mlp.W_out.detach().double().reshape(-1, model.config.d_model)
        if block.ln_mlp_post is not None:  # a value as written: through the post-norm's gain
            values = block.ln_mlp_post.linear(values).double()
        if through_final_norm:
            if model.ln_final.centre:
                values = values - values.mean(-1, keepdim=True)
            values = values * model.ln_final.gain.detach().double()
        out.append(values @ model.unembed.W_U.detach().double())
    return out


@pytest.mark.parametrize("through_final_norm", [True, False])
def test_value_top_tokens_equal_brute_force(random_model, through_final_norm):
    k = 4
    # 7 neurons per chunk: several chunks per layer, a partial one at the end.
    df = neurons.value_top_tokens(random_model, k=k, through_final_norm=through_final_norm,
                                  chunk_bytes=4 * random_model.config.d_vocab * 7)
    d_mlp, n_layers = random_model.config.d_mlp, random_model.config.n_layers
    assert len(df) == n_layers * d_mlp * 2 * k
    assert list(df.columns) == ["site", "layer", "neuron", "direction", "rank", "token_id", "token", "value"]
    for layer, logits in enumerate(_brute_value_logits(random_model, through_final_norm)):
        for direction, largest in (("top", True), ("bottom", False)):
            expected = logits.topk(k, dim=-1, largest=largest)
            rows = df[(df["layer"] == layer) & (df["direction"] == direction)]
            assert (rows["neuron"].to_numpy().reshape(d_mlp, k) == torch.arange(d_mlp)[:, None].numpy()).all()
            assert (rows["token_id"].to_numpy().reshape(d_mlp, k) == expected.indices.numpy()).all()
            torch.testing.assert_close(torch.tensor(rows["value"].to_numpy().reshape(d_mlp, k)),
                                       expected.values, atol=1e-4, rtol=1e-4)
    first = df.iloc[0]
    assert first["token"] == random_model.tokenizer.decode([int(first["token_id"])])


def test_value_top_tokens_on_every_loaded_family(tiny: Tiny):
    model = tiny.model
    for layer, logits in enumerate(_brute_value_logits(model, True)):
        # DeepSeek V2's first layer is dense, its second a mixture: one table covers one kind of MLP
        df = neurons.value_top_tokens(model, layers=layer if model.config.n_dense_layers else None, k=2)
        top = df[(df["layer"] == layer) & (df["direction"] == "top")]["token_id"].to_numpy()
        assert (top.reshape(-1, 2) == logits.topk(2, dim=-1).indices.numpy()).all()


def test_value_top_tokens_subset_on_smollm2(smollm2):
    df = neurons.value_top_tokens(smollm2, layers=[-1], neurons=[7, 3], k=3)
    unembed = smollm2.readout.unembedding()
    expected = (smollm2.blocks[29].mlp.W_out[[3, 7]].detach() @ unembed).topk(3, dim=-1)
    top = df[df["direction"] == "top"]
    assert top["layer"].unique().tolist() == [29] and top["neuron"].unique().tolist() == [3, 7]
    assert (top["token_id"].to_numpy().reshape(2, 3) == expected.indices.numpy()).all()
    assert top["token"].tolist()[:3] == [smollm2.tokenizer.decode([i]) for i in expected.indices[0].tolist()]
    assert df.attrs["provenance"]["analysis"] == "neurons.value_top_tokens"


def test_sub_updates_sum_to_the_mlp_output(random_model):
    post_norms = random_model.config.post_norms
    mlp = {"post", "out", "post_norm_scale"} if post_norms else {"post", "out"}
    run = random_model.run(PROMPTS, capture=resid.Capture(mlp=mlp))
    for layer in range(random_model.config.n_layers):
        record = run.stream.layers[layer].mlp
        for row, pos in ((0, -1), (1, 5)):
            # with a post-norm, its scale frozen: the sub-updates as written into the residual (no b_out there)
            scale = record.post_norm_scale[row, pos] if post_norms else None
            updates = neurons.sub_update_vectors(random_model, layer, record.post[row, pos], post_norm_scale=scale)
            b_out = random_model.blocks[layer].mlp.b_out
            total = updates.sum(0) + (0 if b_out is None else b_out.detach())
            torch.testing.assert_close(total, record.out[row, pos], atol=1e-5, rtol=1e-5)


def test_sub_updates_on_smollm2_are_exact_and_ranked(smollm2):
    prompt = "The Eiffel Tower is located in the city of"
    d_mlp = smollm2.config.d_mlp
    df = neurons.sub_updates(smollm2, prompt, layers=[20, -1], k=d_mlp)  # every neuron: shares must be 1
    run = smollm2.run(prompt, capture=resid.Capture(layers=[20, 29], mlp={"post", "out"}))
    for layer in (20, 29):
        record = run.stream.layers[layer].mlp
        updates = neurons.sub_update_vectors(smollm2, layer, record.post[0, -1])
        torch.testing.assert_close(updates.sum(0), record.out[0, -1], atol=1e-4, rtol=1e-5)  # no b_out
        rows = df[df["layer"] == layer]
        for ranking, column in (("magnitude", "magnitude"), ("target", "target_contribution")):
            part = rows[rows["ranking"] == ranking]
            assert len(part) == d_mlp and sorted(part["neuron"]) == list(range(d_mlp))
            assert part[column].is_monotonic_decreasing
            assert part["explained_norm"].iloc[0] == pytest.approx(1.0, abs=1e-4)
            assert part["explained_target"].iloc[0] == pytest.approx(1.0, abs=1e-3)
            assert part["target_contribution"].sum() == pytest.approx(part["layer_target"].iloc[0], rel=1e-4)
        magnitude = rows[rows["ranking"] == "magnitude"]
        torch.testing.assert_close(torch.tensor(magnitude["coefficient"].to_numpy()),
                                   record.post[0, -1, magnitude["neuron"].tolist()].double())
    assert (df["target"] == " Paris").all() and (df["pos"] == 9).all()  # default target: the top prediction


def test_coefficient_edits_match_brute_force(random_model):
    layer, neuron, value = 1, 5, 3.0
    clean = random_model.run(PROMPTS, capture=resid.Capture(mlp={"post", "out"}))
    last = clean.tokens.last_positions()
    rows = torch.arange(len(PROMPTS))
    edits = neurons.set_coefficients(random_model, PROMPTS, [(layer, neuron)], value, positions=[-1])
    edited = random_model.run(PROMPTS, interventions=edits, logits_at="last").logits[:, 0]
    # Brute force: the MLP's write recomputed by hand from the edited coefficients (through the post-norm, its
    # scale recomputed, where there is one) replaces the clean write.
    post = clean.stream.layers[layer].mlp.post.clone()
    post[rows, last, neuron] = value
    expected = random_model.run(PROMPTS, interventions=[resid.Replace(resid.Site(layer, "mlp"),
                                _write(random_model, layer, post))], logits_at="last").logits[:, 0]
    torch.testing.assert_close(edited, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(edited, clean.logits[rows, last], atol=1e-3)


def _write(model, layer: int, post: torch.Tensor) -> torch.Tensor:
    """The MLP's write for coefficients `post`, by hand: post @ W_out + b_out, then the post-norm if any."""
    mlp, norm = model.blocks[layer].mlp, model.blocks[layer].ln_mlp_post
    out = post @ mlp.W_out.detach() + (0 if mlp.b_out is None else mlp.b_out.detach())
    return out if norm is None else norm(out)[0]


def test_scaling_the_last_layer_matches_a_hand_computed_unembedding(random_model):
    layer, neuron, factor = random_model.config.n_layers - 1, 9, 4.0
    clean = random_model.run(PROMPTS[0], capture=resid.Capture(mlp={"post", "out"}))
    edits = neurons.scale_coefficients(random_model, PROMPTS[0], [(layer, neuron)], factor, positions=[-2])
    edited = random_model.run(PROMPTS[0], interventions=edits).logits[0, -2]
    record = clean.stream.layers[layer].mlp
    post = record.post.clone()
    post[0, -2, neuron] *= factor
    final = clean.stream.final()[0, -2] + (_write(random_model, layer, post) - record.out)[0, -2]
    normalized, _ = random_model.ln_final(final[None, None])
    torch.testing.assert_close(edited, random_model.unembed(normalized)[0, 0], atol=1e-5, rtol=1e-5)
    # Nothing else moves: the other positions keep their clean logits.
    torch.testing.assert_close(random_model.run(PROMPTS[0], interventions=edits).logits[0, :-2],
                               random_model.run(PROMPTS[0]).logits[0, :-2])


def test_prediction_change(random_model):
    same = neurons.prediction_change(random_model, PROMPTS, [], k=3)
    assert (same["prob_delta"] == 0).all() and (same["clean_rank"] == same["edited_rank"]).all()
    assert set(same["prompt_idx"]) == {0, 1} and (same.groupby("prompt_idx").size() == 3).all()
    edits = neurons.set_coefficients(random_model, PROMPTS, [(2, 1), (2, 2)], [40.0, -40.0], positions=[-1])
    df = neurons.prediction_change(random_model, PROMPTS, edits, k=3)
    logits = random_model.run(PROMPTS, interventions=edits, logits_at="last").logits[:, 0]
    probs = torch.softmax(logits, -1)
    for row in df.itertuples():
        assert row.edited_prob == pytest.approx(float(probs[row.prompt_idx, row.token_id]), rel=1e-4)
        assert row.edited_rank == int((logits[row.prompt_idx] > logits[row.prompt_idx, row.token_id]).sum()) + 1
    assert (df[df["edited_rank"] <= 3].groupby("prompt_idx").size() == 3).all()


def _plant(model, layer: int, neuron: int, trigger: int, value: int) -> None:
    """Key = the trigger's embedding direction, value = the value token's unembedding. The trigger's
    embedding is enlarged so that it dominates its residual, and the value token's unembedding so that it
    is unambiguous among 50k random ones in d_model = 32."""
    with torch.no_grad():
        model.embed.W_E[trigger] *= 5
        model.unembed.weight[value] *= 3
        key = model.embed.W_E[trigger] / model.embed.W_E[trigger].norm() * 30
        mlp = model.blocks[layer].mlp
        mlp.W_in[:, neuron] = key
        if mlp.W_gate is not None:
            mlp.W_gate[:, neuron] = key
        if mlp.b_in is not None:
            mlp.b_in[neuron] = 0
        mlp.W_out[neuron] = model.unembed.weight[value] / model.unembed.weight[value].norm() * 5


def test_a_planted_memory_is_found(random_model):
    model, layer, neuron = random_model, 0, 17
    trigger, value = model.tokenizer.encode(" cat")[0], model.tokenizer.encode(" dog")[0]
    _plant(model, layer, neuron, trigger, value)
    corpus = ["The weather was fine and the garden was green.", "My neighbour has a cat that sleeps all day.",
              "Numbers such as 12 and 40 appear here."]
    top = neurons.top_activating(model, corpus, layers=[layer], k=2)
    mine = top[top["neuron"] == neuron].iloc[0]
    assert mine["token_id"] == trigger and "⟦ cat⟧" in mine["context"] and mine["doc"] == 1
    best = top[top["rank"] == 1]
    assert best.loc[best["coefficient"].idxmax(), "neuron"] == neuron  # no other neuron fires as hard
    values = neurons.value_top_tokens(model, layers=[layer], neurons=[neuron], k=3)
    assert values[values["direction"] == "top"].iloc[0]["token_id"] == value
    df = neurons.sub_updates(model, "My neighbour has a cat", layers=[layer], k=3, target=" dog")
    for ranking in ("magnitude", "target"):
        assert df[df["ranking"] == ranking].iloc[0]["neuron"] == neuron
    assert df.iloc[0]["promotes"].startswith("' dog'")


def test_bad_input_is_explained(random_model):
    with pytest.raises(ResidError, match=r"Layers \[7\] are out of range: the model has 3 layers"):
        neurons.value_top_tokens(random_model, layers=[7])
    with pytest.raises(ResidError, match=r"Neurons \[64\] are out of range: the MLP has 64 neurons"):
        neurons.value_top_tokens(random_model, neurons=[0, 64])
    with pytest.raises(ResidError, match="k must be a positive integer, got 0"):
        neurons.value_top_tokens(random_model, k=0)
    with pytest.raises(ResidError, match="No layers given"):
        neurons.value_top_tokens(random_model, layers=[])
    with pytest.raises(ResidError, match=r"Position\(s\) \[9\] are out of range for prompt 0, which has 2 tokens"):
        neurons.sub_updates(random_model, "Hello there", position=9)
    with pytest.raises(ResidError, match="must be one token"):
        neurons.sub_updates(random_model, "Hello there", target=" Eiffel Tower")
    with pytest.raises(ResidError, match=r"Position\(s\) \[5\] are out of range for prompt 1, which has 2 tokens"):
        neurons.set_coefficients(random_model, PROMPTS, [(0, 1)], 1.0, positions=[5])
    with pytest.raises(ResidError, match=r"layers\[0\]\.mlp\.neuron\[99\]: neuron 99 is out of range"):
        neurons.scale_coefficients(random_model, PROMPTS, [(0, 99)], 0.0)
    with pytest.raises(ResidError, match=r"\(layer, neuron\) pairs"):
        neurons.scale_coefficients(random_model, PROMPTS, [(0, 1, 2)], 0.0)
    with pytest.raises(ResidError, match="Got 2 values for 1 neurons"):
        neurons.set_coefficients(random_model, PROMPTS, [(0, 1)], [1.0, 2.0])
