"""KV-cached generation for encoder-decoder models (EncoderDecoder.generate): each step's logits equal `run` on
the growing target, greedy tokens equal transformers' generate (Marian, T5 v1.0 and v1.1, umT5: the relative
position bias of cached steps), interventions act at every step, padded sources give the tokens of single
ones, sampling is seeded, and bad input says what to pass."""

import pytest
import torch
from t5_models import t5

import resid
from resid.errors import ResidError

NEW = 6
# float32 noise of the cached and the full pass, on logits of a few units (random weights at std 0.5 keep greedy
# choices apart)
CLOSE = dict(atol=5e-4, rtol=1e-4)


def _sources(pad: int) -> resid.Tokens:
    return resid.Tokens.pad([list(range(2, 14)), list(range(5, 10)), [7, 3, 9, 30, 2, 11, 4]], pad, "right")


@pytest.fixture(scope="module", params=["marian", "t5-1.0", "t5-1.1", "umt5"])
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "marian":
        from seq2seq_models import marian

        return marian(folder), resid.load(folder)
    version = request.param.removeprefix("t5-")
    # equal depths: transformers' T5 cache is sized by the encoder's depth
    return t5(folder, version, num_decoder_layers=2, std=0.5), resid.load(folder)


def _grown_logits(model, source, generation, interventions=()):
    """run's logits for every generated token, from the prompt and the tokens before it."""
    run = model.run(source, generation.tokens, interventions=interventions)
    start = generation.tokens.ids.shape[1] - NEW
    return run.logits[:, start - 1 : -1]


def test_each_steps_logits_equal_run_on_the_growing_target(pair):
    hf, model = pair
    source = _sources(hf.config.pad_token_id)
    generation = model.generate(source, NEW, return_logits=True)
    assert generation.new_ids.shape == (3, NEW)
    assert (generation.tokens.ids[:, 0] == model.decoder_start_token_id).all()
    torch.testing.assert_close(generation.logits, _grown_logits(model, source, generation), **CLOSE)


def test_greedy_tokens_equal_transformers_generate(pair):
    hf, model = pair
    source = _sources(hf.config.pad_token_id)
    expected = hf.generate(input_ids=source.ids, attention_mask=source.attention_mask.long(), max_new_tokens=NEW,
                           do_sample=False, num_beams=1, min_length=0, forced_eos_token_id=None,
                           bad_words_ids=None, eos_token_id=None)
    assert torch.equal(model.generate(source, NEW).new_ids, expected[:, 1:])


def test_interventions_act_at_every_step(pair):
    hf, model = pair
    source = _sources(hf.config.pad_token_id)
    decoder = [resid.ZeroAblate(resid.Site(1, "cross", head=1)), resid.ZeroAblate(resid.Site(0, "mlp"))]
    plain = model.generate(source, NEW, return_logits=True)
    generation = model.generate(source, NEW, interventions=decoder, return_logits=True)
    assert not torch.allclose(generation.logits, plain.logits)
    torch.testing.assert_close(generation.logits, _grown_logits(model, source, generation, decoder), **CLOSE)
    encoder = [resid.ZeroAblate(resid.Site(1, "attn"))]
    generation = model.generate(source, NEW, encoder_interventions=encoder, return_logits=True)
    run = model.run(source, generation.tokens, encoder_interventions=encoder)
    torch.testing.assert_close(generation.logits, run.logits[:, -NEW - 1 : -1], **CLOSE)


def test_a_padded_batch_generates_what_each_source_alone_does(pair):
    hf, model = pair
    source = _sources(hf.config.pad_token_id)
    together = model.generate(source, NEW).new_ids
    for i in range(3):
        alone = model.generate(source.rows([i]).trim(), NEW).new_ids
        assert torch.equal(alone[0], together[i])


def test_a_given_target_prefix_is_continued(pair):
    hf, model = pair
    source = _sources(hf.config.pad_token_id).rows([0]).trim()
    start = model.decoder_start_token_id
    prefix = torch.tensor([[start, 5, 7, 9]])
    generation = model.generate(source, NEW, target=prefix, return_logits=True)
    assert torch.equal(generation.tokens.ids[0, :4], prefix[0])
    torch.testing.assert_close(generation.logits, _grown_logits(model, source, generation), **CLOSE)


def test_sampling_is_seeded_and_draws_from_the_top_k(pair):
    hf, model = pair
    source = _sources(hf.config.pad_token_id)
    first = model.generate(source, NEW, do_sample=True, top_k=5, temperature=2.0, seed=3, return_logits=True)
    again = model.generate(source, NEW, do_sample=True, top_k=5, temperature=2.0, seed=3)
    assert torch.equal(first.new_ids, again.new_ids)
    top5 = first.logits.topk(5, dim=-1).indices
    assert (top5 == first.new_ids[..., None]).any(-1).all()
    torch.testing.assert_close(first.logits, _grown_logits(model, source, first), **CLOSE)


def test_the_original_transformer_generates_from_a_given_start(original):
    _, model = original
    source = torch.randint(1, 50, (2, 7), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ResidError, match="no decoder_start_token_id"):
        model.generate(source, NEW)
    prefix = torch.tensor([[1], [1]])
    generation = model.generate(source, NEW, target=prefix, return_logits=True)
    torch.testing.assert_close(generation.logits, _grown_logits(model, source, generation), **CLOSE)


def test_bad_input_says_what_to_pass(pair):
    hf, model = pair
    source = _sources(hf.config.pad_token_id)
    with pytest.raises(ResidError, match="3 encoded sources for 2 target prefixes"):
        model.generate(source, NEW, target=torch.tensor([[0, 4], [0, 5]]))
    with pytest.raises(ResidError, match="reads a source: generate with the resid.EncoderDecoder"):
        model.decoder.generate(torch.tensor([[0]]), NEW)
    with pytest.raises(ResidError, match="max_new_tokens must be a positive integer"):
        model.generate(source, 0)
