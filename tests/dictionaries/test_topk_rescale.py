"""SAELens TopK SAEs saved with rescale_acts_by_decoder_norm=True: read and computed as SAELens computes them, both
as trained (decoder norms not 1) and after SAELens's fold_W_dec_norm (flag still set, norms 1). The fixtures and
SAELens's own outputs are in tests/data/dictionaries/saelens/topk_rescaled*, written by
tests/data/make_dictionary_reference.py (sae-lens 6.54.12); tests/dictionaries/test_reference.py compares them with
every other fixture at the same tolerance."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import resid
import resid.dictionaries

DATA = Path(__file__).resolve().parents[1] / "data" / "dictionaries" / "saelens"
TOLERANCE = dict(rtol=1e-6, atol=1e-6)  # float32 reduction-order noise for 48 inputs and 16 features is ~1e-7


@pytest.mark.parametrize("name", ["topk_rescaled", "topk_rescaled_folded"])
def test_rescaled_topk_equals_saelens(name: str) -> None:
    assert json.loads((DATA / name / "cfg.json").read_text())["rescale_acts_by_decoder_norm"] is True
    reference = load_file(str(DATA / f"{name}.reference.safetensors"))
    sae = resid.dictionaries.load(DATA / name)
    acts, out = sae(reference["x"])
    torch.testing.assert_close(acts, reference["acts"], **TOLERANCE)
    torch.testing.assert_close(out, reference["out"], **TOLERANCE)
    assert bool(((acts != 0).sum(-1) == 4).all())  # k = 4 of 16 features: the selection is what is tested


def test_the_fixture_needs_the_rescaling_and_folding_in_saelens_changes_nothing(tmp_path) -> None:
    norms = load_file(str(DATA / "topk_rescaled" / "sae_weights.safetensors"))["W_dec"].norm(dim=-1)
    folded = load_file(str(DATA / "topk_rescaled_folded" / "sae_weights.safetensors"))["W_dec"].norm(dim=-1)
    assert float((norms - 1).abs().min()) > 0.1  # as trained, far from unit norms
    torch.testing.assert_close(folded, torch.ones_like(folded), **TOLERANCE)
    as_saved = load_file(str(DATA / "topk_rescaled.reference.safetensors"))
    after_fold = load_file(str(DATA / "topk_rescaled_folded.reference.safetensors"))
    for key in ("acts", "out"):  # SAELens's own outputs before and after its fold (float32 rounding apart)
        torch.testing.assert_close(after_fold[key], as_saved[key], rtol=1e-5, atol=1e-5)
    ignored = shutil.copytree(DATA / "topk_rescaled", tmp_path / "flag_ignored")
    cfg = json.loads((ignored / "cfg.json").read_text())
    (ignored / "cfg.json").write_text(json.dumps({**cfg, "rescale_acts_by_decoder_norm": False}))
    acts, _ = resid.dictionaries.load(ignored)(as_saved["x"])
    assert float((acts.detach() - as_saved["acts"]).abs().max()) > 1e-2  # without the rescaling the numbers differ


def test_a_zero_decoder_row_with_the_flag_is_refused_by_tensor(tmp_path) -> None:
    folder = shutil.copytree(DATA / "topk_rescaled", tmp_path / "sae")
    weights = load_file(str(folder / "sae_weights.safetensors"))
    weights["W_dec"][3] = 0
    save_file(weights, str(folder / "sae_weights.safetensors"))
    with pytest.raises(resid.ResidError, match=r"sae_weights.safetensors: rescale_acts_by_decoder_norm=True, but "
                                               r"W_dec rows \[3\] are zero"):
        resid.dictionaries.load(folder)
