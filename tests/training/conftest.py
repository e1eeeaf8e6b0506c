"""A tiny random model whose tokenizer prepends BOS (so that dropping BOS is tested), and a few documents."""

from pathlib import Path

import pytest
import tokenizers
from random_models import make_random_model

import resid

TOKENIZER = Path(__file__).resolve().parents[1] / "data" / "gpt2-tokenizer" / "tokenizer.json"


@pytest.fixture(scope="module")
def bos_model() -> resid.Transformer:
    raw = tokenizers.Tokenizer.from_file(str(TOKENIZER))
    tokenizer = resid.Tokenizer(raw, bos_token_id=50256, prepend_bos=True, eos_token_id=50256)
    return make_random_model("llama_gqa", tokenizer)


@pytest.fixture(scope="module")
def plain_model() -> resid.Transformer:
    """The same model with a tokenizer that prepends no BOS (as SmolLM2's and GPT-2's)."""
    raw = tokenizers.Tokenizer.from_file(str(TOKENIZER))
    tokenizer = resid.Tokenizer(raw, bos_token_id=50256, prepend_bos=False, eos_token_id=50256)
    return make_random_model("llama_gqa", tokenizer)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    from resid.analyses.io import corpus

    return corpus.demo(max_documents=40)


@pytest.fixture(autouse=True)
def single_threaded(one_thread):
    """Every training test on one thread (tests/conftest.py's one_thread)."""
