"""Cross-layer transcoder training on a tiny random model: a few steps lower the summed reconstruction error (BatchTopK
and JumpReLU); the decoders reach every later layer and no earlier one; the CLT saved in circuit-tracer's format
loads back equal and runs in model.run; a run killed mid-way resumes to the uninterrupted weights; a CLT the device
cannot hold is refused before any work, saying what fits; a NaN batch stops before the weights change."""

import pytest
import random_transcoders
import torch
from numerics import TINY

import resid
from resid.analyses.distributed.execution import Execution
from resid.analyses.training import crosslayer
from resid.analyses.training.crosslayer import CrossLayerCoder, train_crosslayer
from resid.analyses.training.recipe import Recipe
from resid.analyses.training.trainer import Trainer, fit
from resid.dictionaries.formats import circuit_tracer

BATCHTOPK = Recipe(activation="batchtopk", k=4, d_sae=32, steps=16, batch_size=96, warmup_steps=2, dead_tokens=200,
                   threshold_start_step=2, lr=3e-2)
JUMPRELU = Recipe(activation="jumprelu", d_sae=32, steps=16, batch_size=96, warmup_steps=2, l0_coefficient=1e-3,
                  lr=3e-2)
OPTIONS = dict(window=24, buffer_tokens=200)
QUIET = Execution(batch_size=4, progress=False)


def _in(folder) -> Execution:
    return Execution(batch_size=4, progress=False, out=folder)


def _weights(clt) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in clt.state_dict().items()}


@pytest.mark.parametrize("recipe", [BATCHTOPK, JUMPRELU], ids=["batchtopk", "jumprelu"])
def test_a_few_steps_lower_the_summed_reconstruction_error(bos_model, texts, recipe) -> None:
    stats = []
    clt = train_crosslayer(bos_model, texts, recipe, QUIET, on_step=lambda step, s: stats.append(s[0]), **OPTIONS)
    fvu = [s.fvu for s in stats]
    assert len(fvu) == recipe.steps
    assert sum(fvu[-3:]) / 3 < 0.85 * fvu[0], fvu
    n = bos_model.config.n_layers
    assert isinstance(clt, resid.dictionaries.CrossLayerTranscoder) and clt.n_layers == n
    assert [tuple(w.shape) for w in clt.W_dec] == [(32, n - layer, bos_model.config.d_model) for layer in range(n)]
    assert clt.hook_in == "ln2.hook_normalized" and clt.hook_out == "hook_mlp_out"
    assert clt.activation == "jumprelu" and bool((clt.threshold >= 0).all())


def test_the_saved_clt_loads_back_equal_and_runs(bos_model, texts, tmp_path) -> None:
    clt = train_crosslayer(bos_model, texts, BATCHTOPK, _in(tmp_path), **OPTIONS)
    loaded = resid.dictionaries.load(tmp_path / "clt", bos_model)
    assert isinstance(loaded, resid.dictionaries.CrossLayerTranscoder)
    for name, value in clt.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    run = bos_model.run(texts[:2], dictionaries=[resid.dictionaries.Splice(loaded)])
    record = run.dictionaries[loaded.name]
    clean = bos_model.run(texts[:2])
    torch.testing.assert_close(run.logits, clean.logits, **TINY)  # the splice keeps the clean run with its error
    assert float((record.acts > 0).float().sum()) > 0


@pytest.mark.parametrize("recipe", [BATCHTOPK, JUMPRELU], ids=["batchtopk", "jumprelu"])
def test_normalisation_constants_are_folded_into_the_exported_weights(recipe) -> None:
    """Trained on activations scaled per layer, exported for the model's own: the exported CLT's features and
    reconstruction of a batch equal the coder's, unscaled."""
    n, d_in, d_out = 3, 8, 6
    coder = CrossLayerCoder(n, d_in, d_out, Recipe(**{**recipe.__dict__, "normalize": "expected_average_only_in"}))
    scales_in, scales_out = torch.tensor([3.0, 0.5, 7.0]), torch.tensor([0.2, 4.0, 1.5])

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(96, n, d_in) * scales_in[:, None], torch.randn(96, n, d_out) * scales_out[:, None]

    fit(Trainer(coder), [batch() for _ in range(4)])
    assert not torch.allclose(coder.out_scale, torch.ones(n), rtol=0.1)
    clt = coder.dictionary(hook_in="hook_mlp_in", hook_out="hook_mlp_out")
    x, y = batch()
    with torch.no_grad():
        xs, _ = coder.normalise(x, y)
        pre = coder.pre(xs)
        acts = pre * (pre > clt.threshold)
        expected = coder.decode(acts) / coder.out_scale[:, None]
    got_acts, got = clt(x.transpose(0, 1))
    torch.testing.assert_close(got_acts.transpose(0, 1), acts, **TINY)
    torch.testing.assert_close(got.transpose(0, 1), expected, **TINY)


class Killed(Exception):
    pass


@pytest.mark.parametrize("recipe", [BATCHTOPK, JUMPRELU], ids=["batchtopk", "jumprelu"])
def test_a_killed_run_resumes_to_the_uninterrupted_weights(bos_model, texts, tmp_path, recipe) -> None:
    def kill(step, stats):
        if step == 7:
            raise Killed

    with pytest.raises(Killed):
        train_crosslayer(bos_model, texts, recipe, _in(tmp_path), checkpoint_every=3, on_step=kill, **OPTIONS)
    resumed_from = []
    resumed = train_crosslayer(bos_model, texts, recipe, _in(tmp_path), checkpoint_every=3,
                               on_step=lambda step, stats: resumed_from.append(step), **OPTIONS)
    assert resumed_from[0] == 7  # it went on from the checkpoint of step 6, not from the start
    straight = _weights(train_crosslayer(bos_model, texts, recipe, QUIET, **OPTIONS))
    for name, value in _weights(resumed).items():
        assert torch.equal(value, straight[name]), name


