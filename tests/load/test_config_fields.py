"""The config allow-list: every config.json field is read by its family or known to be harmless; anything else
(a new rope type, norm placement or attention variant) is refused with an error naming it, never loaded as a
silently wrong model. Every tiny model's own config.json (as transformers writes it) passes."""

import json
from pathlib import Path

import pytest

import resid
from tiny_models import VARIANTS, hf_config


def _folder_with(tmp_path: Path, variant: str, **changes) -> Path:
    hf_config(variant).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(changes)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_field_transformers_writes_is_known(tmp_path: Path, variant: str):
    """Reading the config needs no weights: check_fields runs before any tensor is read, so a missing-weights
    error (not a config error) shows the config was accepted."""
    folder = _folder_with(tmp_path, variant)
    with pytest.raises(resid.ResidError, match="no model.safetensors"):
        resid.load(folder)


@pytest.mark.parametrize("variant, field, value", [
    ("llama", "new_norm_placement", "sandwich"),
    ("gemma3", "attn_temperature_tuning", True),
    ("qwen3_yarn", "decoder_sparse_step", 1),
    ("gemma3", "use_bidirectional_attention", True),
    ("gpt2", "scale_attn_by_inverse_layer_idx_v2", True),
])
def test_an_unknown_field_is_refused_by_name(tmp_path: Path, variant: str, field: str, value: object):
    with pytest.raises(resid.ResidError, match=f"{field}={value!r}") as info:
        resid.load(_folder_with(tmp_path, variant, **{field: value}))
    assert "refuses" in str(info.value)


@pytest.mark.parametrize("variant, changes, message", [
    ("llama", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "factor": 2.0}}, "'longrope' is not supported"),
    ("phi3", {"rope_parameters": {"rope_type": "su", "rope_theta": 1e4}}, "'su' is not supported"),
    ("gemma3", {"layer_types": ["chunked_attention", "full_attention"]}, "chunked_attention"),
    ("gemma3", {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                    "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}},
     "scales the sliding layers"),
])
def test_unsupported_values_are_refused(tmp_path: Path, variant: str, changes: dict, message: str):
    with pytest.raises(resid.ResidError, match=message):
        resid.load(_folder_with(tmp_path, variant, **changes))
