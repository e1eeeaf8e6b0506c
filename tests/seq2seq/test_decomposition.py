"""The decoder's next-token prediction of encoder-decoder models, decomposed exactly: the decoder stream's
components (cross-attention writes included) sum to its final state, attribution sums to the logit with
cross-attention heads as rows, a cross head's row equals its write carried through the frozen norms by hand,
and the logit lens ends on the model's own prediction. Bad input says what to pass."""

import pytest
import torch
from random_models import make_random_model
from seq2seq_models import PAD

import resid
from resid.analyses import attribution, logit_lens
from resid.errors import ResidError

SOURCES = torch.randint(1, PAD, (3, 8), generator=torch.Generator().manual_seed(11))
TARGETS = torch.randint(1, PAD, (3, 5), generator=torch.Generator().manual_seed(12))


def _sums(df):
    by_prompt = df.groupby("prompt_idx")
    error = (by_prompt["value"].sum() - by_prompt["logit"].first()).abs()
    assert (error <= 1e-5 * (1 + by_prompt["logit"].first().abs())).all(), error


@pytest.mark.parametrize("which", ["original", "tiny_marian"])
def test_decoder_components_sum_to_the_final_state(which, request):
    fixture = request.getfixturevalue(which)
    model = fixture[1] if which == "original" else fixture.model
    source, target = SOURCES % model.config.d_vocab, TARGETS % model.config.d_vocab
    run = model.run(source, target)
    sites, pieces = run.stream.components()
    labels = [site.label for site in sites]
    final = run.stream.final()
    assert torch.linalg.vector_norm(pieces.sum(0) - final) <= 1e-5 * torch.linalg.vector_norm(final)
    assert "layers[0].cross" in labels and "layers[0].cross.resid_norm_bias" in labels
    assert run.stream.resid_cross(0) is not None


@pytest.mark.parametrize("level", ["sublayer", "head", "neuron"])
def test_attribution_to_the_next_token_sums_exactly(tiny_marian, level):
    df = attribution.direct(tiny_marian.model, TARGETS, source=SOURCES, level=level)
    _sums(df)
    if level != "sublayer":
        cross = df[df.site.str.contains(r"\.cross\.head")]
        assert len(cross) == 3 * 3 * 2  # prompts x decoder layers x cross heads
    logits = tiny_marian.model.run(SOURCES, TARGETS).logits[:, -1]
    first = df.groupby("prompt_idx")["logit"].first().to_numpy()
    torch.testing.assert_close(torch.tensor(first, dtype=torch.float32), logits.max(-1).values, atol=1e-5, rtol=0)


def test_cross_heads_sum_to_their_sublayer(tiny_marian):
    model = tiny_marian.model
    sub = attribution.direct(model, TARGETS, source=SOURCES, targets=3, level="sublayer")
    heads = attribution.direct(model, TARGETS, source=SOURCES, targets=3, level="head")
    sub = sub.set_index(["prompt_idx", "site"])["value"]
    for (prompt, layer), rows in heads[heads.part == "cross"].groupby(["prompt_idx", "layer"]):
        parts = rows[~rows.site.str.endswith("resid_norm_bias")]["value"].sum()
        assert parts == pytest.approx(sub[(prompt, f"layers[{layer}].cross")], abs=1e-5)


def test_a_cross_head_equals_its_write_through_the_frozen_norms_by_hand(tiny_marian):
    """layers[1].cross.head[1]: z[1] @ W_O[1] at the last position, then LN_cross(1), LN_mlp(1) and the
    last layer's three norms with their scales frozen (g * (x - mean x) * s), read by W_U[target]."""
    model = tiny_marian.model
    df = attribution.direct(model, TARGETS[:1], source=SOURCES[:1], targets=7, level="head").set_index("site")
    run = model.run(SOURCES[:1], TARGETS[:1], capture=resid.Capture.all())
    decoder, layers = model.decoder, run.stream.layers
    x = (layers[1].cross.z[0, -1, 1].double() @ decoder.blocks[1].cross.W_O[1].double())
    chain = [(decoder.blocks[1].ln_cross_resid, layers[1].cross), (decoder.blocks[1].ln_mlp_resid, layers[1].mlp)]
    for part in ("attn", "cross", "mlp"):
        chain.append((getattr(decoder.blocks[2], f"ln_{part}_resid"), getattr(layers[2], part)))
    for norm, record in chain:
        x = norm.w.double() * (x - x.mean()) * record.resid_norm_scale[0, -1, 0].double()
    by_hand = x @ decoder.unembed.W_U[:, 7].double()
    assert df.loc["layers[1].cross.head[1]", "value"] == pytest.approx(by_hand.item(), abs=1e-5)


def test_logit_lens_ends_on_the_model_prediction(tiny_marian):
    lens = logit_lens.run(tiny_marian.model, TARGETS, source=SOURCES, every="sublayer", k=1)
    assert "layers[0].resid_cross" in set(lens["site"])
    last = lens[lens.site == "layers[2].resid_post"]
    logits = tiny_marian.model.run(SOURCES, TARGETS).logits[:, -1]
    assert last["token_id"].tolist() == logits.argmax(-1).tolist()
    assert last["kl_to_final"].abs().max() < 1e-5


def test_bad_input_says_what_to_pass(tiny_marian, gpt2_tokenizer):
    decoder_only = make_random_model("gpt2_like", gpt2_tokenizer)
    model = tiny_marian.model
    with pytest.raises(ResidError, match="encoder-decoder model: pass source="):
        attribution.direct(model, TARGETS)
    with pytest.raises(ResidError, match="2 sources for 3 prompts"):
        attribution.direct(model, TARGETS, source=SOURCES[:2])
    with pytest.raises(ResidError, match="cross-attention needs the source"):
        model.decoder.run(TARGETS)
    with pytest.raises(ResidError, match="an encoder-decoder run pairs each target prefix with one source"):
        model.run(SOURCES[:2], TARGETS)
    with pytest.raises(ResidError, match="source= is for encoder-decoder models"):
        attribution.direct(decoder_only, "hello", source="world")
    with pytest.raises(ResidError, match="no cross-attention"):
        decoder_only.run("hello", interventions=[resid.ZeroAblate(resid.Site(0, "cross"))])
