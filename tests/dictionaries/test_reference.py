"""Encode / decode equal each reference library's on the same inputs (float32, 1e-6), for every format and
activation function: the fixtures and outputs in tests/data/dictionaries, written by
tests/data/make_dictionary_reference.py with SAELens, sparsify and circuit-tracer (none of them installed here)."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import resid.dictionaries
from resid.dictionaries import CrossLayerTranscoder, Dictionary

DATA = Path(__file__).resolve().parents[1] / "data" / "dictionaries"
MANIFEST = json.loads((DATA / "manifest.json").read_text())["fixtures"]
# Above float32 reduction-order noise for these widths (48 inputs, 16 features), far below any real difference
TOLERANCE = dict(rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_encode_decode_equal_the_reference_library(name: str) -> None:
    entry = MANIFEST[name]
    reference = load_file(str(DATA / entry["reference"]))
    x, acts, out = reference["x"], reference["acts"], reference["out"]
    factor = float(reference["norm_scaling_factor"]) if "norm_scaling_factor" in reference else None
    loaded = resid.dictionaries.load(DATA / entry["folder"], hook=entry.get("hook"), norm_scaling_factor=factor)
    assert resid.dictionaries.detect(DATA / entry["folder"]) == entry["format"]
    if isinstance(loaded, list):  # a per-layer set: x, acts and out are [layer N ...]
        assert len(loaded) == x.shape[0]
        for layer, dictionary in enumerate(loaded):
            assert dictionary.hook_in.startswith(f"blocks.{layer}.")
            _compare(dictionary, x[layer], acts[layer], out[layer])
    elif isinstance(loaded, CrossLayerTranscoder):
        found_acts, found_out = loaded(x)
        torch.testing.assert_close(found_acts, acts, **TOLERANCE)
        torch.testing.assert_close(found_out, out, **TOLERANCE)
        torch.testing.assert_close(loaded.decode(acts), out, **TOLERANCE)
    else:
        _compare(loaded, x, acts, out)
    assert (acts != 0).any() and (acts == 0).any(), "a fixture whose features are all on or all off tests little"


def _compare(dictionary: Dictionary, x: torch.Tensor, acts: torch.Tensor, out: torch.Tensor) -> None:
    found_acts, found_out = dictionary(x)
    torch.testing.assert_close(found_acts, acts, **TOLERANCE)
    torch.testing.assert_close(found_out, out, **TOLERANCE)
    torch.testing.assert_close(dictionary.decode(acts, x), out, **TOLERANCE)


def test_every_format_and_activation_is_covered() -> None:
    formats = {entry["format"] for entry in MANIFEST.values()}
    assert formats == {"saelens", "gemma_scope", "sparsify", "circuit_tracer"}
    activations = set()
    for entry in MANIFEST.values():
        loaded = resid.dictionaries.load(DATA / entry["folder"], hook=entry.get("hook"), norm_scaling_factor=2.5
                                         if entry["folder"].endswith("expected_average") else None)
        for dictionary in loaded if isinstance(loaded, list) else [loaded]:
            activations.add(dictionary.activation)
            if isinstance(dictionary, Dictionary) and dictionary.W_skip is not None:
                activations.add("skip")
    assert activations == {"relu", "jumprelu", "topk", "gated", "skip"}


def test_bfloat16_inputs_are_computed_in_float32_and_returned_as_bfloat16() -> None:
    sae = resid.dictionaries.load(DATA / "saelens" / "standard")
    x = load_file(str(DATA / "saelens" / "standard.reference.safetensors"))["x"]
    acts, out = sae(x.bfloat16())
    assert acts.dtype == out.dtype == torch.bfloat16
    torch.testing.assert_close(acts.float(), sae.encode(x.bfloat16().float()), rtol=1e-2, atol=1e-2)
