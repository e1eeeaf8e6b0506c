"""Each recipe: one training step's loss and gradients equal a hand-written reference (the formulas of the library
the recipe follows, written out here with plain torch), and training on data from a planted dictionary recovers the
planted directions (cosine > 0.9 for most of them) within seconds."""

import pytest
import torch
from numerics import TINY
from planted import batches, planted, recovered

import resid
from resid.analyses.training.recipe import Recipe
from resid.analyses.training.trainer import Trainer, fit


def _trainer(activation: str, **options) -> tuple[Trainer, torch.Tensor]:
    recipe = Recipe(activation=activation, d_sae=40, k=4, steps=10, batch_size=64, warmup_steps=0, seed=3,
                    b_dec_init="mean", **options)
    trainer = Trainer.new(recipe, 16)
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(5)) * 2 + 0.5
    trainer.coder.start(x, x)
    with torch.no_grad():  # a non-zero encoder bias, so that the reference has to add it
        trainer.coder.b_enc.copy_(0.1 * torch.randn(40, generator=torch.Generator().manual_seed(6)))
    return trainer, x


def _leaves(coder, names):
    return {n: getattr(coder, n).detach().clone().requires_grad_() for n in names}


def _grads(trainer: Trainer, x: torch.Tensor, step: int = 0) -> tuple[torch.Tensor, dict]:
    loss, _, _ = trainer.coder.loss(x, x, step)
    loss.backward()
    trainer.coder.before_step()
    return loss.detach(), {n: p.grad.clone() for n, p in trainer.coder.named_parameters()}


def _check(loss, grads, ref_loss, ref_leaves) -> None:
    torch.testing.assert_close(loss, ref_loss.detach(), **TINY)
    for name, leaf in ref_leaves.items():
        torch.testing.assert_close(grads[name], leaf.grad, **TINY, msg=f"gradient of {name}")


def _unit_projected(grad: torch.Tensor, W_dec: torch.Tensor) -> torch.Tensor:
    rows = W_dec / W_dec.norm(dim=1, keepdim=True)
    return grad - (grad * rows).sum(1, keepdim=True) * rows


NAMES = ("W_enc", "b_enc", "W_dec", "b_dec")


def test_relu_step_is_saelens_standard() -> None:
    trainer, x = _trainer("relu", l1_coefficient=0.7)
    loss, grads = _grads(trainer, x)
    p = _leaves(trainer.coder, NAMES)
    acts = torch.relu((x - p["b_dec"]) @ p["W_enc"] + p["b_enc"])
    x_hat = acts @ p["W_dec"] + p["b_dec"]
    ref = ((x_hat - x) ** 2).sum(1).mean() + 0.7 * (acts * p["W_dec"].norm(dim=1)).sum(1).mean()
    ref.backward()
    _check(loss, grads, ref, p)


def test_topk_step_is_sparsify() -> None:
    trainer, x = _trainer("topk", dead_tokens=64)
    trainer.coder.since_fired[:30] = 64  # 30 dead features: the AuxK loss takes part, scaled by min(30 / 8, 1)
    loss, grads = _grads(trainer, x)
    p = _leaves(trainer.coder, NAMES)
    pre = (x - p["b_dec"]) @ p["W_enc"] + p["b_enc"]
    keep = torch.zeros_like(pre, dtype=torch.bool).scatter(1, pre.topk(4, dim=1).indices, True)
    x_hat = (torch.relu(pre) * keep) @ p["W_dec"] + p["b_dec"]
    total = ((x - x.mean(0)) ** 2).sum()
    e = (x - x_hat).detach()
    dead_pre = torch.relu(pre[:, :30])  # the 8 (= d_in // 2) largest dead pre-activations per token
    dead_keep = torch.zeros_like(dead_pre, dtype=torch.bool).scatter(1, dead_pre.topk(8, dim=1).indices, True)
    e_hat = (dead_pre * dead_keep) @ p["W_dec"][:30]
    ref = ((x - x_hat) ** 2).sum() / total + (1 / 32) * 1.0 * ((e - e_hat) ** 2).sum() / total
    ref.backward()
    p["W_dec"].grad = _unit_projected(p["W_dec"].grad, p["W_dec"].detach())
    _check(loss, grads, ref, p)


def test_batchtopk_step_is_dictionary_learning() -> None:
    trainer, x = _trainer("batchtopk", dead_tokens=64, threshold_start_step=0)
    trainer.coder.since_fired[5:15] = 64
    loss, grads = _grads(trainer, x, step=1)
    p = _leaves(trainer.coder, NAMES)
    relu = torch.relu((x - p["b_dec"]) @ p["W_enc"] + p["b_enc"])
    cut = relu.flatten().sort(descending=True).values[4 * 64 - 1]  # the (k * batch)-th largest
    acts = relu * (relu >= cut)
    x_hat = acts @ p["W_dec"] + p["b_dec"]
    e = (x - x_hat).detach()
    dead = relu[:, 5:15]
    keep = torch.zeros_like(dead, dtype=torch.bool).scatter(1, dead.topk(8, dim=1).indices, True)
    e_hat = (dead * keep) @ p["W_dec"][5:15]
    aux = ((e - e_hat) ** 2).sum(1).mean() / ((e - e.mean(0)) ** 2).sum(1).mean()
    ref = ((x - x_hat) ** 2).sum(1).mean() + aux / 32
    ref.backward()
    p["W_dec"].grad = _unit_projected(p["W_dec"].grad, p["W_dec"].detach())
    _check(loss, grads, ref, p)
    assert trainer.coder.threshold == acts[acts > 0].min()  # the first tracked batch sets the threshold


