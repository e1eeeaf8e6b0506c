"""Interventions equal the corresponding weight surgery, validate their input, and never stay attached."""

import copy

import pytest
import torch

import resid
from resid import Add, Replace, Scale, Site, ZeroAblate

TEXTS = ["The quick brown fox jumps over", "Hello there"]


def _surgery(model, edit):
    twin = copy.deepcopy(model)
    with torch.no_grad():
        edit(twin)
    return twin.run(TEXTS, capture=resid.Capture.none()).logits


def test_zero_head_equals_zeroing_its_W_O_rows(random_model):
    head = 1
    ablated = random_model.run(TEXTS, interventions=[ZeroAblate(Site(1, "attn", head=head))]).logits
    expected = _surgery(random_model, lambda m: m.blocks[1].attn.W_O[head].zero_())
    torch.testing.assert_close(ablated, expected, atol=1e-5, rtol=1e-5)


def test_zero_neuron_equals_zeroing_its_value_vector(random_model):
    neuron = 5
    ablated = random_model.run(TEXTS, interventions=[ZeroAblate(Site(0, "mlp", neuron=neuron))]).logits
    expected = _surgery(random_model, lambda m: m.blocks[0].mlp.W_out[neuron].zero_())
    torch.testing.assert_close(ablated, expected, atol=1e-5, rtol=1e-5)


def test_zero_sublayer_write(random_model):
    def zero_mlp(m):
        m.blocks[2].mlp.W_out.zero_()
        if m.blocks[2].mlp.b_out is not None:
            m.blocks[2].mlp.b_out.zero_()

    ablated = random_model.run(TEXTS, interventions=[ZeroAblate(Site(2, "mlp"))])
    torch.testing.assert_close(ablated.logits, _surgery(random_model, zero_mlp), atol=1e-5, rtol=1e-5)
    assert ablated.stream.layers[2].mlp.out.abs().max() == 0  # the stream records the edited write


def test_scale_and_replace_agree_with_definitions(random_model):
    clean = random_model.run(TEXTS, capture=resid.Capture(mlp={"post", "out"}))
    site = Site(1, "mlp", neuron=3, positions=(-1,))
    doubled = random_model.run(TEXTS, capture=resid.Capture(mlp={"post"}), interventions=[Scale(site, 2.0)])
    post_clean, post_new = clean.stream.layers[1].mlp.post, doubled.stream.layers[1].mlp.post
    torch.testing.assert_close(post_new[:, -1, 3], 2 * post_clean[:, -1, 3])
    torch.testing.assert_close(post_new[:, :-1], post_clean[:, :-1])  # other positions untouched
    # Replacing a write by its own clean value changes nothing; Scale(0) is ZeroAblate.
    same = random_model.run(TEXTS, interventions=[Replace(Site(0, "mlp"), clean.stream.layers[0].mlp.out)])
    torch.testing.assert_close(same.logits, clean.logits)
    zero = random_model.run(TEXTS, interventions=[ZeroAblate(Site(0, "attn", head=2))]).logits
    scaled = random_model.run(TEXTS, interventions=[Scale(Site(0, "attn", head=2), 0.0)]).logits
    torch.testing.assert_close(zero, scaled)


def test_add_vector_at_one_position(random_model):
    d_model = random_model.config.d_model
    vector = torch.linspace(-1, 1, d_model)
    clean = random_model.run(TEXTS)
    steered = random_model.run(TEXTS, interventions=[Add(Site(1, "attn", positions=(-1,)), vector)])
    delta = steered.stream.resid_mid(1) if random_model.config.block == "sequential" else steered.stream.resid_post(1)
    base = clean.stream.resid_mid(1) if random_model.config.block == "sequential" else clean.stream.resid_post(1)
    if random_model.config.block == "sequential":
        torch.testing.assert_close(delta[:, -1] - base[:, -1], vector.expand(2, -1), atol=1e-5, rtol=1e-5)
    # causal: earlier positions do not see the edit
    torch.testing.assert_close(steered.logits[:, :-1], clean.logits[:, :-1])
    assert not torch.allclose(steered.logits[:, -1], clean.logits[:, -1])


def test_interventions_never_stay_attached(random_model):
    before = random_model.run(TEXTS).logits
    random_model.run(TEXTS, interventions=[ZeroAblate(Site(0, "attn")), Scale(Site(1, "mlp"), 3.0)])
    torch.testing.assert_close(random_model.run(TEXTS).logits, before, atol=0, rtol=0)
    empty = random_model.run(TEXTS, interventions=[]).logits
    torch.testing.assert_close(empty, before, atol=0, rtol=0)


def test_site_validation(random_model):
    n = random_model.config.n_layers
    with pytest.raises(resid.ResidError, match=f"out of range; the model has {n} layers"):
        random_model.run(TEXTS, interventions=[ZeroAblate(Site(n, "mlp"))])
    with pytest.raises(resid.ResidError, match="head 9 is out of range"):
        random_model.run(TEXTS, interventions=[ZeroAblate(Site(0, "attn", head=9))])
    with pytest.raises(resid.ResidError, match="neuron 100000 is out of range"):
        random_model.run(TEXTS, interventions=[ZeroAblate(Site(0, "mlp", neuron=100_000))])
    with pytest.raises(resid.ResidError, match="cannot take head"):
        Site(0, "mlp", head=1)
    with pytest.raises(resid.ResidError, match="Site part must be one of"):
        Site(0, "resid")
    with pytest.raises(resid.ResidError, match="does not broadcast"):
        random_model.run(TEXTS, interventions=[Replace(Site(0, "attn"), torch.zeros(7))])
    with pytest.raises(resid.ResidError, match=r"Position\(s\) \[99\] are out of range for prompt 0"):
        random_model.run(TEXTS, interventions=[ZeroAblate(Site(0, "attn", positions=(99,)))])
    # negative layers count from the end, as Python indexing does
    last = random_model.run(TEXTS, interventions=[ZeroAblate(Site(-1, "mlp"))]).logits
    torch.testing.assert_close(last, random_model.run(TEXTS, interventions=[ZeroAblate(Site(n - 1, "mlp"))]).logits)


@pytest.mark.parametrize("edit", ["zero", "replace"])
@pytest.mark.parametrize("part", ["attn", "mlp"])
def test_a_sublayer_replaced_whole_is_not_computed(random_model, edit, part):
    """A Replace or ZeroAblate of a sublayer's whole write at every position, nothing of it captured, gives the
    logits of editing the computed write (a Hook) without computing the sublayer; captured, it is computed."""
    value = torch.randn(random_model.config.d_model, generator=torch.Generator().manual_seed(3))
    typed = ZeroAblate(Site(1, part)) if edit == "zero" else Replace(Site(1, part), value)
    by_hook = resid.Hook(Site(1, part), lambda out, tokens: typed.edit(out))
    calls = []
    handle = getattr(random_model.blocks[1], part).register_forward_hook(lambda *args: calls.append(1))
    try:
        skipped = random_model.run(TEXTS, capture=resid.Capture.none(), interventions=[typed]).logits
        assert not calls
        computed = random_model.run(TEXTS, capture=resid.Capture.none(), interventions=[by_hook]).logits
        assert calls
        captured = random_model.run(TEXTS, capture=resid.Capture(layers=[1]), interventions=[typed])
        assert len(calls) == 2
    finally:
        handle.remove()
    torch.testing.assert_close(skipped, computed, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(captured.logits, computed, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(skipped, random_model.run(TEXTS, capture=resid.Capture.none()).logits)
