"""Capture: field validation names the bad field, inputs are normalized to frozensets / tuples, all() and
none(), keeps_layer with negative layers, validate() ranges."""

import dataclasses

import pytest
import torch
from random_models import RANDOM_CONFIGS, make_random_model

from resid.capture import ATTN_FIELDS, MLP_FIELDS, Capture
from resid.errors import ResidError


@pytest.mark.parametrize("name, allowed", [("attn", ATTN_FIELDS), ("mlp", MLP_FIELDS)])
def test_unknown_field_is_named_with_the_choices(name, allowed):
    with pytest.raises(ResidError) as err:
        Capture(**{name: {"out", "resid"}})
    message = str(err.value)
    assert f"Capture({name}=...)" in message and "['resid']" in message
    assert str(sorted(allowed)) in message  # every valid choice is listed


def test_a_field_of_the_other_sublayer_is_refused():
    # "pattern" is an attention field, "post" an MLP one: each is unknown on the other side.
    with pytest.raises(ResidError, match=r"Capture\(mlp=\.\.\.\) got unknown field\(s\) \['pattern'\]"):
        Capture(mlp={"pattern"})
    with pytest.raises(ResidError, match=r"Capture\(attn=\.\.\.\) got unknown field\(s\) \['post'\]"):
        Capture(attn=["post"])


def test_strings_and_collections_are_normalized():
    capture = Capture(attn="pattern", mlp=["post", "out", "post"], layers=range(2), positions=[-1])
    assert capture.attn == frozenset({"pattern"})  # one string is one field, not its characters
    assert capture.mlp == frozenset({"post", "out"})
    assert capture.layers == (0, 1) and capture.positions == (-1,)
    assert isinstance(capture.layers, tuple) and isinstance(capture.positions, tuple)
    assert hash(capture) == hash(Capture(attn={"pattern"}, mlp={"out", "post"}, layers=(0, 1), positions=(-1,)))


def test_default_keeps_the_residual_writes_only():
    capture = Capture()
    assert capture.attn == capture.mlp == frozenset({"out"})
    assert capture.embed and capture.final_norm_scale
    assert capture.layers is None and capture.positions is None


def test_all_and_none():
    everything = Capture.all()
    assert everything.attn == ATTN_FIELDS and everything.mlp == MLP_FIELDS
    assert {"q", "k", "v", "z", "pattern"} <= everything.attn and {"pre", "gate", "post"} <= everything.mlp
    assert everything.embed and everything.final_norm_scale and everything.layers is None
    nothing = Capture.none()
    assert nothing.attn == nothing.mlp == frozenset()
    assert not nothing.embed and not nothing.final_norm_scale


def test_capture_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Capture().layers = (1,)


def test_keeps_layer_counts_negative_layers_from_the_end():
    assert all(Capture().keeps_layer(layer, 4) for layer in range(4))
    capture = Capture(layers=[-1, 0])
    assert [capture.keeps_layer(layer, 4) for layer in range(4)] == [True, False, False, True]
    assert [Capture(layers=[-2]).keeps_layer(layer, 3) for layer in range(3)] == [False, True, False]
    assert not Capture(layers=[]).keeps_layer(0, 4)


def test_validate_accepts_in_range_layers_and_names_the_others():
    Capture(layers=[0, 3, -4]).validate(4)
    Capture().validate(1)
    for bad in ([4], [-5], [0, 7]):
        with pytest.raises(ResidError) as err:
            Capture(layers=bad).validate(4)
        out_of_range = [layer for layer in bad if not -4 <= layer < 4]
        assert f"Capture(layers=...) has {out_of_range} out of range" in str(err.value)
        assert "4 layers (0..3)" in str(err.value)


# The README: "Capturing `pattern` does not change any other number" -- bitwise, not to rounding: z always comes
# from the fused attention and the pattern is computed beside it, so every other tensor is the same float32 bits.
PROMPTS = ["The quick brown fox jumps over", "Hello", "a b c"]  # unequal lengths: left padding and masks too


def _captured(stream, layer: int, part: str, fields) -> dict[str, torch.Tensor]:
    """Every field of `fields` that this model has and the run kept, for one sublayer of one layer."""
    record = getattr(stream.layers[layer], part)
    kept = {}
    for name in sorted(fields):
        try:
            kept[name] = getattr(record, name)
        except ResidError:  # a field this model has not (e.g. gate in a non-gated MLP)
            continue
    return kept


@pytest.mark.parametrize("kind", sorted(RANDOM_CONFIGS))
def test_capturing_the_pattern_changes_no_other_number_bitwise(kind, gpt2_tokenizer):
    model = make_random_model(kind, gpt2_tokenizer)
    without = model.run(PROMPTS, capture=Capture(attn=ATTN_FIELDS - {"pattern"}, mlp=MLP_FIELDS))
    everything = model.run(PROMPTS, capture=Capture.all())
    assert torch.equal(without.logits, everything.logits)
    assert torch.equal(model.run(PROMPTS, capture=Capture.none()).logits, everything.logits)
    assert torch.equal(model.run(PROMPTS).logits, everything.logits)  # the default Capture
    for layer in range(model.config.n_layers):
        assert torch.equal(without.stream.resid_pre(layer), everything.stream.resid_pre(layer))
        for part, fields in (("attn", ATTN_FIELDS - {"pattern"}), ("mlp", MLP_FIELDS)):
            theirs = _captured(everything.stream, layer, part, fields)
            ours = _captured(without.stream, layer, part, fields)
            assert ours.keys() == theirs.keys() and {"out"} <= ours.keys()
            for name in ours:
                assert torch.equal(ours[name], theirs[name]), f"layers[{layer}].{part}.{name} differs ({kind})"
    assert torch.equal(without.stream.final(), everything.stream.final())
