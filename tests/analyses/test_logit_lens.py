"""Logit lens: the last site equals the model's own distribution (both norms, every family), intermediate
sites equal a brute-force decode of the stream, the frozen lens is the running sum of direct attributions,
padding invariance, and bad input."""

import math

import pytest
import torch
from bad_option import BAD_OPTION
from tiny_fixtures import Tiny

import resid
from resid.analyses import attribution, logit_lens
from resid.analyses.lenses import LogitLens

# Probabilities here run from 1e-4 to 1: an absolute tolerance would pass a small one that is off by 10x. A
# probability's relative error is the absolute error of its log-probability, which float32 reduction noise in the
# logits keeps near 1e-6 (measured up to 1.7e-6 on the tiny models): TINY's rtol, no absolute part.
PROB = dict(rtol=1e-4, atol=0.0)

PROMPTS = ["The quick brown fox jumps over the lazy", "A short one", "Residual streams are sums of writes into"]


def _top1(df):
    return df[df["rank"] == 1]


@pytest.mark.parametrize("norm", ["recompute", "frozen"])
def test_last_site_is_the_models_distribution(tiny: Tiny, norm):
    model = tiny.model
    df = logit_lens.run(model, PROMPTS, positions="all", k=3, lens=LogitLens(model, frozen_norm=norm == "frozen"))
    last = df[df.site == f"layers[{model.config.n_layers - 1}].resid_post"]
    for (prompt, pos), rows in last.groupby(["prompt_idx", "pos"]):
        probs = torch.softmax(model.run(PROMPTS[prompt]).logits[0, pos].double(), -1)
        top = probs.topk(3)
        assert list(rows["token_id"]) == top.indices.tolist()
        torch.testing.assert_close(torch.tensor(rows["prob"].values), top.values, **PROB)
        assert rows["kl_to_final"].abs().max() < 1e-5 and (rows["target_rank"] == 1).all()
    assert set(df["norm"]) == {norm}


def test_sites_follow_the_stream(random_model):
    n = random_model.config.n_layers
    df = _top1(logit_lens.run(random_model, PROMPTS[0], every="sublayer"))
    parallel = random_model.config.block == "parallel"
    per_layer = ("resid_post",) if parallel else ("resid_mid", "resid_post")
    expected = [(0, "layers[0].resid_pre")] + [(layer, f"layers[{layer}].{site}")
                                               for layer in range(n) for site in per_layer]
    assert list(zip(df["layer"], df["site"])) == expected
    layers = _top1(logit_lens.run(random_model, PROMPTS[0], every="layer"))
    by_layer = [(0, "layers[0].resid_pre")] + [(layer, f"layers[{layer}].resid_post") for layer in range(n)]
    assert list(zip(layers["layer"], layers["site"])) == by_layer


@torch.no_grad()
def test_recompute_equals_decoding_the_stream(random_model):
    text, layer = PROMPTS[0], 1
    df = logit_lens.run(random_model, text, positions=[2], k=4)
    rows = df[df.site == f"layers[{layer}].resid_post"]
    resid_post = random_model.run(text, capture=resid.Capture.all()).stream.resid_post(layer)[0, 2]
    normalized, _ = random_model.ln_final(resid_post[None, None])
    logp = torch.log_softmax(random_model.unembed(normalized)[0, 0].double(), -1)
    top = logp.topk(4)
    assert list(rows["token_id"]) == top.indices.tolist()
    torch.testing.assert_close(torch.tensor(rows["prob"].values), top.values.exp(), **PROB)
    entropy = -(logp.exp() * logp).sum().item()
    assert rows["entropy"].iloc[0] == pytest.approx(entropy, rel=1e-5)


def test_frozen_lens_is_the_running_sum_of_direct_attributions(random_model):
    """With the final scale frozen, the lens's target logit at resid_post(l) is the embedding, every write
    up to layer l and the bias term: the partial sums of attribution.direct."""
    text = PROMPTS[2]
    lens = _top1(logit_lens.run(random_model, text, targets=" the", lens=LogitLens(random_model, frozen_norm=True)))
    attr = attribution.direct(random_model, text, " the", level="sublayer")
    bias = attr.loc[attr.site == "final_bias", "value"].item()
    embeds = attr.loc[attr.part.isin(["embed", "pos_embed", "type_embed"]), "value"].sum()
    for layer in range(random_model.config.n_layers):
        upto = attr.loc[attr.layer.notna() & (attr.layer <= layer), "value"].sum()
        got = lens[lens.site == f"layers[{layer}].resid_post"]["target_logit"].item()
        expected = embeds + upto + bias
        cap = random_model.config.final_softcap
        if cap is not None:  # the lens applies the model's final soft cap; attribution decomposes before it
            expected = cap * math.tanh(expected / cap)
        assert got == pytest.approx(expected, abs=1e-4)


def test_smollm2_forms_paris_late(smollm2):
    df = _top1(logit_lens.run(smollm2, "The Eiffel Tower is located in the city of", targets=" Paris"))
    final = df.iloc[-1]
    assert final["token"] == " Paris" and final["prob"] == pytest.approx(0.70, abs=0.01)
    assert df.iloc[0]["target_rank"] > 100  # the embeddings alone do not predict it


def test_a_prompt_in_a_padded_batch_equals_the_prompt_alone(random_model):
    batch = logit_lens.run(random_model, PROMPTS, positions=[0, -1], k=2)
    for i, text in enumerate(PROMPTS):
        alone = logit_lens.run(random_model, text, positions=[0, -1], k=2)
        mine = batch[batch.prompt_idx == i].reset_index(drop=True)
        assert list(mine["token_id"]) == list(alone["token_id"])
        assert list(mine["pos"]) == list(alone["pos"])
        for col in ("prob", "target_logit", "kl_to_final"):
            torch.testing.assert_close(torch.tensor(mine[col].values), torch.tensor(alone[col].values),
                                       atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(targets=" Parisian"), "is 2 tokens"),
        (dict(positions=[0, 40]), r"Position\(s\) \[40\] are out of range"),
        (dict(positions=[]), "positions is empty"),
        (dict(k=0), "k must be a positive integer"),
    ],
)
def test_bad_input_is_one_clear_error(smollm2, kwargs, message):
    with pytest.raises(resid.ResidError, match=message):
        logit_lens.run(smollm2, "The Eiffel Tower is located in the city of", **kwargs)


@pytest.mark.parametrize("kwargs, option", [(dict(lens="tuned"), "lens"), (dict(every="head"), "every")])
def test_bad_option_names_it(smollm2, kwargs, option):
    with pytest.raises(BAD_OPTION, match=option):
        logit_lens.run(smollm2, "The Eiffel Tower is located in the city of", **kwargs)
