"""Training a tuned lens: one step's loss and gradients equal autograd through a hand-written KL; one optimizer
step equals SGD with Nesterov momentum, weight decay and clipping written out; a translator planted in a tiny model
is recovered; a run killed after a step and resumed from its checkpoint equals the run never stopped; the data
split, packing and order are deterministic."""

import pytest
import torch
from random_models import RANDOM_CONFIGS, make_random_model, randomize

import resid
from resid.analyses import logit_lens, tuned_lens
from resid.analyses.distributed.execution import Execution
from resid.analyses.lenses import Translators, data, training

QUIET = Execution(progress=False)


def random_translators(model: resid.Transformer, seed: int = 1, scale: float = 0.1) -> Translators:
    sites = tuple(logit_lens.site_list(model, "layer")[:-1])
    generator = torch.Generator().manual_seed(seed)
    d = model.config.d_model
    return Translators(sites, scale * torch.randn(len(sites), d, d, generator=generator),
                       scale * torch.randn(len(sites), d, generator=generator))


def ids(model: resid.Transformer, n: int, seq: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, model.config.d_vocab, (n, seq), generator=torch.Generator().manual_seed(seed))


def hand_loss_and_gradients(model, translators, windows):
    """KL(final || lens) per site, mean over tokens, through log_softmax in float64, and its autograd gradients."""
    run = model.run(windows)
    logp = torch.log_softmax(run.logits.double(), -1)
    inputs = [resid_ for _, resid_ in run.stream.running("layer")][:-1]
    losses, grads = [], []
    for i, h in enumerate(inputs):
        weight = translators.weight[i].clone().requires_grad_()
        bias = translators.bias[i].clone().requires_grad_()
        logq = torch.log_softmax(model.readout.logits(h + h @ weight.T + bias).double(), -1)
        loss = (logp.exp() * (logp - logq)).sum(-1).mean()
        losses.append(loss.item())
        grads.append(torch.autograd.grad(loss, [weight, bias]))
    return torch.tensor(losses, dtype=torch.float64), grads


