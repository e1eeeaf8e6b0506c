"""Writing a dictionary in SAELens format and reading it back gives the same dictionary (every fixture SAELens
can express; tests/data/make_dictionary_reference.py --saelens-reads checks that SAELens reads it too)."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import resid
import resid.dictionaries
from resid.dictionaries import Dictionary
from resid.dictionaries.formats import saelens

DATA = Path(__file__).resolve().parents[1] / "data" / "dictionaries"
MANIFEST = json.loads((DATA / "manifest.json").read_text())["fixtures"]
# SAELens has no top-k transcoder, and its JumpReLU applies relu first (circuit-tracer's negative thresholds)
NOT_EXPRESSIBLE = {"sparsify/layers.0.mlp": "activation='topk'", "circuit_tracer/plt": "negative thresholds",
                   "circuit_tracer/plt_gemma_scope": "negative thresholds",
                   "circuit_tracer/clt": "not a CrossLayerTranscoder"}


def load(name: str):
    entry = MANIFEST[name]
    factor = 2.5 if name.endswith("expected_average") else None
    return resid.dictionaries.load(DATA / entry["folder"], hook=entry.get("hook"), norm_scaling_factor=factor)


@pytest.mark.parametrize("name", sorted(set(MANIFEST) - set(NOT_EXPRESSIBLE)))
def test_write_then_read_is_the_same_dictionary(name: str, tmp_path: Path) -> None:
    original = load(name)
    back = resid.dictionaries.load(saelens.write(original, tmp_path / "sae"))
    assert back.format == "saelens"
    for field in ("activation", "k", "d_in", "d_out", "d_sae", "apply_b_dec_to_input", "normalize_activations",
                  "hook_in", "hook_out", "model_name", "is_transcoder"):
        assert getattr(back, field) == getattr(original, field), field
    for field in ("W_enc", "b_enc", "W_dec", "b_dec", "threshold", "b_gate", "b_mag", "r_mag", "W_skip"):
        a, b = getattr(original, field), getattr(back, field)
        assert (a is None) == (b is None), field
        assert a is None or torch.equal(a, b), field
    x = load_file(str(DATA / MANIFEST[name]["reference"]))["x"]
    for a, b in zip(original(x), back(x), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", sorted(NOT_EXPRESSIBLE))
def test_what_saelens_cannot_express_is_refused(name: str, tmp_path: Path) -> None:
    loaded = load(name)
    dictionary = loaded[0] if isinstance(loaded, list) else loaded
    with pytest.raises(resid.ResidError, match=NOT_EXPRESSIBLE[name].replace("(", r"\(")):
        saelens.write(dictionary, tmp_path / "sae")
    assert not (tmp_path / "sae" / "cfg.json").exists()


def test_a_written_dictionary_has_sae_lens_6_fields(tmp_path: Path) -> None:
    written = saelens.write(load("gemma_scope_2/transcoder"), tmp_path / "sae")
    cfg = json.loads((written / "cfg.json").read_text())
    assert cfg["architecture"] == "jumprelu_skip_transcoder" and cfg["d_out"] == 48
    assert cfg["metadata"]["hf_hook_name"] == "model.layers.0.pre_feedforward_layernorm.output"
    assert cfg["metadata"]["sae_lens_version"].startswith("6.")
    assert isinstance(load("saelens/standard"), Dictionary)
