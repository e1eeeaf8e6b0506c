"""The tuned lens read through logit_lens.run: with zero translators it is the logit lens exactly (every random
architecture, both norms, both `every`); with the final norm frozen its logit is an exact sum of the writes read
through the pulled-back direction plus the translator's bias; intermediate sites equal the translator applied by
hand; a lens of another model or without translators at the sites asked for fails before any forward pass."""

import math

import pytest
import torch
from random_models import make_random_model

import resid
from resid.analyses import logit_lens, tuned_lens
from resid.analyses.lenses import LogitLens, Translators, TunedLens
from resid.sites import Site

PROMPTS = ["The quick brown fox jumps over the lazy", "A short one"]


def random_lens(model: resid.Transformer, every: str = "layer", seed: int = 0, scale: float = 0.1) -> TunedLens:
    sites = logit_lens.site_list(model, every)[:-1]
    d = model.config.d_model
    generator = torch.Generator().manual_seed(seed)
    weight = scale * torch.randn(len(sites), d, d, generator=generator)
    return TunedLens(model, Translators(tuple(sites), weight, scale * torch.randn(len(sites), d, generator=generator),
                                        every))


@pytest.mark.parametrize("every, norm", [("sublayer", "recompute"), ("layer", "frozen")])
def test_zero_translators_are_the_logit_lens_exactly(random_model, every, norm):
    frozen = norm == "frozen"
    plain = logit_lens.run(random_model, PROMPTS, positions="all", every=every, k=3,
                           lens=LogitLens(random_model, frozen_norm=frozen))
    tuned = logit_lens.run(random_model, PROMPTS, positions="all", every=every, k=3,
                           lens=tuned_lens.zeros(random_model, every).with_frozen_norm(frozen))
    assert set(plain["norm"]) == set(tuned["norm"]) == {norm}
    assert set(plain["lens"]) == {"logit"} and set(tuned["lens"]) == {"tuned"}
    columns = [c for c in plain.columns if c != "lens"]
    assert plain[columns].equals(tuned[columns])  # h + h @ 0 + 0 == h: not close, equal


@torch.no_grad()
def test_an_intermediate_site_is_the_translator_applied_by_hand(random_model):
    lens = random_lens(random_model)
    layer, text = 1, PROMPTS[0]
    df = logit_lens.run(random_model, text, positions=[3], every="layer", k=4, lens=lens)
    rows = df[df.site == f"layers[{layer}].resid_post"]
    h = random_model.run(text).stream.resid_post(layer)[0, 3]
    i = lens.translators.sites.index(Site(layer, "resid_post"))
    translated = h + lens.translators.weight[i] @ h + lens.translators.bias[i]  # T(h) = h + A h + b
    logp = torch.log_softmax(random_model.readout.logits(translated).double(), -1)
    top = logp.topk(4)
    assert list(rows["token_id"]) == top.indices.tolist()
    torch.testing.assert_close(torch.tensor(rows["prob"].values), top.values.exp(), atol=1e-6, rtol=1e-5)
    final = df[df.site == f"layers[{random_model.config.n_layers - 1}].resid_post"]
    assert (final["kl_to_final"].abs() < 1e-5).all()  # no translator at the final residual: the model itself


@torch.no_grad()
def test_frozen_tuned_lens_is_a_sum_of_writes_through_the_pulled_back_direction(random_model):
    """logit = T(h) . v + c = sum over writes before the site of write . (v + v @ A), plus b . v, plus c."""
    lens, text, target = random_lens(random_model, seed=1), PROMPTS[0], " the"
    df = logit_lens.run(random_model, text, targets=target, every="layer", lens=lens.with_frozen_norm(True))
    run = random_model.run(text, capture=resid.Capture.all())
    direction = random_model.readout.logit_direction([int(df["target_id"].iloc[0])], run.stream.final_norm_scale[:, -1])
    sites, writes = run.stream.components()
    for layer in range(random_model.config.n_layers - 1):
        pulled, carried = lens.direction(direction, Site(layer, "resid_post"))
        before = [i for i, site in enumerate(sites) if site.layer is None or site.layer <= layer]
        value = sum(pulled.project(writes[i][:, -1]) for i in before) + pulled.bias + carried
        got = df[(df.site == f"layers[{layer}].resid_post") & (df["rank"] == 1)]["target_logit"].item()
        cap = random_model.config.final_softcap
        expected = value.item() if cap is None else cap * math.tanh(value.item() / cap)  # the lens applies the cap
        assert got == pytest.approx(expected, abs=1e-4)


def test_a_layer_lens_read_at_sublayers_says_which_every(random_model):
    if random_model.config.block == "parallel":
        pytest.skip("parallel blocks have no resid_mid: both `every` read the same sites")
    with pytest.raises(resid.ResidError, match=r"no translator for layers\[0\].resid_mid.*every='layer'"):
        logit_lens.run(random_model, PROMPTS[0], every="sublayer", lens=tuned_lens.zeros(random_model))


def test_a_lens_of_another_model_is_refused(gpt2_tokenizer):
    model, other = (make_random_model("llama_gqa", gpt2_tokenizer, seed=s) for s in (0, 1))
    with pytest.raises(resid.ResidError, match="made for the model"):
        logit_lens.run(model, PROMPTS[0], every="layer", lens=tuned_lens.zeros(other))


def test_translators_for_another_architecture_are_refused(gpt2_tokenizer):
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    wide = Translators.zeros([Site(0, "resid_pre")], model.config.d_model + 1)
    with pytest.raises(resid.ResidError, match="33 wide but .* d_model=32"):
        TunedLens(model, wide)
    deep = Translators.zeros([Site(0, "resid_pre"), Site(5, "resid_post")], model.config.d_model)
    with pytest.raises(resid.ResidError, match=r"sites \['layers\[5\].resid_post'\]"):
        TunedLens(model, deep)
    final = Translators.zeros([Site(model.config.n_layers - 1, "resid_post")], model.config.d_model)
    with pytest.raises(resid.ResidError, match="before its final residual"):
        TunedLens(model, final)
