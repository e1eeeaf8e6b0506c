"""The tokenizer resid builds from the Gemma 3 GGUF vocabulary gives the ids transformers' tokenizer (built from
the same file) gives, on varied text: spaces, newlines, unicode, digits, bytes and special tokens. The expected
ids are in tests/data/gemma3-270m/reference_outputs.json (make_reference.py)."""

import json
from pathlib import Path

import pytest
import tokenizers

from resid.load.gguf_format import read_gguf
from resid.load.gguf_packages import gemma3_270m_path
from resid.load.gguf_vocab import tokenizer_from_gguf

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "gemma3-270m" / "reference_outputs.json"
CASES = json.loads(REFERENCE.read_text())["tokenizer"]


@pytest.fixture(scope="module")
def ours() -> tokenizers.Tokenizer:
    return tokenizer_from_gguf(read_gguf(gemma3_270m_path()).metadata)


def test_cases_are_varied() -> None:
    texts = "".join(case["text"] for case in CASES)
    for needed in ["  ", "\n\n", "\t", "é", "😀", "中", "123", "<start_of_turn>", "<bos>", "\x00"]:
        assert needed in texts


@pytest.mark.parametrize("case", CASES, ids=[repr(c["text"][:25]) for c in CASES])
def test_ids_equal_transformers(ours: tokenizers.Tokenizer, case: dict) -> None:
    assert ours.encode(case["text"], add_special_tokens=False).ids == case["ids"]


def test_special_tokens_and_no_bos(ours: tokenizers.Tokenizer) -> None:
    assert ours.encode("<start_of_turn>", add_special_tokens=True).ids == [105]  # never adds BOS itself
    assert ours.post_processor is None
    added = ours.get_added_tokens_decoder()
    assert added[2].content == "<bos>" and added[2].special
    assert added[5].content == "[multimodal]" and not added[5].special  # user-defined: plain added token
    assert ours.get_vocab_size(with_added_tokens=True) == 262144


def test_decode_round_trips(ours: tokenizers.Tokenizer) -> None:
    for text in ["The capital of France is", "  two spaces\nand a line", "café 😀 中文 \x00"]:
        assert ours.decode(ours.encode(text, add_special_tokens=False).ids, skip_special_tokens=False) == text
