"""Generation with a KV cache equals re-running the growing sequence, step by step, with and without
interventions, alone or in a left-padded batch; sampling is reproducible and draws from the stated distribution."""

import dataclasses

import pytest
import torch
from random_models import make_random_model

import resid
from resid import Add, Scale, Site, ZeroAblate
from resid.generate import sample_probs

PROMPTS = ["The Eiffel Tower is located in the city of", "Hi"]
N_NEW = 6


def _check_steps(model, gen, prompt, interventions=(), atol=1e-4):
    """Each step's logits equal model.run on the prompt plus the tokens so far, at the last position."""
    n_prompt = model.as_tokens(prompt).ids.shape[1]
    tokens = gen.tokens
    for step in range(gen.new_ids.shape[1]):
        end = n_prompt + step
        grown = resid.Tokens(tokens.ids[:, :end], tokens.attention_mask[:, :end], tokens.position_ids[:, :end])
        expected = model.run(grown, interventions=interventions, logits_at="last").logits[:, 0]
        torch.testing.assert_close(gen.logits[:, step], expected, atol=atol, rtol=0)
        assert torch.equal(gen.new_ids[:, step], expected.argmax(dim=-1))


@pytest.mark.parametrize("prompt", [PROMPTS[0], PROMPTS])
def test_greedy_steps_equal_run_on_growing_sequence(random_model, prompt):
    gen = random_model.generate(prompt, N_NEW, return_logits=True)
    assert gen.new_ids.shape == (len(gen.tokens.ids), N_NEW)
    assert gen.logits.shape == (*gen.new_ids.shape, random_model.config.d_vocab)
    _check_steps(random_model, gen, prompt)


def test_interventions_apply_at_every_step(random_model):
    cfg = random_model.config
    vector = torch.randn(cfg.d_model, generator=torch.Generator().manual_seed(1))
    interventions = [
        Add(Site(1, "attn"), vector),
        ZeroAblate(Site(0, "attn", head=2)),
        Scale(Site(2, "mlp", neuron=3), 3.0),
        Scale(Site(0, "mlp"), 0.5),
        Add(Site(1, "mlp", positions=(0,)), 2 * vector),  # the prompts' first token only
    ]
    gen = random_model.generate(PROMPTS, N_NEW, interventions=interventions, return_logits=True)
    _check_steps(random_model, gen, PROMPTS, interventions)
    clean = random_model.generate(PROMPTS, N_NEW, return_logits=True)
    assert not torch.allclose(gen.logits, clean.logits)


def test_explicit_positions_edit_the_prompt_only(random_model):
    """Site positions are prompt-relative: -1 is the prompt's last token at every step, never a new token."""
    site = Site(2, "mlp", positions=(-1,))
    gen = random_model.generate(PROMPTS[0], 3, interventions=[ZeroAblate(site)], return_logits=True)
    n_prompt = random_model.as_tokens(PROMPTS[0]).ids.shape[1]
    _check_steps(random_model, gen, PROMPTS[0], [ZeroAblate(Site(2, "mlp", positions=(n_prompt - 1,)))])


def test_left_padded_batch_gives_each_prompts_tokens(random_model):
    batch = random_model.generate(PROMPTS, N_NEW)
    for row, prompt in enumerate(PROMPTS):
        alone = random_model.generate(prompt, N_NEW)
        assert torch.equal(batch.new_ids[row], alone.new_ids[0])
        assert batch.texts[row] == alone.texts[0]
    steered = [Add(Site(1, "attn"), torch.ones(random_model.config.d_model))]
    batch = random_model.generate(PROMPTS, N_NEW, interventions=steered)
    for row, prompt in enumerate(PROMPTS):
        assert torch.equal(batch.new_ids[row], random_model.generate(prompt, N_NEW, interventions=steered).new_ids[0])


def test_generated_tokens_run_like_the_steps(random_model):
    """gen.tokens is a valid batch: model.run on it reproduces every step's logits."""
    gen = random_model.generate(PROMPTS, N_NEW, return_logits=True)
    logits = random_model.run(gen.tokens).logits[:, -N_NEW - 1 : -1]
    torch.testing.assert_close(logits, gen.logits, atol=1e-4, rtol=0)


def test_inputs_as_ids_and_models_without_tokenizer():
    model = make_random_model("gpt2_like")  # no tokenizer, learned positions
    ids = torch.tensor([[5, 7, 11, 2, 3], [1, 2, 3, 4, 5]])
    gen = model.generate(ids, N_NEW, return_logits=True)
    assert gen.texts is None
    _check_steps(model, gen, ids)
    assert torch.equal(model.generate(ids[0], N_NEW).new_ids[0], gen.new_ids[0])


@pytest.mark.parametrize("kind", ["llama_gqa", "gemma_like"])
def test_sliding_window_with_cache(gpt2_tokenizer, kind):
    base = make_random_model(kind, gpt2_tokenizer)
    model = resid.Transformer(dataclasses.replace(base.config, sliding_window=4), gpt2_tokenizer).eval()
    model.load_state_dict(base.state_dict())
    gen = model.generate(PROMPTS, 8, return_logits=True)
    _check_steps(model, gen, PROMPTS)
    assert not torch.allclose(gen.logits, base.generate(PROMPTS, 8, return_logits=True).logits)


