"""--source: predict, decompose, attribute, lens and info on a tiny random Marian folder (with a word-level
tokenizer.json), checked against the Python API and Hugging Face's MarianMTModel; and the one error for a missing
--source on an encoder-decoder model or a --source given to a decoder-only one."""

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import tokenizers
import torch
from seq2seq_models import PAD, marian
from tiny_models import build

import resid
from resid.analyses import attribution, logit_lens, tables
from resid.analyses.cli.main import main

SOURCE, PREFIX = "w3 w17 w40 w8", "w5 w9"
SOURCE_IDS, PREFIX_IDS = [3, 17, 40, 8, 0], [PAD, 5, 9]  # the source ends with </s> (0); the prefix starts with pad


def _tokenizer() -> tokenizers.Tokenizer:
    # Marian's ids: </s> = 0, pad (the decoder start token) = 59; the other ids are words "w<id>".
    vocab = {"</s>": 0, "<unk>": 1, **{f"w{i}": i for i in range(2, PAD)}, "<pad>": PAD}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return tok


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("marian_cli")
    marian(folder)
    _tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "pad_token": "<pad>"}))
    return folder


@pytest.fixture(scope="module")
def model(folder):
    return resid.load(folder)


def _ids(ids: list[int]) -> torch.Tensor:
    return torch.tensor([ids])


def _hf_logits(folder: Path, decoder_ids: list[int]) -> torch.Tensor:
    import transformers

    hf = transformers.MarianMTModel.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        return hf(input_ids=_ids(SOURCE_IDS), decoder_input_ids=_ids(decoder_ids)).logits[0, -1]


@pytest.mark.parametrize("prefix,decoder_ids", [(PREFIX, PREFIX_IDS), ("", [PAD])])
def test_predict_top_token_is_the_models_and_hugging_faces(folder, model, prefix, decoder_ids, capsys):
    assert main(["predict", prefix, "--source", SOURCE, "--model", str(folder), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "source: 5 tokens ['w3', 'w17', 'w40', 'w8', '</s>']" in out.splitlines()[0]
    first = out.splitlines()[2].split()  # rank prob id token
    ours = model.run(_ids(SOURCE_IDS), _ids(decoder_ids)).logits[0, -1]
    assert int(first[2]) == int(ours.argmax()) == int(_hf_logits(folder, decoder_ids).argmax())
    assert abs(float(first[1]) - torch.softmax(ours, -1).max().item()) < 1e-4


def test_decompose_prints_and_writes_the_decoders_decomposition(folder, model, tmp_path, capsys):
    assert main(["decompose", PREFIX, "--source", SOURCE, "--model", str(folder), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    total, actual = map(float, re.search(r"components = (\S+); model logit\(.*\) = (\S+);", out).groups())
    expected = attribution.direct(model, _ids(PREFIX_IDS), source=_ids(SOURCE_IDS), level="head")
    assert abs(total - actual) < 1e-4 and abs(actual - expected["logit"].iloc[0]) < 1e-4
    written = tables.read(tmp_path / "attribution.csv")
    assert written["site"].str.contains(r"\.cross\b").any()  # cross-attention heads are rows
    pd.testing.assert_series_equal(written["value"], expected["value"], check_exact=False, rtol=0, atol=1e-5)
    assert list(written["site"]) == list(expected["site"])


def test_attribute_table_equals_attribution_direct(folder, model, tmp_path, capsys):
    out = tmp_path / "table.csv"
    args = ["attribute", PREFIX, "--source", SOURCE, "--model", str(folder), "--target", "w7", "--level", "sublayer"]
    assert main([*args, "--out", str(out)]) == 0
    written = tables.read(out)
    expected = attribution.direct(model, _ids(PREFIX_IDS), targets=7, source=_ids(SOURCE_IDS), level="sublayer")
    assert list(written["site"]) == list(expected["site"]) and "layers[0].cross" in set(written["site"])
    pd.testing.assert_series_equal(written["value"], expected["value"], check_exact=False, rtol=0, atol=1e-5)
    assert abs(written["value"].sum() - written["logit"].iloc[0]) < 1e-4


def test_lens_table_equals_logit_lens(folder, model, tmp_path, capsys):
    out = tmp_path / "lens.csv"
    assert main(["lens", PREFIX, "--source", SOURCE, "--model", str(folder), "--positions", "all",
                 "--out", str(out)]) == 0
    written = tables.read(out)
    expected = logit_lens.run(model, _ids(PREFIX_IDS), source=_ids(SOURCE_IDS), positions="all", k=5,
                               every="layer")
    assert list(written["token_id"]) == list(expected["token_id"])
    pd.testing.assert_series_equal(written["prob"], expected["prob"], check_exact=False, rtol=0, atol=1e-5)


def test_info_shows_both_stacks(folder, model, capsys):
    assert main(["info", "--model", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "encoder (reads the source):" in out and "decoder (reads the target prefix + the source):" in out
    layers = re.findall(r"^  n_layers\s+(\d+)$", out, re.MULTILINE)
    assert layers == [str(model.encoder.config.n_layers), str(model.decoder.config.n_layers)] == ["2", "3"]


@pytest.mark.parametrize("command", ["predict", "decompose", "attribute", "lens"])
def test_encoder_decoder_without_source_says_to_give_it(folder, command, capsys):
    assert main([command, PREFIX, "--model", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("resid: error: ") and "encoder-decoder model: give the text to translate with --source" in err
    assert len(err.splitlines()) == 1


def test_source_on_a_decoder_only_model_is_refused(tmp_path, capsys):
    build("llama", tmp_path)
    for command in ("predict", "decompose", "attribute", "lens"):
        assert main([command, "Hello world", "--source", "Hallo Welt", "--model", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("resid: error: --source is for encoder-decoder models") and "decoder-only" in err


def test_source_with_a_prompts_file_is_refused(folder, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "w5"}\n')
    assert main(["attribute", "--prompts", str(prompts), "--source", SOURCE, "--model", str(folder)]) == 2
    assert "--source goes with one prompt" in capsys.readouterr().err


def test_prompts_file_on_an_encoder_decoder_model_says_to_use_one_prefix(folder, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "w5"}\n')
    assert main(["attribute", "--prompts", str(prompts), "--model", str(folder)]) == 2
    assert "attribute one target prefix with --source TEXT" in capsys.readouterr().err


def test_the_target_prefix_starts_with_the_decoder_start_token_config_json_gives(model, monkeypatch) -> None:
    from resid.analyses.cli.sources import split

    assert split(model, PREFIX, SOURCE)[0].tolist() == [PREFIX_IDS]  # Marian's start token is its pad token
    monkeypatch.setattr(model, "decoder_start_token_id", 7)  # a model whose start token is not its pad token
    target, source = split(model, PREFIX, SOURCE)
    assert target.tolist() == [[7, 5, 9]] and source.tolist() == [SOURCE_IDS]
