"""A word-level tokenizer for the tiny random Marian of seq2seq_models (not a test file): token i is the word
"w{i}" (1..58), 0 is "</s>", 59 (PAD) "<pad>", so tests and the command line can pass texts such as "w3 w17 w5"."""

import json
from pathlib import Path

import tokenizers
from seq2seq_models import PAD, marian

import resid


def add_word_tokenizer(folder: Path) -> None:
    """Write tokenizer.json (and tokenizer_config.json naming its pad and end tokens) into a saved Marian folder."""
    vocab = {"</s>": 0, **{f"w{i}": i for i in range(1, PAD)}, "<pad>": PAD}
    raw = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="</s>"))
    raw.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    raw.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"pad_token": "<pad>", "eos_token": "</s>"}))


def words(ids) -> str:
    """The text of token ids: "w3 w17 w5"."""
    return " ".join(f"w{int(i)}" for i in ids)


def worded_marian(folder: Path):
    """(the Hugging Face model, resid.load of its folder) of the tiny Marian with the word tokenizer beside it."""
    hf = marian(folder)
    add_word_tokenizer(folder)
    return hf, resid.load(folder)
