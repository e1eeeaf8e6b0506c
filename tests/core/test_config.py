"""ModelConfig: every invalid field is reported at once by name, rotary_dims, and the to_dict round trip."""

import dataclasses

import pytest
from random_models import make_random_model

import resid
from resid.config import ModelConfig
from resid.errors import ResidError

BASE = {"architecture": "llama", "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_head": 8,
        "d_mlp": 64, "d_vocab": 97, "n_ctx": 64, "norm": "rmsnorm", "norm_eps": 1e-5}


def config(**changes) -> ModelConfig:
    return ModelConfig(**{**BASE, **changes})


@pytest.mark.parametrize("changes, problem", [
    ({"n_kv_heads": 3}, "n_heads=4 is not a multiple of n_kv_heads=3"),
    ({"rotary_dim": 5}, "rotary_dim=5 must be even and in (0, d_head=8]"),
    ({"rotary_dim": 10}, "rotary_dim=10 must be even and in (0, d_head=8]"),
    ({"rotary_dim": 0}, "rotary_dim=0 must be even"),
    ({"d_head": 7}, "rotary_dim=7 must be even"),  # rotary over the whole head needs an even d_head
    ({"d_model": 0}, "d_model=0 must be positive"),
    ({"n_layers": -1}, "n_layers=-1 must be positive"),
    ({"d_vocab": 0}, "d_vocab=0 must be positive"),
    ({"n_ctx": 0}, "n_ctx=0 must be positive"),
])
def test_invalid_field_is_named(changes, problem):
    with pytest.raises(ResidError) as err:
        config(**changes)
    assert str(err.value).startswith("Invalid ModelConfig: ") and problem in str(err.value)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ResidError) as err:
        config(n_kv_heads=3, d_mlp=0, rotary_dim=3)
    message = str(err.value)
    assert "n_kv_heads=3" in message and "d_mlp=0 must be positive" in message and "rotary_dim=3" in message
    assert message.count(";") == 2


def test_learned_positions_ignore_rotary_dim():
    # No rotation: an odd d_head or rotary_dim is no problem, and nothing rotates.
    learned = config(positions="learned", d_head=7, rotary_dim=3)
    assert learned.rotary_dims == 0


def test_rotary_dims():
    assert config().rotary_dims == 8  # None: the whole head
    assert config(rotary_dim=4).rotary_dims == 4  # partial rotary (GPT-NeoX / Pythia)
    assert config(rotary_dim=8).rotary_dims == 8


def test_to_dict_round_trips_every_field():
    original = config(rotary_dim=4, sliding_window=16, attn_scale=0.5, act="gelu_new", embed_scale=2.0)
    as_dict = original.to_dict()
    assert list(as_dict) == [f.name for f in dataclasses.fields(ModelConfig)]
    assert as_dict["rotary_dim"] == 4 and as_dict["sliding_window"] == 16 and as_dict["act"] == "gelu_new"
    assert ModelConfig(**as_dict) == original
    assert as_dict is not original.to_dict()  # a fresh dict: editing it leaves the config alone
    as_dict["d_model"] = 1
    assert original.d_model == 32


def test_a_model_s_config_round_trips():
    model = make_random_model("neox_parallel")
    rebuilt = ModelConfig(**model.config.to_dict())
    assert rebuilt == model.config and rebuilt.block == "parallel" and rebuilt.rotary_dims == 4
    assert resid.Transformer(rebuilt).config == model.config


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        config().d_model = 64
