"""Recipe.normalize="expected_average_only_in": inputs and targets times constants fixed on the first batch (mean
norm sqrt(width)), folded into the exported weights so that the saved dictionary computes on raw activations
exactly what was trained on scaled ones; and why transcoders need it (their output's scale is not their input's)."""

import dataclasses

import pytest
import torch
from numerics import TINY
from planted import batches, planted

from resid.analyses.training.recipe import Recipe
from resid.analyses.training.trainer import Trainer, fit


def transcoder_batches(n: int, size: int, in_norm: float, out_norm: float, seed: int = 1):
    """x = codes @ D_in and y = codes @ D_out (two planted dictionaries sharing one sparse code), scaled apart."""
    D_in, D_out = planted(48, 24, seed=0), planted(48, 24, seed=1)
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        index = torch.rand(size, 48, generator=g).topk(3, dim=1).indices
        codes = torch.zeros(size, 48).scatter(1, index, 0.5 + torch.rand(size, 3, generator=g))
        yield in_norm * codes @ D_in, out_norm * codes @ D_out


@pytest.mark.parametrize("activation", ["topk", "jumprelu"])
@pytest.mark.parametrize("transcoder", [False, True])
def test_the_constants_are_folded_into_the_saved_weights(activation: str, transcoder: bool) -> None:
    recipe = Recipe(activation=activation, k=3, d_sae=96, steps=30, batch_size=128, warmup_steps=3,
                    normalize="expected_average_only_in")
    if transcoder:
        data = list(transcoder_batches(30, 128, 0.2, 300.0))
        trainer = Trainer.new(recipe, 24, 24, transcoder=True, skip=True)
    else:
        data = [5.0 * x for x in batches(planted(), 30, 128)]
        trainer = Trainer.new(recipe, 24)
    fit(trainer, data)
    coder, (x0, y0) = trainer.coder, (data[0] if transcoder else (data[0], data[0]))
    # the constants bring the first batch's mean norms to sqrt(24)
    torch.testing.assert_close((x0 * coder.in_scale).norm(dim=-1).mean(), torch.tensor(24**0.5))
    torch.testing.assert_close((y0 * coder.out_scale).norm(dim=-1).mean(), torch.tensor(24**0.5))
    assert transcoder or coder.in_scale == coder.out_scale
    d = coder.dictionary()
    assert d.normalize_activations == "none"  # folded: the saved dictionary reads raw activations
    x, y = (data[-1] if transcoder else (data[-1], data[-1]))
    _, acts, y_hat = coder.loss(x * coder.in_scale, y * coder.out_scale, recipe.steps)
    found, reconstruction = d(x)
    torch.testing.assert_close(found, acts.detach(), **TINY)
    torch.testing.assert_close(reconstruction, y_hat.detach() / coder.out_scale, **TINY)


def test_a_transcoder_whose_output_dwarfs_its_input_learns_only_when_normalised() -> None:
    """MLP writes of SmolLM2 are 2 to 20 times larger than its MLP inputs; here 1,500 times. With unit decoder rows
    and the encoder the decoder's transpose, the initial reconstruction has the input's scale and Adam's steps of
    about lr per weight cannot grow the encoder to the output's scale within the run: it learns nothing. Scaled
    each to norm sqrt(d), the same run learns."""
    final = {}
    for normalize in ("none", "expected_average_only_in"):
        recipe = Recipe(activation="topk", k=3, d_sae=96, steps=150, batch_size=256, warmup_steps=10,
                        normalize=normalize)
        trainer = Trainer.new(recipe, 24, 24, transcoder=True)
        final[normalize] = fit(trainer, transcoder_batches(150, 256, 0.2, 300.0))[-1].fvu
    assert final["none"] > 0.95
    assert final["expected_average_only_in"] < 0.75


def test_constant_norm_rescale_is_still_refused_for_transcoders() -> None:
    from resid import ResidError

    with pytest.raises(ResidError, match=r"is for SAEs: .*; 'expected_average_only_in' scales each side by its own "
                                         r"constant"):
        Trainer.new(Recipe(normalize="constant_norm_rescale"), 24, 24, transcoder=True)


def test_a_resumed_run_keeps_its_constants() -> None:
    """The constants are part of the checkpoint: a run restored after 3 steps ends as one that never stopped (and a
    checkpoint written before they existed restores unscaled)."""
    recipe = Recipe(activation="topk", k=3, d_sae=96, steps=6, batch_size=128, warmup_steps=2,
                    normalize="expected_average_only_in")
    data = list(transcoder_batches(6, 128, 0.2, 300.0))
    straight = Trainer.new(recipe, 24, 24, transcoder=True)
    fit(straight, data)
    first = Trainer.new(recipe, 24, 24, transcoder=True)
    fit(first, data[:3])
    resumed = Trainer.new(recipe, 24, 24, transcoder=True)
    resumed.restore(first.state(), 3)
    fit(resumed, data[3:])
    assert resumed.coder.out_scale != 1
    for name, value in straight.coder.state_dict().items():
        torch.testing.assert_close(resumed.coder.state_dict()[name], value, **TINY, msg=name)
    old = {k: v for k, v in first.state().items() if not k.endswith("_scale")}
    unscaled = Trainer.new(dataclasses.replace(recipe, normalize="none"), 24, 24, transcoder=True)
    unscaled.restore(old, 3)
    assert unscaled.coder.in_scale == 1 and unscaled.coder.out_scale == 1