def test_stop_at_eos_pads_the_row_with_eos(gpt2_tokenizer):
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    greedy = model.generate(PROMPTS, N_NEW)
    eos = int(greedy.new_ids[0, 2])  # make row 0's third token the eos
    assert eos not in greedy.new_ids[1].tolist() + greedy.new_ids[0, :2].tolist()
    model.tokenizer = resid.Tokenizer(gpt2_tokenizer.tokenizer, 50256, False, eos_token_id=eos)
    gen = model.generate(PROMPTS, N_NEW, stop_at_eos=True)
    assert gen.new_ids[0, :2].tolist() == greedy.new_ids[0, :2].tolist()
    assert (gen.new_ids[0, 2:] == eos).all()
    assert torch.equal(gen.new_ids[1], greedy.new_ids[1])
    assert gen.texts[0] == model.tokenizer.decode(greedy.new_ids[0, :2])
    n_prompt = gen.tokens.ids.shape[1] - N_NEW
    assert gen.tokens.attention_mask[0, n_prompt:].tolist() == [True] * 3 + [False] * (N_NEW - 3)
    # Every row stopped: generation ends early.
    first = int(greedy.new_ids[0, 0])
    model.tokenizer = resid.Tokenizer(gpt2_tokenizer.tokenizer, 50256, False, eos_token_id=first)
    assert model.generate(PROMPTS[0], N_NEW, stop_at_eos=True).new_ids.tolist() == [[first]]


def test_sampling_is_reproducible_and_not_greedy(gpt2_tokenizer):
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    options = dict(do_sample=True, temperature=100.0, seed=0)
    one, two = model.generate(PROMPTS, 16, **options), model.generate(PROMPTS, 16, **options)
    assert torch.equal(one.new_ids, two.new_ids)
    generator = torch.Generator().manual_seed(0)
    again = model.generate(PROMPTS, 16, do_sample=True, temperature=100.0, seed=generator)
    assert torch.equal(again.new_ids, one.new_ids)
    greedy = model.generate(PROMPTS, 16)
    assert not torch.equal(one.new_ids, greedy.new_ids)
    # top_k=1 leaves one token to draw: sampling is greedy, whatever the temperature.
    top1 = model.generate(PROMPTS, 16, do_sample=True, temperature=100.0, top_k=1, seed=3)
    assert torch.equal(top1.new_ids, greedy.new_ids)


def test_sampling_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 5.0, 0.0]])
    probs = sample_probs(logits, 2.0, None)
    torch.testing.assert_close(probs, torch.softmax(logits / 2.0, dim=-1))
    top2 = sample_probs(logits, 1.0, 2)
    assert (top2[0, 2:] == 0).all()
    torch.testing.assert_close(top2[0, :2], torch.softmax(logits[0, :2], dim=-1))
    assert (top2[1] > 0).all()  # ties at the k-th value are kept
    # High temperature flattens the distribution towards uniform: far from greedy's one-hot.
    flat = sample_probs(logits, 1e4, None)
    torch.testing.assert_close(flat, torch.full_like(flat, 0.25), atol=1e-3, rtol=0)
    draws = torch.multinomial(probs[0], 20000, replacement=True, generator=torch.Generator().manual_seed(0))
    frequencies = torch.bincount(draws, minlength=4).float() / 20000
    torch.testing.assert_close(frequencies, probs[0], atol=0.02, rtol=0)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(max_new_tokens=0), "max_new_tokens must be a positive integer"),
        (dict(max_new_tokens=60), "exceeds random-llama_gqa's context of 64: ask for at most"),
        (dict(max_new_tokens=2, do_sample=True, temperature=0.0), "temperature must be > 0"),
        (dict(max_new_tokens=2, do_sample=True, top_k=0), "top_k must be a positive integer"),
    ],
)
def test_bad_input(gpt2_tokenizer, options, message):
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    with pytest.raises(resid.ResidError, match=message):
        model.generate(PROMPTS, **options)


def test_bad_input_padding_and_eos(gpt2_tokenizer):
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    with pytest.raises(resid.ResidError, match="needs left-padded prompts"):
        model.generate(model.to_tokens(PROMPTS, padding_side="right"), 2)
    with pytest.raises(resid.ResidError, match="has no tokenizer with an eos token"):
        make_random_model("llama_gqa").generate(torch.tensor([1, 2, 3]), 2, stop_at_eos=True)
    with pytest.raises(resid.ResidError, match="does not broadcast"):  # a per-position value cannot follow new tokens
        model.generate(PROMPTS, 2, interventions=[resid.Replace(Site(0, "attn"), torch.zeros(2, 11, 32))])


def test_sampling_on_a_gpu_takes_an_int_seed_or_a_generator_of_its_device(gpt2_tokenizer, gpu):
    model = make_random_model("llama_gqa", gpt2_tokenizer).to(gpu)
    options = dict(do_sample=True, temperature=100.0)
    one = model.generate(PROMPTS, 8, seed=0, **options)
    again = model.generate(PROMPTS, 8, seed=torch.Generator(device=gpu).manual_seed(0), **options)
    assert torch.equal(one.new_ids, again.new_ids)
    if gpu.type != "cpu":
        with pytest.raises(resid.ResidError, match="pass torch.Generator\\(device=model.device\\) or an int seed"):
            model.generate(PROMPTS, 8, seed=torch.Generator().manual_seed(0), **options)


def test_a_sublayer_replaced_whole_at_every_step(random_model):
    """An attention zeroed whole is not computed (nor its keys and values cached) at any step: the steps still equal
    runs of the growing sequence."""
    interventions = [ZeroAblate(Site(1, "attn")), ZeroAblate(Site(0, "mlp"))]
    gen = random_model.generate(PROMPTS, N_NEW, interventions=interventions, return_logits=True)
    _check_steps(random_model, gen, PROMPTS, interventions)
