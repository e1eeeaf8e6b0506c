"""Dictionaries are values: check() returns the checked dictionary (hooks mapped onto the model's sites, weights
shared) and leaves the one given as it was, with no registry of what was checked; per-layer transcoders and a
cross-layer transcoder answer the one transcoder protocol (resid.dictionaries.transcoders)."""

import importlib
import weakref

import pytest
import torch
from random_models import make_random_model
from random_transcoders import cross_layer, per_layer

import resid
from resid.dictionaries import (
    ActivationFunction,
    Binding,
    CrossLayerTranscoder,
    Dictionary,
    InputNormalization,
    Weights,
    check,
)
from resid.dictionaries.check import ensure
from resid.dictionaries.transcoders import TranscoderSet, replacing_mlps
from resid.errors import ResidError


@pytest.fixture(scope="module")
def model() -> resid.Transformer:
    return make_random_model("llama_gqa")


def _unchecked(d: int, hook_in: str = "blocks.1.hook_resid_post", hook_out: str | None = None) -> Dictionary:
    g = torch.Generator().manual_seed(0)
    weights = Weights(torch.randn(d, 16, generator=g), torch.randn(16, d, generator=g), torch.zeros(d),
                      -0.5 * torch.ones(16))
    return Dictionary(weights, ActivationFunction("jumprelu", torch.full((16,), 0.1)),
                      binding=Binding(hook_in, hook_out), name="sae")


def test_check_returns_a_new_checked_value_and_leaves_the_given_one_untouched(model) -> None:
    sae = _unchecked(model.config.d_model)
    before = {name: p.detach().clone() for name, p in sae.named_parameters()}
    checked = check(sae, model)
    assert checked is not sae
    assert sae.point_in is None and sae.point_out is None and sae.binding.checked is None  # untouched
    assert checked.site_in == checked.site_out == resid.Site(1, "resid_post")
    assert checked.binding.checked == (model.name, model.config)
    assert (checked.hook_in, checked.activation, checked.d_sae) == (sae.hook_in, sae.activation, sae.d_sae)
    for name, p in checked.named_parameters():  # the same weights, shared (no copy), as separate Parameters
        assert p.data_ptr() == getattr(sae, name).data_ptr() and p is not getattr(sae, name), name
    checked.to(torch.float64)  # moving the checked value moves only it
    assert all(torch.equal(p, before[name]) and p.dtype == torch.float32 for name, p in sae.named_parameters())
    assert checked.W_enc.dtype == torch.float64


def test_a_checked_cross_layer_transcoder_is_a_new_value_too(model) -> None:
    clt = cross_layer(model)  # checked already; make an unchecked one from its weights
    raw = CrossLayerTranscoder(W_enc=clt.W_enc.data, b_enc=clt.b_enc.data, W_dec=[w.data for w in clt.W_dec],
                               b_dec=clt.b_dec.data, activation="relu", hook_in=clt.hook_in, hook_out=clt.hook_out)
    checked = check(raw, model)
    assert checked is not raw and raw.points_in is None and raw.checked is None
    assert checked.points_in == clt.points_in and checked.points_out == clt.points_out
    assert checked.W_dec[1].data_ptr() == raw.W_dec[1].data_ptr()


def test_no_module_level_registry_remembers_what_was_checked() -> None:
    module = importlib.import_module("resid.dictionaries.check")  # the attribute `check` is the function
    assert module.check is check
    kept = [name for name, value in vars(module).items() if not name.startswith("__")
            if isinstance(value, (dict, set, list, weakref.WeakKeyDictionary, weakref.WeakValueDictionary))]
    assert kept == []


def test_a_run_checks_an_unchecked_dictionary_without_changing_it(model) -> None:
    sae = _unchecked(model.config.d_model)
    ids = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(1))
    record = model.run(ids, dictionaries=[sae]).dictionaries["sae"]
    assert sae.point_in is None  # the run used a checked value of it
    assert record.dictionary.site_in == resid.Site(1, "resid_post")
    checked = check(sae, model)
    torch.testing.assert_close(record.reconstruction, model.run(ids, dictionaries=[checked]).dictionaries["sae"]
                               .reconstruction, rtol=0, atol=0)


