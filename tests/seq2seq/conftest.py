"""Fixtures of the encoder-decoder tests: the original Transformer (nn.Transformer reference and its resid copy)
and a tiny random Marian (the Hugging Face model and resid.load of its folder)."""

from dataclasses import dataclass

import pytest
import transformers
from seq2seq_models import marian, vanilla

import resid


@dataclass(frozen=True)
class Marian:
    hf: transformers.MarianMTModel
    model: resid.EncoderDecoder


@pytest.fixture(scope="session")
def original():
    return vanilla()


@pytest.fixture(scope="session")
def tiny_marian(tmp_path_factory: pytest.TempPathFactory) -> Marian:
    folder = tmp_path_factory.mktemp("marian")
    hf = marian(folder)
    return Marian(hf, resid.load(folder))
