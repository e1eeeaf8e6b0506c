"""Build Gemma's SentencePiece-style BPE tokenizer from GGUF metadata (`tokenizer.ggml.model == "llama"`).

Glossary (GGUF keys under `tokenizer.ggml.`, see also gguf_vocab.py):
    tokens      pieces by id, "▁" (U+2581) standing for a space; byte pieces "<0x0A>" cover any other byte.
    scores      SentencePiece scores; Gemma's do not follow its merge order, so they are not used.
    merges      absent for SentencePiece vocabularies: they are rebuilt from the tokens (below).

The result equals transformers' tokenizer for the same file (integrations/gguf, `gemma_tokenizer`), which is the
oracle of the tests: a BPE with byte fallback over text whose spaces became "▁", no prefix space, and merges
recovered from the vocabulary: every split of a token into two tokens is a merge, ranked by the token's
position in the file (earlier first; among splits of one token, the longer left piece first). Two quirks of
the files are undone the same way: tokens made only of spaces are stored with real spaces ("  ") but looked up
as "▁▁", so they are respelled first.
"""

import tokenizers
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers

from resid.errors import ResidError

_SPACE = "\u2581"
_CONTROL = 3
_USER_DEFINED = 4


def _respell(token: str) -> str:
    return _SPACE * len(token) if " " in token and not token.strip() else token


def merges_from_vocab(tokens: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every (left, right) with left + right a token, by the merged token's id, then longer left first."""
    merges, known = [], vocab.__contains__  # the hot loop of the load: plain locals
    append = merges.append
    for token_id, token in enumerate(tokens):
        if len(token) < 2 or vocab[token] != token_id:  # a repeated spelling ranks by its last id
            continue
        for cut in range(len(token) - 1, 0, -1):
            if known(token[:cut]) and known(token[cut:]):
                append((token[:cut], token[cut:]))
    return merges


def spm_tokenizer(metadata: dict[str, object], tokens: list[str], token_types: list[int]) -> tokenizers.Tokenizer:
    """A `tokenizers.Tokenizer` for a Gemma GGUF vocabulary (control tokens special, user-defined ones added)."""
    arch = metadata.get("general.architecture")
    if arch != "gemma3" or metadata.get("tokenizer.ggml.add_space_prefix", True):
        raise ResidError(
            f"GGUF tokenizer model 'llama' (SentencePiece) is supported for Gemma 3 files only (this file: "
            f"architecture {arch!r}); other SentencePiece vocabularies add a prefix space resid does not reproduce "
            "yet. Load the model from a Hugging Face directory with tokenizer.json instead."
        )
    spelled = [_respell(t) for t in tokens]
    vocab = {token: token_id for token_id, token in enumerate(spelled)}
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    unk = spelled[int(unk_id)] if isinstance(unk_id, int) and 0 <= unk_id < len(spelled) else "<unk>"
    try:
        model = models.BPE(
            vocab=vocab, merges=merges_from_vocab(spelled, vocab), unk_token=unk, fuse_unk=True, byte_fallback=True
        )
    except Exception as exc:  # tokenizers raises a bare Exception with the Rust error text
        raise ResidError(f"The GGUF vocabulary does not form a valid BPE model ({exc}); re-export the file.") from None
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.normalizer = normalizers.Replace(" ", _SPACE)
    # A no-op once spaces are "▁", kept because it is Gemma's own pre-tokenizer: one word per text run.
    tokenizer.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    tokenizer.decoder = decoders.Sequence([decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    # normalized=False: matched in the raw text, before spaces become "▁", as llama.cpp splits them out first.
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, kind in zip(tokens, token_types) if kind == _CONTROL]
    )
    # A user-defined token is added only under its stored spelling; the all-space ones ("  ") are respelled in
    # the vocabulary, so they stay plain BPE pieces, as in transformers.
    tokenizer.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, kind in zip(tokens, token_types)
            if kind == _USER_DEFINED and t in vocab
        ]
    )
    return tokenizer
