"""tokenizer_from_gguf against SmolLM2's own Hugging Face tokenizer.json: same ids on varied text, exact
decode round-trips, no BOS added, and clear errors for vocabularies resid cannot reproduce."""

from pathlib import Path

import pytest
import tokenizers

from resid.errors import ResidError
from resid.load.gguf_format import GGUFFile
from resid.load.gguf_vocab import tokenizer_from_gguf

REFERENCE_TOKENIZER = Path(__file__).resolve().parents[1] / "data" / "smollm2-135m" / "tokenizer.json"
EIFFEL = "The Eiffel Tower is located in the city of"

TEXTS = [
    EIFFEL,
    "hello world",
    "  leading spaces",
    "trailing spaces   ",
    "   ",
    "12345 678 3.14159 1,000,000",
    "Hello, world!!! What?! (yes) [no] {maybe} ... --- ;:'\"",
    "line one\nline two\n\n\tindented\ttabs\r\nwindows",
    "don't I'll we've they're she'd it's",
    "café naïve résumé Ångström Straße",
    "emoji 😀🎉👍🏽 and flags 🇫🇷",
    "中文字符 日本語のテキスト 한국어",
    "def f(x):\n    return x ** 2  # square\n",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><repo_name>resid<file_sep>x",
    "a<|im_end|>b",
    "",
]


@pytest.fixture(scope="module")
def ours(smollm2_gguf: GGUFFile) -> tokenizers.Tokenizer:
    return tokenizer_from_gguf(smollm2_gguf.metadata)


@pytest.fixture(scope="module")
def reference() -> tokenizers.Tokenizer:
    return tokenizers.Tokenizer.from_file(str(REFERENCE_TOKENIZER))


@pytest.mark.parametrize("text", TEXTS)
def test_ids_equal_reference_and_decode_round_trips(
    ours: tokenizers.Tokenizer, reference: tokenizers.Tokenizer, text: str
) -> None:
    ids = ours.encode(text, add_special_tokens=False).ids
    assert ids == reference.encode(text, add_special_tokens=False).ids
    assert ours.decode(ids, skip_special_tokens=False) == text


def test_eiffel_ids_and_no_bos(ours: tokenizers.Tokenizer) -> None:
    expected = [504, 414, 46682, 18669, 314, 3807, 281, 260, 2240, 282]
    assert ours.encode(EIFFEL, add_special_tokens=False).ids == expected
    # resid adds BOS by its own policy: the tokenizer must never add it, even when asked for special tokens.
    assert ours.encode(EIFFEL, add_special_tokens=True).ids == expected
    assert ours.post_processor is None


def test_special_tokens(ours: tokenizers.Tokenizer, reference: tokenizers.Tokenizer) -> None:
    assert ours.encode("<|im_start|>", add_special_tokens=False).ids == [1]
    assert ours.decode([1, 28120, 2], skip_special_tokens=True) == reference.decode([1, 28120, 2])
    ours_added = {i: (t.content, t.special) for i, t in ours.get_added_tokens_decoder().items()}
    ref_added = {i: (t.content, t.special) for i, t in reference.get_added_tokens_decoder().items()}
    assert ours_added == ref_added
    assert ours.get_vocab() == reference.get_vocab()


@pytest.mark.parametrize("pre", ["gpt-2", "default", None])
def test_gpt2_style_pre_tokenizers(smollm2_gguf: GGUFFile, ours: tokenizers.Tokenizer, pre: str | None) -> None:
    metadata = dict(smollm2_gguf.metadata)
    if pre is None:
        del metadata["tokenizer.ggml.pre"]
    else:
        metadata["tokenizer.ggml.pre"] = pre
    other = tokenizer_from_gguf(metadata)
    for text in TEXTS:
        assert other.encode(text, add_special_tokens=False).ids == ours.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("tokenizer.ggml.model", "bert", "tokenizer model 'bert' is not supported"),
        ("tokenizer.ggml.model", "llama", "'llama' \\(SentencePiece\\) is supported for Gemma 3 files only"),
        ("tokenizer.ggml.pre", "deepseek-llm", "pre-tokenizer 'deepseek-llm' is not supported"),
        ("tokenizer.ggml.tokens", None, "'tokenizer.ggml.tokens' is NoneType, expected a list of strings"),
        ("tokenizer.ggml.merges", ["Ġt"], "merge 'Ġt' is not two tokens"),
        ("tokenizer.ggml.merges", ["Ġ nosuchtoken"], "does not form a valid BPE model"),
        ("tokenizer.ggml.token_type", [1, 3], "one entry per token"),
    ],
)
def test_bad_vocabularies(smollm2_gguf: GGUFFile, key: str, value: object, message: str) -> None:
    metadata = dict(smollm2_gguf.metadata)
    metadata[key] = value
    with pytest.raises(ResidError, match=message):
        tokenizer_from_gguf(metadata)


# Llama 3's pre-tokenizer as its tokenizer.json states it: this regex, then bytes, and "ignore_merges": true.
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)


def _llama3_reference(tokens: list[str], merges: list[str]) -> tokenizers.Tokenizer:
    bpe = tokenizers.models.BPE(
        vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split(" ")) for m in merges], ignore_merges=True
    )
    reference = tokenizers.Tokenizer(bpe)
    reference.pre_tokenizer = tokenizers.pre_tokenizers.Sequence([
        tokenizers.pre_tokenizers.Split(tokenizers.Regex(LLAMA3_REGEX), behavior="isolated"),
        tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    return reference


def test_llama3_pre_tokenizer(smollm2_gguf: GGUFFile, ours: tokenizers.Tokenizer) -> None:
    """llama-bpe (Llama 3): digits in runs of at most three, and a word that is itself a token is that token
    even where the merges would not build it (ignore_merges). A token no merge reaches is added to show it."""
    metadata = dict(smollm2_gguf.metadata)
    metadata["tokenizer.ggml.pre"] = "llama-bpe"
    tokens = [*metadata["tokenizer.ggml.tokens"], "Ġxyzzyq"]
    metadata["tokenizer.ggml.tokens"] = tokens
    metadata["tokenizer.ggml.token_type"] = [*metadata["tokenizer.ggml.token_type"], 1]
    llama3 = tokenizer_from_gguf(metadata)
    reference = _llama3_reference(tokens, metadata["tokenizer.ggml.merges"])
    plain = [text for text in TEXTS if "<" not in text]  # the reference has no special tokens added
    for text in [*plain, "plugh xyzzyq 1234567"]:
        assert llama3.encode(text, add_special_tokens=False).ids == reference.encode(text, add_special_tokens=False).ids
    assert llama3.encode(" xyzzyq", add_special_tokens=False).ids == [len(tokens) - 1]
    assert len(ours.encode(" xyzzyq", add_special_tokens=False).ids) > 1  # gpt-2 style: merges only
    assert [piece for piece, _ in llama3.pre_tokenizer.pre_tokenize_str("1234567")] == ["123", "456", "7"]