def test_jumprelu_step_is_saelens_with_straight_through_estimators() -> None:
    trainer, x = _trainer("jumprelu", l0_coefficient=0.3, bandwidth=0.5, init_threshold=0.2)
    loss, grads = _grads(trainer, x)
    p = _leaves(trainer.coder, NAMES)
    theta = trainer.coder.threshold.detach()
    pre = (x - p["b_dec"]) @ p["W_enc"] + p["b_enc"]
    on = (pre > theta).float()
    acts = pre * on  # the mask is a constant: d acts / d pre = 1 where on
    x_hat = acts @ p["W_dec"] + p["b_dec"]
    ref = ((x - x_hat) ** 2).sum(1).mean() + 0.3 * on.sum(1).mean()
    ref.backward()
    _check(loss, grads, ref, p)
    # the threshold's pseudo-derivatives, written out: d/d theta of the MSE through acts, and of the L0
    with torch.no_grad():
        pre, x_hat = pre.detach(), x_hat.detach()
        kernel = ((pre - theta).abs() < 0.25).float()  # rectangle((pre - theta) / 0.5)
        d_acts = (2 * (x_hat - x) / len(x)) @ p["W_dec"].detach().T
        d_theta = (d_acts * -(theta / 0.5) * kernel).sum(0) + 0.3 * (-(1 / 0.5) * kernel / len(x)).sum(0)
    torch.testing.assert_close(grads["threshold"], d_theta, **TINY)


def test_a_step_keeps_unit_decoder_rows_and_moves_every_parameter() -> None:
    trainer, x = _trainer("topk")
    before = {n: p.detach().clone() for n, p in trainer.coder.named_parameters()}
    trainer.step(x)
    torch.testing.assert_close(trainer.coder.W_dec.norm(dim=1), torch.ones(40), **TINY)
    assert all(not torch.equal(before[n], p) for n, p in trainer.coder.named_parameters())


PLANTED = {
    "relu": dict(l1_coefficient=0.3),
    "topk": dict(k=3),
    "batchtopk": dict(k=3, threshold_start_step=50),
    "jumprelu": dict(l0_coefficient=0.03, lr=1e-2, init_threshold=0.1, bandwidth=0.1),
}


@pytest.mark.parametrize("activation", sorted(PLANTED))
def test_training_recovers_a_planted_dictionary(activation: str) -> None:
    D = planted()  # 48 unit directions in 24 dimensions, 3 active per token
    recipe = Recipe(activation=activation, d_sae=96, steps=400, batch_size=256, warmup_steps=20, **PLANTED[activation])
    trainer = Trainer.new(recipe, 24)
    stats = fit(trainer, batches(D, 400, 256))
    cosines = recovered(D, trainer.coder.W_dec.detach())
    assert (cosines > 0.9).float().mean() >= 0.9, cosines
    assert stats[-1].fvu < 0.15 and stats[-1].l0 < 12
    d = trainer.coder.dictionary()  # the exported dictionary computes what was trained
    x = next(batches(D, 1, 64, seed=9))
    _, acts, _ = trainer.coder.loss(x, x, recipe.steps)
    if activation != "batchtopk":  # batchtopk is exported with its threshold instead of the batch's top-k
        torch.testing.assert_close(d.encode(x), acts.detach(), **TINY)


def test_constant_norm_rescale_is_saved_and_computed_as_trained() -> None:
    """Trained on x * sqrt(d) / |x|: the exported dictionary (normalize_activations="constant_norm_rescale", as
    SAELens computes it) encodes raw x to the trained activations and reconstructs |x| / sqrt(d) times the
    trained reconstruction."""
    D = planted()
    recipe = Recipe(activation="topk", k=3, d_sae=96, steps=50, batch_size=256, warmup_steps=5,
                    normalize="constant_norm_rescale")
    trainer = Trainer.new(recipe, 24)
    fit(trainer, batches(D, 50, 256))
    d = trainer.coder.dictionary()
    assert d.normalize_activations == "constant_norm_rescale"
    x = 3.0 * next(batches(D, 1, 64, seed=9))
    scale = 24**0.5 / x.norm(dim=-1, keepdim=True)
    _, acts, x_hat = trainer.coder.loss(x * scale, x * scale, recipe.steps)
    found, reconstruction = d(x)
    torch.testing.assert_close(found, acts.detach(), **TINY)
    torch.testing.assert_close(reconstruction, x_hat.detach() / scale, **TINY)
    with pytest.raises(resid.ResidError, match="for SAEs"):
        Trainer.new(recipe, 24, transcoder=True)


def test_a_state_saved_with_the_log_threshold_loads_as_its_exponential() -> None:
    """States saved before the JumpReLU threshold was trained as it is held log_threshold: they still load."""
    trainer, _ = _trainer("jumprelu", init_threshold=0.2)
    state = trainer.coder.state_dict()
    theta = torch.rand_like(state["threshold"]) + 0.5
    state["log_threshold"] = state.pop("threshold").mul(0).add(theta.log())
    trainer.coder.load_state_dict(state)
    torch.testing.assert_close(trainer.coder.threshold.detach(), theta)
