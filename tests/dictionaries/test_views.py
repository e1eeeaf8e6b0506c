"""A feature's decoder direction read through the unembedding and its encoder direction, on every tiny family:
the decoder logits are what the feature's attribution row is per unit of activation (and of the final norm's
scale); the encoder direction read on the residual gives the feature's pre-activation."""

import pytest
import torch
from numerics import TINY
from random_dictionaries import random_dictionary

import resid
from resid.analyses import attribution
from resid.analyses.features import views
from resid.dictionaries.hooks import read


@pytest.mark.parametrize("hook", ["hook_mlp_out", "attn.hook_z", "hook_resid_post"])
def test_decoder_logits_are_the_attribution_per_unit_of_activation(tiny, hook) -> None:
    model = tiny.model
    last = model.config.n_layers - 1
    d = random_dictionary(model, f"blocks.{last}.{hook}", seed=7, name="d")
    ids = torch.tensor([[3, 5, 7, 9, 11, 13]])
    df = attribution.direct(model, ids, dictionaries=[d])
    rows = df[df["feature"].notna()]
    assert len(rows)
    run = model.run(ids)
    scale = float(run.stream.final_norm_scale[0, -1])
    if hook == "attn.hook_z" and model.config.post_norms:  # the post-norm's scale, frozen from the run
        scale *= float(model.run(ids, capture=resid.Capture(attn={"post_norm_scale"})).stream.layers[last]
                       .attn.post_norm_scale[0, -1])
    logits = views.decoder_logits(model, d, rows["feature"].astype(int).tolist())
    expected = rows["activation"].to_numpy() * scale * logits[:, int(rows["target_id"].iloc[0])].numpy()
    torch.testing.assert_close(torch.tensor(rows["value"].to_numpy()), torch.tensor(expected, dtype=torch.float64),
                               **TINY)
    top = views.decoder_top_tokens(model, d, features=[0, 2], k=3)
    assert list(top.columns) == list(views.COLUMNS) and len(top) == 2 * 2 * 3
    first = top[(top["feature"] == 2) & (top["direction"] == "top")]
    assert first["token_id"].tolist() == views.decoder_logits(model, d, [2])[0].topk(3).indices.tolist()


@pytest.mark.parametrize("hook", ["hook_resid_pre", "ln2.hook_normalized", "mlp.hook_in"])
def test_the_encoder_direction_gives_the_pre_activation(tiny, hook) -> None:
    model = tiny.model
    if hook != "hook_resid_pre" and not model.config.pre_norms:
        pytest.skip("no pre-norm: the MLP reads the residual itself")
    d = random_dictionary(model, f"blocks.1.{hook}", seed=8, name="e")
    ids = torch.tensor([[3, 5, 7, 9, 11, 13]])
    run = model.run(ids, capture=resid.Capture.all())
    pre = d.pre_activations(read(run, model, d.point_in)) - d.b_enc
    directions = views.encoder_directions(model, d)
    if hook == "hook_resid_pre":
        torch.testing.assert_close(run.stream.resid_pre(1) @ directions.T, pre, **TINY)
        return
    norm = model.blocks[1].ln_mlp
    standardized = norm.standardized(run.stream.resid_mid(1) if model.config.block != "parallel"
                                     else run.stream.resid_pre(1), run.stream.layers[1].mlp.norm_scale)
    constant = 0 if d.point_in.standardized or norm.b is None else norm.b.float() @ d.W_enc
    torch.testing.assert_close(standardized @ directions.T + constant, pre, **TINY)
    assert len(views.encoder_top_tokens(model, d, features=1, k=4)) == 8
