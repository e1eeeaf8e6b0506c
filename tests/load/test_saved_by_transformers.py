"""Folders written by transformers' save_pretrained load for every family resid reads (issue 27, finding 7),
including the special-token ids a converted checkpoint carries: transformers writes `unk_token_id` for a model
loaded from a GGUF file, and any `*_token_id` is read by the tokenizer or by generation, never by the forward
pass. The loaded model is the model of the folder without those fields: the same config and the same weights."""

import copy
import shutil
from pathlib import Path

import encoder_models
import pytest
import seq2seq_models
import torch
from tiny_fixtures import Tiny

import resid

# As transformers names them (a GGUF's tokenizer gives unk_token_id; BERT-like tokenizers cls and mask).
TOKEN_IDS = {"unk_token_id": 0, "cls_token_id": 1, "mask_token_id": 2}


def _resave(hf, folder: Path, original: Path) -> Path:
    """`hf` saved again by transformers with the token-id fields set, beside the original's tokenizer."""
    hf = copy.deepcopy(hf)
    for field, value in TOKEN_IDS.items():
        setattr(hf.config, field, value)
    hf.save_pretrained(folder, safe_serialization=True)
    if (original / "tokenizer.json").exists():
        shutil.copy(original / "tokenizer.json", folder / "tokenizer.json")
    assert '"unk_token_id": 0' in (folder / "config.json").read_text()  # transformers wrote the field
    return folder


def _same_model(loaded, reference) -> None:
    assert type(loaded) is type(reference)
    ours, theirs = loaded.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    for name, value in ours.items():
        assert torch.equal(value, theirs[name]), name


def test_every_decoder_family(tiny: Tiny, tmp_path: Path):
    loaded = resid.load(_resave(tiny.hf, tmp_path / "saved", tiny.folder))
    assert loaded.config == tiny.model.config
    _same_model(loaded, tiny.model)


@pytest.mark.parametrize("variant", encoder_models.VARIANTS)
def test_bert(variant: str, tmp_path: Path):
    hf = encoder_models.build(variant, tmp_path / "original")
    _same_model(resid.load(_resave(hf, tmp_path / "saved", tmp_path / "original")), resid.load(tmp_path / "original"))


def test_marian(tmp_path: Path):
    hf = seq2seq_models.marian(tmp_path / "original")
    loaded = resid.load(_resave(hf, tmp_path / "saved", tmp_path / "original"))
    _same_model(loaded, resid.load(tmp_path / "original"))


@pytest.mark.parametrize("field, value", [("unk_token_id", "<unk>"), ("mask_token_id", 1.5), ("hidden_token", 3)])
def test_only_token_ids_pass(tmp_path: Path, field: str, value: object):
    # The rule is for ids: a field of that name holding something else, or another name, is still refused.
    encoder_models.build("bert_base", tmp_path)
    config = (tmp_path / "config.json").read_text().replace('"model_type"', f'"{field}": {value!r},\n  "model_type"')
    (tmp_path / "config.json").write_text(config.replace("'", '"'))
    with pytest.raises(resid.ResidError, match=f"{field}="):
        resid.load(tmp_path)
