"""resid.Hook: a function of the same slice the typed interventions edit, given the run's Tokens, checked."""

import pytest
import torch
from numerics import TINY

import resid
from resid import Add, Hook, Replace, Scale, Site, ZeroAblate

TEXTS = ["The quick brown fox jumps over", "Hello there"]


def _logits(model, interventions):
    return model.run(TEXTS, capture=resid.Capture.none(), interventions=interventions).logits


@pytest.mark.parametrize(
    "site",
    [Site(1, "attn", head=2), Site(0, "mlp", neuron=7), Site(2, "attn"), Site(1, "mlp", positions=[0, -1])],
    ids=["head", "neuron", "write", "positions"],
)
def test_doubling_hook_equals_scale_by_two(random_model, site):
    clean = _logits(random_model, [])
    hooked = _logits(random_model, [Hook(site, lambda x, tokens: x * 2.0)])
    assert not torch.equal(hooked, clean)
    torch.testing.assert_close(hooked, _logits(random_model, [Scale(site, 2.0)]), atol=0, rtol=0)


def test_hook_gets_the_typed_slice_and_the_runs_tokens(random_model):
    cfg, seen = random_model.config, {}

    def spy(name):
        def fn(x, tokens):
            seen[name] = (tuple(x.shape), tokens)
            return x

        return fn

    sites = {
        "head": Site(0, "attn", head=1),
        "neuron": Site(0, "mlp", neuron=3),
        "write": Site(1, "mlp"),
        "last": Site(1, "attn", head=0, positions=[-1]),
    }
    run = random_model.run(TEXTS, interventions=[Hook(site, spy(name)) for name, site in sites.items()])
    batch, n_pos = run.tokens.ids.shape
    assert seen["head"][0] == (batch, n_pos, cfg.d_head)
    assert seen["neuron"][0] == (batch, n_pos)
    assert seen["write"][0] == (batch, n_pos, cfg.d_model)
    assert seen["last"][0] == (batch, 1, cfg.d_head)
    for _, tokens in seen.values():
        assert torch.equal(tokens.ids, run.tokens.ids) and torch.equal(tokens.attention_mask, run.tokens.attention_mask)
    torch.testing.assert_close(run.logits, _logits(random_model, []), atol=0, rtol=0)  # identity changes nothing


def test_hook_can_use_the_tokens(random_model):
    """Steer only the prompts whose last token is a given id: what the typed interventions cannot say."""
    vector = torch.randn(random_model.config.d_model)
    site = Site(1, "attn", positions=[-1])
    tokens = random_model.to_tokens(TEXTS)
    last = tokens.ids[torch.arange(2), tokens.last_positions()]

    def steer_first(x, tokens):
        chosen = tokens.ids[torch.arange(len(x)), tokens.last_positions()] == last[0]
        return x + chosen[:, None, None] * vector

    hooked = random_model.run(tokens, interventions=[Hook(site, steer_first)], logits_at="last").logits
    first = random_model.run(tokens.rows([0]), interventions=[Add(site, vector)], logits_at="last").logits
    second = random_model.run(tokens.rows([1]), logits_at="last").logits
    torch.testing.assert_close(hooked, torch.cat([first, second]), **TINY)


def test_hook_agrees_with_replace(random_model):
    site = Site(2, "attn", head=3, positions=[-1])
    value = torch.randn(random_model.config.d_head)
    hooked = _logits(random_model, [Hook(site, lambda x, tokens: value.expand_as(x).clone())])
    torch.testing.assert_close(hooked, _logits(random_model, [Replace(site, value)]), atol=0, rtol=0)


def test_hook_must_not_change_the_shape_or_dtype(random_model):
    site = Site(1, "attn", head=2)
    batch, n_pos = random_model.to_tokens(TEXTS).ids.shape
    d_head = random_model.config.d_head
    shape, wrong = rf"\({batch}, {n_pos}, {d_head}\)", rf"\({batch}, {n_pos}, 1\)"
    with pytest.raises(resid.ResidError, match=rf"must not change the shape.*returned {wrong}.*{shape}"):
        _logits(random_model, [Hook(site, lambda x, tokens: x[..., :1])])
    with pytest.raises(resid.ResidError, match=r"returned .* torch.float64.*dtype torch.float32"):
        _logits(random_model, [Hook(site, lambda x, tokens: x.double())])
    with pytest.raises(resid.ResidError, match="returned NoneType"):
        _logits(random_model, [Hook(site, lambda x, tokens: None)])
    with pytest.raises((resid.ResidError, TypeError), match=r"(?s)fn.*(Callable|needs a function fn\(slice, tokens\))"):
        Hook(site, "double it")


def test_documented_slice_shapes_are_the_ones_replace_accepts(random_model):
    """The shapes Site and Replace document are what a Replace value must have (zeros == ZeroAblate)."""
    cfg = random_model.config
    batch, n_pos = random_model.to_tokens(TEXTS).ids.shape
    documented = {
        Site(1, "attn"): ((batch, n_pos, cfg.d_model), "[batch pos d_model]"),
        Site(1, "attn", head=2): ((batch, n_pos, cfg.d_head), "[batch pos d_head]"),
        Site(1, "mlp", neuron=3): ((batch, n_pos), "[batch pos]"),
        Site(1, "mlp", positions=[-1]): ((batch, 1, cfg.d_model), "[batch 1 d_model]"),
    }
    for site, (shape, doc) in documented.items():
        assert doc in Site.__doc__
        replaced = _logits(random_model, [Replace(site, torch.zeros(shape))])
        torch.testing.assert_close(replaced, _logits(random_model, [ZeroAblate(site)]), atol=0, rtol=0)
        with pytest.raises(resid.ResidError, match="does not broadcast to the edited slice"):
            _logits(random_model, [Replace(site, torch.zeros(*shape, 2))])
    for cls in (ZeroAblate, Replace, Scale, Add, Hook, resid.Transformer.forward):
        assert cls.__doc__ and len(cls.__doc__) > 80
