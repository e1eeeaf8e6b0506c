"""The decoder's logit split into decoder-side and source-side components (resid.analyses.source_side): for T5
(pre-norm, an encoder final norm), Marian and the original Transformer (post-LN encoders), every prompt's rows
sum to its logit, each cross head's source rows sum to its row in attribution.direct, and one (cross head,
encoder component) row equals the product computed by hand from the run's tensors."""

import pytest
import torch
from random_models import make_random_model
from t5_models import t5

import resid
from resid.analyses import attribution, source_side
from resid.errors import ResidError

SOURCES = resid.Tokens.pad([list(range(2, 14)), list(range(5, 10)), [7, 3, 9, 30, 2, 11, 4]], 0, "right")
TARGETS = torch.randint(2, 50, (3, 5), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def t5_v10(tmp_path_factory):
    folder = tmp_path_factory.mktemp("t5-source-side")
    t5(folder, "1.0")
    return resid.load(folder)


@pytest.fixture(params=["t5", "marian", "original"])
def model(request, t5_v10):
    if request.param == "t5":
        return t5_v10
    if request.param == "marian":
        return request.getfixturevalue("tiny_marian").model
    return request.getfixturevalue("original")[1]


@pytest.mark.parametrize("level", ["sublayer", "head"])
def test_rows_sum_to_the_logit_and_heads_to_their_direct_rows(model, level):
    source = SOURCES
    df = source_side.direct(model, TARGETS, source=source, level=level, targets=4)
    by_prompt = df.groupby("prompt_idx")
    error = (by_prompt["value"].sum() - by_prompt["logit"].first()).abs()
    assert (error <= 1e-5 * (1 + by_prompt["logit"].first().abs())).all(), error
    split = df[df.source.notna()]
    n_cross = model.decoder.config.n_layers * model.decoder.config.n_heads
    assert split.groupby("prompt_idx").site.nunique().eq(n_cross).all()
    assert {"encoder.embed", "encoder.layers[0].attn", "encoder.layers[1].mlp"} <= set(split.source)
    assert not df[df.source.isna()].site.str.contains(r"\.cross\.head").any()  # every cross head was split
    direct = attribution.direct(model, TARGETS, source=source, level="head", targets=4).set_index(
        ["prompt_idx", "site"])["value"]
    heads = split.groupby(["prompt_idx", "site"])["value"].sum()
    assert (heads - direct.loc[heads.index]).abs().max() < 1e-5


def test_a_row_equals_its_product_by_hand(t5_v10):
    """Cross head 2 of decoder layer 1 reading encoder layer 0's MLP write, for prompt 1 (a padded source): the
    write through the encoder's final norm (scale frozen), W_V[2], the run's pattern, W_O[2], then the decoder's
    final norm (scale frozen; v1.0's d_model^-0.5 in its gain) and W_U[:, 4]."""
    model = t5_v10
    df = source_side.direct(model, TARGETS, source=SOURCES, targets=4)
    row = df[(df.prompt_idx == 1) & (df.site == "layers[1].cross.head[2]") & (df.source == "encoder.layers[0].mlp")]
    encoded = model.encode(SOURCES, capture=resid.Capture())
    run = model.run(SOURCES, TARGETS, capture=resid.Capture(cross={"pattern"}))
    enc, dec = model.encoder, model.decoder
    write = encoded.stream.layers[0].mlp.out[1].double()  # [src d_model]
    memory = write * encoded.stream.final_norm_scale[1].double() * enc.ln_final.gain.double()
    value = memory @ dec.blocks[1].cross.W_V[2].double()  # [src d_head]
    z = run.stream.layers[1].cross.pattern[1, 2, -1].double() @ value
    out = z @ dec.blocks[1].cross.W_O[2].double()
    logit = (out * run.stream.final_norm_scale[1, -1].double() * dec.ln_final.gain.double()) @ dec.unembed.W_U[:, 4]\
        .double()
    assert row["value"].item() == pytest.approx(logit.item(), abs=1e-6)


def test_bad_input_says_what_to_pass(t5_v10, gpt2_tokenizer):
    with pytest.raises(ResidError, match="has none: use attribution.direct"):
        source_side.direct(make_random_model("gpt2_like", gpt2_tokenizer), "hello", source="world")
    with pytest.raises(ResidError, match="2 sources for 3 prompts"):
        source_side.direct(t5_v10, TARGETS, source=SOURCES.ids[:2])
    with pytest.raises(ResidError, match=r"level must be one of \('sublayer', 'head'\), got 'neuron'"):
        source_side.direct(t5_v10, TARGETS, source=SOURCES, level="neuron")