def test_a_clt_the_device_cannot_hold_is_refused_saying_what_fits(bos_model, texts, monkeypatch) -> None:
    monkeypatch.setattr(crosslayer, "available_bytes", lambda device: 3 * 2**20)
    with pytest.raises(resid.ResidError, match=r"cross-layer transcoder of 3 layers x 4,096 features \(d_sae=4096\) "
                                               r"needs .* MiB .*6 decoder blocks.*at most [\d,]+ features per layer "
                                               r"fit here with batch_size=96"):
        train_crosslayer(bos_model, texts, Recipe(**{**BATCHTOPK.__dict__, "d_sae": 4096}), QUIET, **OPTIONS)
    # what it says fits, fits
    fit = int(str(_refusal(bos_model, texts)).split("at most ")[1].split(" features")[0].replace(",", ""))
    d_model = bos_model.config.d_model
    crosslayer.check_memory(3, d_model, d_model, Recipe(**{**BATCHTOPK.__dict__, "d_sae": fit}), torch.device("cpu"))
    with pytest.raises(resid.ResidError):
        crosslayer.check_memory(3, d_model, d_model, Recipe(**{**BATCHTOPK.__dict__, "d_sae": fit + 1}),
                                torch.device("cpu"))


def _refusal(model, texts) -> resid.ResidError:
    with pytest.raises(resid.ResidError) as caught:
        train_crosslayer(model, texts, Recipe(**{**BATCHTOPK.__dict__, "d_sae": 4096}), QUIET, **OPTIONS)
    return caught.value


@pytest.mark.parametrize("change, message", [
    (dict(activation="topk"), r"activation 'batchtopk' or 'jumprelu'.*not activation='topk'"),
    (dict(activation="relu"), r"not activation='relu'"),
    (dict(normalize="constant_norm_rescale"), r"constant_norm_rescale' is for SAEs"),
])
def test_recipes_a_clt_cannot_train_are_refused(bos_model, texts, change, message) -> None:
    with pytest.raises(resid.ResidError, match=message):
        train_crosslayer(bos_model, texts, Recipe(**{**BATCHTOPK.__dict__, **change}), QUIET, **OPTIONS)


@pytest.mark.parametrize("recipe", [BATCHTOPK, JUMPRELU], ids=["batchtopk", "jumprelu"])
def test_a_nan_batch_stops_before_the_weights_change(recipe) -> None:
    trainer = Trainer(CrossLayerCoder(3, 8, 8, Recipe(**{**recipe.__dict__, "steps": 8})))
    trainer.label = "the cross-layer transcoder"
    good = (torch.randn(96, 3, 8), torch.randn(96, 3, 8))
    fit(trainer, [good, good])
    before = {k: v.clone() for k, v in trainer.state().items()}
    bad = good[0].clone()
    bad[5, 2, 3] = float("nan")
    with pytest.raises(resid.ResidError, match=r"stopped in step 3 of 8: .* of the cross-layer transcoder is not "
                                               r"finite .*lr=.*try 10x lower"):
        fit(trainer, [(bad, good[1])])
    after = trainer.state()
    assert all(torch.equal(before[k], after[k]) for k in before)  # Adam never saw the NaN gradient


def test_the_circuit_tracer_writer_refuses_what_its_format_cannot_hold(bos_model, tmp_path) -> None:
    coder = CrossLayerCoder(3, 8, 8, BATCHTOPK)
    clt = coder.dictionary(hook_in="hook_mlp_in", hook_out="hook_mlp_out")
    with pytest.raises(resid.ResidError, match="not a Dictionary"):
        circuit_tracer.write(random_transcoders.per_layer(bos_model)[0], tmp_path / "a")
    clt.W_skip = torch.nn.Parameter(torch.zeros(3, 8, 8))
    with pytest.raises(resid.ResidError, match="no skip path"):
        circuit_tracer.write(clt, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_the_sparse_decode_and_its_gradients_equal_the_dense_decode() -> None:
    """BatchTopK decodes only the kept entries (embedding_bag); the reconstruction and the gradients of the decoders
    and of the kept values equal the dense product's."""
    coder = CrossLayerCoder(3, 8, 6, BATCHTOPK)
    torch.manual_seed(0)
    pre = torch.randn(20, 3, 32, requires_grad=True)
    kept = [crosslayer.batch_top_k(pre[:, layer], 4) for layer in range(3)]
    dense = torch.zeros(20, 3, 32)
    for layer, (values, token, feature) in enumerate(kept):
        dense[:, layer] = torch.zeros(20, 32).index_put((token, feature), values)
    cotangent = torch.randn(20, 3, 6)
    grads = []
    for y_hat in (coder.decode(dense), coder.decode_sparse(kept, 20)):
        grads.append(torch.autograd.grad(y_hat, [pre, *coder.W_dec], cotangent, retain_graph=True))
        grads[-1] = (y_hat.detach(), *grads[-1])
    assert bool(grads[0][1].abs().sum() > 0) and bool(grads[0][2].abs().sum() > 0)
    for dense_side, sparse_side in zip(*grads, strict=True):
        torch.testing.assert_close(sparse_side, dense_side, atol=1e-5, rtol=1e-5)
