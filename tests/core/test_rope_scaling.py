"""Rotary scaling: resid's inverse frequencies and attention factor equal transformers' own rope init functions
(modeling_rope_utils) for every scheme resid supports, including yarn's optional fields."""

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import resid
from resid.components.rotary import inverse_frequencies
from resid.load.families import rope

D_HEAD, N_CTX = 64, 4096
CASES = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 512},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    "yarn_mscale": {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 1024, "mscale": 1.0,
                    "mscale_all_dim": 0.5, "beta_fast": 16, "beta_slow": 2, "truncate": False},
    "yarn_attention_factor": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 1024,
                              "attention_factor": 0.8},
}


def _hf_config(params: dict) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        hidden_size=D_HEAD * 4, num_attention_heads=4, max_position_embeddings=N_CTX,
        rope_parameters={"rope_theta": 50000.0, **params},
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_inverse_frequencies_equal_transformers(case: str):
    hf = _hf_config(CASES[case])
    hf_dict = hf.to_dict()
    found = rope(hf_dict)
    for seq_len in (None, N_CTX * 3):
        if seq_len is not None and case != "dynamic":
            continue
        expected, factor = ROPE_INIT_FUNCTIONS[CASES[case]["rope_type"]](hf, "cpu", seq_len=seq_len)
        got, got_factor = inverse_frequencies(found.base, D_HEAD, found.scaling, N_CTX, seq_len)
        torch.testing.assert_close(got, expected.float(), atol=0, rtol=1e-6)
        assert got_factor == pytest.approx(factor)


def test_scaling_changes_the_frequencies():
    """Guard: every case above differs from plain rotary, so the comparison tests something."""
    plain, _ = inverse_frequencies(50000.0, D_HEAD, None, N_CTX)
    for case, params in CASES.items():
        found = rope(_hf_config(params).to_dict())
        seq_len = N_CTX * 3 if case == "dynamic" else None
        assert not torch.allclose(inverse_frequencies(found.base, D_HEAD, found.scaling, N_CTX, seq_len)[0], plain)


def test_dynamic_scaling_extends_the_context():
    found = rope(_hf_config(CASES["dynamic"]).to_dict())
    assert found.scaling == resid.RopeScaling("dynamic", 2.0, N_CTX)


@pytest.mark.parametrize("params, message", [
    ({"rope_type": "longrope", "factor": 2.0, "short_factor": [1.0], "long_factor": [1.0]}, "short_factor"),
    ({"rope_type": "longrope", "factor": 2.0}, "'longrope' is not supported"),
    ({"rope_type": "su", "factor": 2.0}, "'su' is not supported"),
    ({"rope_type": "linear", "factor": 2.0, "new_knob": 3}, "new_knob"),
])
def test_unknown_schemes_and_fields_are_refused(params: dict, message: str):
    with pytest.raises(resid.ResidError, match=message):
        rope({"max_position_embeddings": N_CTX, "rope_parameters": {"rope_theta": 1e4, **params}})
