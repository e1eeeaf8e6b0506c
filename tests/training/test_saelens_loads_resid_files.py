"""SAELens reads what resid's trainer writes: dictionaries trained by resid.analyses.training and saved in SAELens's
format encode and decode, in resid, as SAELens's own SAE.load_from_disk computes them (SAELens's outputs are
committed in tests/data/saelens-training/, made by tests/data/make_saelens_training_reference.py); and those
folders are what resid trains and writes today, so that a change to the trainer's export or to the SAELens writer
fails here until the oracle is regenerated (and SAELens is asked again)."""

import importlib.util
import json
import struct
from pathlib import Path

import pytest
import torch
from numerics import EXACT, TINY
from safetensors.torch import load_file

import resid.dictionaries
from resid.dictionaries.formats import saelens

DATA = Path(__file__).resolve().parents[1] / "data" / "saelens-training"
SCRIPT = DATA.parent / "make_saelens_training_reference.py"
MANIFEST = json.loads((DATA / "manifest.json").read_text())
REGENERATE = f"regenerate with `.venv/bin/python {SCRIPT.relative_to(DATA.parents[2])}` (it asks SAELens again)"
ACTIVATION = {"topk": "topk", "jumprelu": "jumprelu", "standard": "relu", "jumprelu_skip_transcoder": "jumprelu"}


def _script():
    spec = importlib.util.spec_from_file_location("make_saelens_training_reference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_oracle_covers_every_fixture() -> None:
    assert set(MANIFEST["fixtures"]) == set(_script().FIXTURES)
    assert MANIFEST["versions"]["sae-lens"] == "6.54.12"


@pytest.mark.parametrize("name", sorted(MANIFEST["fixtures"]))
def test_resid_encodes_and_decodes_as_saelens(name: str) -> None:
    dictionary = resid.dictionaries.load(DATA / name)
    architecture = MANIFEST["fixtures"][name]["architecture"]
    assert dictionary.activation == ACTIVATION[architecture]
    assert dictionary.is_transcoder == architecture.endswith("transcoder")
    x = load_file(str(DATA / "inputs.safetensors"))["x"]
    expected = load_file(str(DATA / f"{name}.saelens.safetensors"))
    acts, out = dictionary(x)
    torch.testing.assert_close(acts, expected["acts"], **EXACT)
    torch.testing.assert_close(out, expected["out"], **EXACT)
    assert int((acts > 0).sum()) > 0 and bool((acts == 0).any())  # neither all nor none of the features fire


def _header(path: Path) -> bytes:
    """A safetensors file's JSON header: tensor names, dtypes, shapes and offsets, in the written order."""
    data = path.read_bytes()
    return data[8:8 + struct.unpack("<Q", data[:8])[0]]


@pytest.mark.parametrize("name", sorted(MANIFEST["fixtures"]))
def test_the_committed_folders_are_what_resid_trains_and_writes_today(name: str, tmp_path: Path) -> None:
    script = _script()
    written = saelens.write(script.export(script.train_fixture(name), name), tmp_path / name)
    committed = DATA / name
    assert (written / saelens.CONFIG).read_text() == (committed / saelens.CONFIG).read_text(), \
        f"resid's SAELens cfg.json changed: {REGENERATE}"
    assert _header(written / saelens.WEIGHTS) == _header(committed / saelens.WEIGHTS), \
        f"resid's SAELens tensors changed in name, dtype or shape: {REGENERATE}"
    new, old = load_file(str(written / saelens.WEIGHTS)), load_file(str(committed / saelens.WEIGHTS))
    for key in old:  # training rounds alike on one thread; TINY allows another CPU's kernels
        torch.testing.assert_close(new[key], old[key], **TINY, msg=lambda m, key=key: f"{key}: {m}; {REGENERATE}")