def test_ensure_keeps_a_dictionary_checked_for_this_model_and_rechecks_for_another(model) -> None:
    checked = check(_unchecked(model.config.d_model), model)
    assert ensure(checked, model) is checked
    other = make_random_model("gpt2_like")  # another model: its hooks are checked again, for it
    again = ensure(checked, other)
    assert again is not checked and again.binding.checked == (other.name, other.config)
    assert checked.binding.checked == (model.name, model.config)


def test_per_layer_and_cross_layer_transcoders_answer_one_protocol(model) -> None:
    n = model.config.n_layers
    clt = replacing_mlps(model, cross_layer(model))
    assert clt.dictionaries == (clt,) and [list(clt.targets(s)) for s in range(n)] == [list(range(s, n))
                                                                                        for s in range(n)]
    # per-layer transcoders made from the CLT's own-layer weights answer each question as the CLT does there
    items = [check(Dictionary(Weights(clt.encoder(l).data, clt.decoder(l, l).data.contiguous(),
                                      clt.decoder_bias(l).data, clt.b_enc[l].data),
                              binding=Binding(clt.points_in[l].name, clt.points_out[l].name), name=f"own{l}"), model)
             for l in range(n)]
    found = replacing_mlps(model, list(reversed(items)))  # any order: the protocol's are in layer order
    assert isinstance(found, TranscoderSet) and found.dictionaries == tuple(items)
    x = torch.randn(4, model.config.d_model, generator=torch.Generator().manual_seed(2))
    for layer in range(n):
        assert list(found.targets(layer)) == [layer]
        assert found.points_in[layer] == clt.points_in[layer] and found.points_out[layer] == clt.points_out[layer]
        assert torch.equal(found.encoder(layer), clt.encoder(layer))
        assert torch.equal(found.decoder(layer, layer), clt.decoder(layer, layer))
        assert found.skip(layer) is None and clt.skip(layer) is None
        torch.testing.assert_close(found.pre_activations(layer, x), clt.pre_activations(layer, x))
    with pytest.raises(ResidError, match="writes into layer 0 alone"):
        found.decoder(0, 1)


def test_a_transcoder_set_needs_every_layer_once(model) -> None:
    items = per_layer(model)
    with pytest.raises(ResidError, match=r"no transcoder replaces layer\(s\) \[1\]"):
        replacing_mlps(model, [items[0], *items[2:]])
    with pytest.raises(ResidError, match="Two transcoders replace layer 0"):
        replacing_mlps(model, [items[0], *items])


def test_the_separate_keywords_of_the_old_constructor_still_build_the_same_dictionary() -> None:
    g = torch.Generator().manual_seed(3)
    W_enc, W_dec = torch.randn(8, 16, generator=g), torch.randn(16, 8, generator=g)
    b_enc, b_dec, threshold = torch.randn(16, generator=g), torch.randn(8, generator=g), torch.rand(16, generator=g)
    new = Dictionary(Weights(W_enc, W_dec, b_dec, b_enc), ActivationFunction("jumprelu", threshold=threshold),
                     normalization=InputNormalization(apply_b_dec_to_input=True),
                     binding=Binding("blocks.1.hook_resid_post"), name="sae")
    with pytest.warns(DeprecationWarning, match=r"pass Dictionary\(Weights"):
        old = Dictionary(W_enc=W_enc, W_dec=W_dec, b_enc=b_enc, b_dec=b_dec, activation="jumprelu",
                         threshold=threshold, apply_b_dec_to_input=True, hook_in="blocks.1.hook_resid_post",
                         name="sae")
    x = torch.randn(5, 8, generator=g)
    for a, b in zip(old(x), new(x)):
        assert torch.equal(a, b)
    assert (old.binding, old.activation, old.apply_b_dec_to_input) == (new.binding, "jumprelu", True)
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['W_encoder'\\]"):
        Dictionary(W_encoder=W_enc, W_dec=W_dec, b_dec=b_dec, activation="relu")