@pytest.mark.parametrize("kind", sorted(RANDOM_CONFIGS))
def test_loss_and_gradients_equal_a_hand_written_kl(kind):
    model = make_random_model(kind)
    translators, windows = random_translators(model), ids(model, 3, 6)
    losses, gradients = tuned_lens.loss_and_gradients(model, translators, windows, batch_size=2)
    expected, grads = hand_loss_and_gradients(model, translators, windows)
    torch.testing.assert_close(losses.double(), expected, rtol=1e-5, atol=1e-6)
    for i, (weight, bias) in enumerate(grads):
        torch.testing.assert_close(gradients.weight[i], weight, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(gradients.bias[i], bias, rtol=1e-4, atol=1e-6)


def test_one_step_is_nesterov_sgd_with_decay_and_clipping_by_hand():
    model = make_random_model("gpt2_like")
    start, windows = random_translators(model, scale=0.3), ids(model, 2, 8)
    recipe = tuned_lens.Recipe(steps=1, tokens_per_step=16, seq_len=8, precision="float32", weight_decay=0.05,
                               clip=0.5)
    trained = tuned_lens.train(model, windows, recipe, QUIET, start=start).translators
    _, grads = hand_loss_and_gradients(model, start, windows)
    flat = [g for pair in grads for g in pair]
    norm = torch.sqrt(sum(g.pow(2).sum() for g in flat))
    assert norm > recipe.clip  # the clip is active
    coef = recipe.clip / (norm + 1e-6)
    lr = recipe.lr_scale * (1 - recipe.momentum)
    for i, (grad_weight, grad_bias) in enumerate(grads):
        for theta, grad, got in ((start.weight[i], grad_weight, trained.weight[i]),
                                 (start.bias[i], grad_bias, trained.bias[i])):
            d = grad * coef + recipe.weight_decay * theta  # the first step: the momentum buffer is d itself
            expected = theta - lr * (d + recipe.momentum * d)  # Nesterov: d + momentum * buffer
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


def test_a_planted_translator_is_recovered():
    """One layer whose final residual is an affine map of the embedding: the attention of a single token reads
    norm(x) = g * x / rms(x), linear when every embedding has the same rms; the MLP writes nothing; no final
    norm, so the lens's logits equal the model's only at T(x) = final(x)."""
    config = resid.ModelConfig(architecture="planted", d_model=8, n_layers=1, n_heads=2, n_kv_heads=2, d_head=4,
                               d_mlp=8, d_vocab=40, n_ctx=8, norm="rmsnorm", norm_eps=1e-6, final_norm=False,
                               attn_out_bias=True)
    model = randomize(resid.Transformer(config, name="planted"), 0)
    attn, norm = model.blocks[0].attn, model.blocks[0].ln_attn
    with torch.no_grad():
        model.embed.W_E.div_(model.embed.W_E.pow(2).mean(-1, keepdim=True).sqrt())
        model.blocks[0].mlp._w_out.zero_()
        planted_weight = (attn._w_o @ attn._w_v @ torch.diag(norm.w)) / (1 + 1e-6) ** 0.5
        planted_bias = attn.b_O.clone()
        x = model.embed.W_E
        assert torch.allclose(model.run(torch.arange(40)[:, None]).stream.final()[:, 0],
                              x + x @ planted_weight.T + planted_bias, atol=1e-5)
    windows = torch.randint(0, 40, (4000, 1), generator=torch.Generator().manual_seed(0))
    recipe = tuned_lens.Recipe(steps=120, tokens_per_step=20, seq_len=1, precision="float32", lr_scale=10.0,
                               weight_decay=0.0)  # a larger step than tuned-lens's, for a test of seconds
    lens = tuned_lens.train(model, windows, recipe, QUIET).translators
    assert lens.info["losses"][0] > 0.1 and lens.info["losses"][-1] < 1e-6
    assert (lens.weight[0] - planted_weight).norm() < 1e-2 * planted_weight.norm()
    assert (lens.bias[0] - planted_bias).norm() < 1e-2 * planted_bias.norm()


class Killed(Exception):
    pass


def test_a_resumed_run_is_the_run_never_stopped(tmp_path):
    model = make_random_model("llama_gqa")
    windows = ids(model, 12, 4)
    recipe = tuned_lens.Recipe(steps=4, tokens_per_step=8, seq_len=4, precision="float32")
    whole = tuned_lens.train(model, windows, recipe, Execution(out=tmp_path / "whole", progress=False),
                             checkpoint_every=1)

    def kill_after_step_1(step, loss):
        if step == 1:
            raise Killed

    cut = Execution(out=tmp_path / "cut", progress=False)
    with pytest.raises(Killed):
        tuned_lens.train(model, windows, recipe, cut, checkpoint_every=1, on_step=kill_after_step_1)
    resumed_steps = []
    resumed = tuned_lens.train(model, windows, recipe, cut, checkpoint_every=1,
                               on_step=lambda step, loss: resumed_steps.append(step))
    assert resumed_steps == [2, 3]
    torch.testing.assert_close(resumed.translators.weight, whole.translators.weight, rtol=0, atol=1e-7)
    torch.testing.assert_close(resumed.translators.bias, whole.translators.bias, rtol=0, atol=1e-7)
    assert resumed.translators.info["losses"] == pytest.approx(whole.translators.info["losses"], abs=1e-7)
    changed = tuned_lens.Recipe(steps=4, tokens_per_step=8, seq_len=4, precision="float32", lr_scale=2.0)
    with pytest.raises(resid.ResidError, match="other settings \\(recipe differ\\)"):
        tuned_lens.train(model, windows, changed, cut)


def test_bfloat16_readout_trains_like_float32():
    model = make_random_model("llama_gqa")
    translators, windows = random_translators(model), ids(model, 2, 8)
    exact, _ = tuned_lens.loss_and_gradients(model, translators, windows, precision="float32")
    rounded, _ = tuned_lens.loss_and_gradients(model, translators, windows, precision="bfloat16")
    torch.testing.assert_close(rounded, exact, rtol=2e-2, atol=1e-2)


def test_the_split_depends_on_each_text_only():
    texts = [f"paragraph number {i} of a long speech" for i in range(400)]
    kept, held = data.split(texts, held_out=0.2)
    assert not set(kept) & set(held) and len(kept) + len(held) == 400 and 40 < len(held) < 120
    again, held_again = data.split(list(reversed(texts[:200])), held_out=0.2)
    assert set(held_again) == set(held) & set(texts[:200])


def test_packing_joins_documents_with_end_of_text(gpt2_tokenizer):
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    texts = ["Hello world.", "A second document here.", "And a third one, somewhat longer than the others."]
    windows = data.pack(model, texts, seq_len=5)
    stream = []
    for text in texts:
        stream += [gpt2_tokenizer.eos_token_id, *gpt2_tokenizer.encode(text, prepend_bos=False)]
    assert windows.shape == (len(stream) // 5, 5) and windows.flatten().tolist() == stream[: windows.numel()]
    assert data.window_order(10, 7).tolist() == data.window_order(10, 7).tolist() != list(range(10))


def test_recipe_and_data_errors_say_what_to_change():
    with pytest.raises(resid.ResidError, match="multiple of seq_len"):
        tuned_lens.Recipe(tokens_per_step=100, seq_len=64)
    recipe = tuned_lens.Recipe(steps=10, tokens_per_step=8, seq_len=4)
    assert recipe.lr(0) == pytest.approx(0.1) and recipe.lr(9) == pytest.approx(0.01)
    model = make_random_model("llama_gqa")
    with pytest.raises(resid.ResidError, match="need 20 windows of 4 tokens; the corpus gives 3"):
        tuned_lens.train(model, ids(model, 3, 4), recipe, QUIET)


def test_a_sublayer_lens_has_a_translator_at_every_site_but_the_last():
    model = make_random_model("olmo2_like")
    recipe = tuned_lens.Recipe(steps=2, tokens_per_step=8, seq_len=4, every="sublayer", precision="float32")
    lens = tuned_lens.train(model, ids(model, 4, 4), recipe, QUIET)
    assert list(lens.translators.sites) == logit_lens.site_list(model, "sublayer")[:-1]
    df = logit_lens.run(model, ids(model, 1, 5, seed=3), every="sublayer", lens=lens, k=1)
    assert len(df) == len(logit_lens.site_list(model, "sublayer")) and set(df["lens"]) == {"tuned"}


def test_the_default_precision_is_what_the_device_runs_fast_and_is_recorded(monkeypatch):
    """precision="auto" (the default) trains in what fast_precision chooses for the model's device, and the lens
    records that choice, not "auto"; the choice itself is one of the two precisions, bfloat16 only where a bfloat16
    matmul was not slower."""
    model = make_random_model("llama_gqa")
    assert tuned_lens.Recipe().precision == "auto"
    assert training.fast_precision(model.device) in ("bfloat16", "float32")
    for chosen in ("float32", "bfloat16"):
        monkeypatch.setattr(training, "fast_precision", lambda device, chosen=chosen: chosen)
        lens = tuned_lens.train(model, ids(model, 4, 4), tuned_lens.Recipe(steps=1, tokens_per_step=8, seq_len=4),
                                Execution(progress=False))
        assert lens.translators.info["recipe"]["precision"] == chosen
