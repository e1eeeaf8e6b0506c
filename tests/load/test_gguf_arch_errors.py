"""Bad GGUF input gives one clear ResidError: an unknown architecture (naming the supported ones), a missing or
unexpected tensor (naming it), unsupported rope scaling or vocabulary. Also: the tokenizers resid builds from a small
Gemma-style SentencePiece vocabulary, and from byte-level ones with GPT-2's and Qwen2's splits, equal
transformers' tokenizers from the same GGUF."""

import dataclasses

import gguf
import numpy as np
import pytest
import transformers
from test_gguf_arch import build, build_hf, write_gguf

import resid
from resid.errors import ResidError
from resid.load.gguf_arch import hf_config
from resid.load.gguf_format import read_gguf
from resid.load.gguf_vocab import tokenizer_from_gguf


def test_unknown_architecture_names_the_supported_ones(tmp_path) -> None:
    writer = gguf.GGUFWriter(tmp_path / "falcon.gguf", "falcon")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ResidError, match="architecture 'falcon'.*'llama', 'qwen2', 'qwen3', 'gemma3'"):
        resid.load(tmp_path / "falcon.gguf")


MISSING = [
    ("qwen3", "blk.1.attn_k_norm.weight"), ("gemma3", "blk.5.post_ffw_norm.weight"), ("llama", "blk.0.attn_v.bias"),
]


@pytest.mark.parametrize(("variant", "missing"), MISSING)
def test_missing_tensor_is_named(tmp_path, variant: str, missing: str) -> None:
    path = write_gguf(build_hf(variant), variant, tmp_path / "incomplete.gguf", skip=(missing,))
    with pytest.raises(ResidError, match=f"has no tensor '{missing}'"):
        resid.load(path)


def test_unexpected_tensor_is_named(tmp_path) -> None:
    extra = {"blk.0.attn_q_norm.weight": np.ones(12, dtype=np.float32)}  # a Qwen3 tensor in a Qwen2 file
    path = write_gguf(build_hf("qwen2"), "qwen2", tmp_path / "extra.gguf", extra=extra)
    with pytest.raises(ResidError, match="blk.0.attn_q_norm.weight"):
        resid.load(path)


def test_unsupported_rope_scaling(tmp_path) -> None:
    _, path = build("qwen2", tmp_path)
    file = read_gguf(path)
    yarn = dataclasses.replace(file, metadata={**file.metadata, "qwen2.rope.scaling.type": "yarn"})
    with pytest.raises(ResidError, match="rope scaling 'yarn'"):
        hf_config(yarn)


def test_sentencepiece_vocabulary_outside_gemma3_is_refused(tmp_path) -> None:
    _, path = build("gemma3", tmp_path)
    metadata = dict(read_gguf(path).metadata, **{"general.architecture": "llama"})
    with pytest.raises(ResidError, match="supported for Gemma 3 files only"):
        tokenizer_from_gguf(metadata)


TEXTS = [
    "the cat is on the mat", "  the   capital\n\nof France", "café 12 3 é", "<start_of_turn>hello world<end_of_turn>",
    "▁▁ spaced▁", "zzz qqq \x00\t", "[multimodal] in an at", "",
]


def test_sentencepiece_tokenizer_equals_transformers(tmp_path) -> None:
    _, path = build("gemma3", tmp_path)
    ours = tokenizer_from_gguf(read_gguf(path).metadata)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    for text in TEXTS:
        assert ours.encode(text, add_special_tokens=False).ids == theirs(text, add_special_tokens=False)["input_ids"]
    assert resid.load(path).tokenizer.encode("the cat") == theirs("the cat")["input_ids"]  # BOS prepended


@pytest.mark.slow  # transformers' GGUF tokenizer conversion (4-5 s each)
@pytest.mark.parametrize("pre", ["qwen2", "gpt-2"])
def test_byte_level_splits_equal_transformers(tmp_path, pre: str) -> None:
    path = write_gguf(build_hf("qwen2"), "qwen2", tmp_path / "tok.gguf", pre=pre)
    ours = tokenizer_from_gguf(read_gguf(path).metadata)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    texts = TEXTS + ["12345 678 3.14159", "don't I'll\r\n\n  x", "café 😀 中文字符 한국어", "a\n\n\tb   c"]
    for text in texts:
        assert ours.encode(text, add_special_tokens=False).ids == theirs(text, add_special_tokens=False)["input_ids"]
