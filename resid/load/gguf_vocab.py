"""Build a Hugging Face `tokenizers.Tokenizer` from the vocabulary stored in GGUF metadata.

Glossary (GGUF keys under `tokenizer.ggml.`):
    model       the tokenizer algorithm: "gpt2" (byte-level BPE, built here: SmolLM, Qwen) or "llama"
                (SentencePiece-style BPE with byte fallback, built in gguf_vocab_spm.py: Gemma 3).
    pre         the pre-tokenizer llama.cpp applies before BPE (how text is split into words); it decides the
                ids as much as the merges do, so an unknown value is an error, never a guess.
    tokens      token strings by id, in the byte-to-unicode alphabet of GPT-2 ("Ġ" is a space).
    merges      BPE merges in priority order, each "left right" separated by one space.
    token_type  llama.cpp's per-token kind: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.

The tokenizer has no post-processor: it never adds BOS/EOS, because resid adds BOS itself by an explicit policy.
"""

from collections.abc import Callable

import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers

from resid.errors import ResidError
from resid.load.gguf_vocab_spm import spm_tokenizer

_CONTROL = 3
_USER_DEFINED = 4


def _gpt2_byte_level() -> pre_tokenizers.PreTokenizer:
    # GPT-2's split (contractions, letters, digits, punctuation, whitespace runs), then bytes -> unicode.
    # SmolLM2's tokenizer.json uses exactly this: ByteLevel(add_prefix_space=False, use_regex=True).
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _split_then_bytes(pattern: str) -> Callable[[], pre_tokenizers.PreTokenizer]:
    # The model's own split regex, then bytes -> unicode without GPT-2's regex (what the models'
    # tokenizer.json files and transformers' GGUF tokenizer both do).
    def make() -> pre_tokenizers.PreTokenizer:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(tokenizers.Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])

    return make


# Qwen2's split (also Qwen3's): single digits, letters with one leading non-letter, newline runs. As llama.cpp
# and transformers' GGUF tokenizer do, no NFC normalization (Qwen's tokenizer.json has one: text that is not in
# NFC, e.g. a decomposed "é", can tokenize differently there).
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Llama 3's ("llama-bpe"): Qwen2's with digits in runs of up to three. Its BPE also skips the merges for a word
# that is itself a token (llama.cpp's ignore_merges for LLAMA3, `"ignore_merges": true` in Llama 3's
# tokenizer.json; transformers' GGUF tokenizer omits it, so it is not the oracle here).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_IGNORE_MERGES = {"llama-bpe"}


# `tokenizer.ggml.pre` -> the pre-tokenizer Hugging Face uses for models llama.cpp labels that way.
# llama.cpp treats "smollm" like "gpt-2" for splitting (it differs only in not cleaning spaces on decode,
# which `tokenizers` never does either).
_PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "default": _gpt2_byte_level,
    "gpt-2": _gpt2_byte_level,
    "smollm": _gpt2_byte_level,
    "qwen2": _split_then_bytes(_QWEN2_SPLIT),
    "llama-bpe": _split_then_bytes(_LLAMA3_SPLIT),
}


def _string_list(metadata: dict[str, object], key: str) -> list[str]:
    value = metadata.get(key)
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ResidError(
            f"GGUF metadata {key!r} is {type(value).__name__}, expected a list of strings; the file has no "
            "usable vocabulary. Re-export it with llama.cpp's convert_hf_to_gguf.py, or load the model from a "
            "Hugging Face directory that has tokenizer.json."
        )
    return value


def _bpe_model(tokens: list[str], merges: list[str], ignore_merges: bool = False) -> models.BPE:
    vocab = {token: token_id for token_id, token in enumerate(tokens)}
    pairs = []
    for merge in merges:
        left, sep, right = merge.partition(" ")
        if not sep:
            raise ResidError(
                f"GGUF merge {merge!r} is not two tokens separated by a space; the file's vocabulary is "
                "corrupt. Re-export the file."
            )
        pairs.append((left, right))
    try:
        return models.BPE(
            vocab=vocab, merges=pairs, unk_token=None, fuse_unk=False, byte_fallback=False, ignore_merges=ignore_merges
        )
    except Exception as exc:  # tokenizers raises a bare Exception with the Rust error text
        raise ResidError(
            f"The GGUF vocabulary does not form a valid BPE model ({exc}); the file's tokens and merges "
            "disagree. Re-export the file."
        ) from None


def _added_tokens(tokens: list[str], token_types: list[int], kind: int) -> list[AddedToken]:
    # normalized=False: match the literal text, as llama.cpp does when it splits special tokens out first.
    return [
        AddedToken(tokens[i], special=kind == _CONTROL, normalized=False, lstrip=False, rstrip=False)
        for i, token_type in enumerate(token_types)
        if token_type == kind
    ]


def _token_types(metadata: dict[str, object], n_tokens: int) -> list[int]:
    token_types = metadata.get("tokenizer.ggml.token_type", [1] * n_tokens)
    if not isinstance(token_types, list) or len(token_types) != n_tokens:
        raise ResidError(
            f"GGUF metadata 'tokenizer.ggml.token_type' must be a list with one entry per token "
            f"({n_tokens}); the file's vocabulary is corrupt. Re-export the file."
        )
    return token_types


def tokenizer_from_gguf(metadata: dict[str, object]) -> tokenizers.Tokenizer:
    """A `tokenizers.Tokenizer` equivalent to the model's own, built from GGUF metadata (read_gguf's).

    Control tokens (token_type 3) become special added tokens, user-defined ones (4) plain added tokens.
    Raises ResidError for a tokenizer model or pre-tokenizer that resid cannot reproduce exactly.
    """
    model = metadata.get("tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        raise ResidError(
            f"GGUF tokenizer model {model!r} is not supported; resid builds 'gpt2' (byte-level BPE) and, for "
            "Gemma 3, 'llama' (SentencePiece) tokenizers from GGUF metadata. Load the model from a Hugging Face "
            "directory with tokenizer.json instead."
        )
    if model == "llama":
        tokens = _string_list(metadata, "tokenizer.ggml.tokens")
        return spm_tokenizer(metadata, tokens, _token_types(metadata, len(tokens)))
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise ResidError(
            f"GGUF pre-tokenizer {pre!r} is not supported (resid knows {sorted(_PRE_TOKENIZERS)}); guessing "
            "would give silently wrong token ids. Load the model from a Hugging Face directory with "
            "tokenizer.json instead."
        )
    tokens = _string_list(metadata, "tokenizer.ggml.tokens")
    merges = _string_list(metadata, "tokenizer.ggml.merges")
    token_types = _token_types(metadata, len(tokens))

    tokenizer = tokenizers.Tokenizer(_bpe_model(tokens, merges, ignore_merges=pre in _IGNORE_MERGES))
    tokenizer.pre_tokenizer = _PRE_TOKENIZERS[pre]()
    tokenizer.decoder = decoders.ByteLevel()
    # llama.cpp's add_space_prefix applies to SentencePiece vocabularies only, so it is ignored here.
    tokenizer.add_special_tokens(_added_tokens(tokens, token_types, _CONTROL))
    tokenizer.add_tokens(_added_tokens(tokens, token_types, _USER_DEFINED))
    return tokenizer
