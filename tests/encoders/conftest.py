"""Fixtures of the encoder tests: the tiny random BERTs (tests/encoder_models.py), built and loaded once per
session, and the real all-MiniLM-L6-v2 with its transformers reference."""

from dataclasses import dataclass
from pathlib import Path

import pytest
import transformers
from encoder_models import VARIANTS, build

import resid


@dataclass(frozen=True)
class Encoder:
    variant: str
    folder: Path
    hf: transformers.PreTrainedModel  # the oracle: eval mode, float32, eager attention
    model: resid.Transformer


_BUILT: dict[str, Encoder] = {}


def _encoder(variant: str, tmp_path_factory: pytest.TempPathFactory) -> Encoder:
    if variant not in _BUILT:
        folder = tmp_path_factory.mktemp(variant)
        hf = build(variant, folder)
        _BUILT[variant] = Encoder(variant, folder, hf, resid.load(folder))
    return _BUILT[variant]


@pytest.fixture(scope="session", params=VARIANTS)
def bert(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Encoder:
    return _encoder(request.param, tmp_path_factory)


@pytest.fixture(scope="session")
def bert_mlm(tmp_path_factory: pytest.TempPathFactory) -> Encoder:
    return _encoder("bert_mlm", tmp_path_factory)


@pytest.fixture(scope="session")
def bert_base(tmp_path_factory: pytest.TempPathFactory) -> Encoder:
    return _encoder("bert_base", tmp_path_factory)


@pytest.fixture(scope="session")
def minilm() -> resid.Transformer:
    return resid.load("all-minilm-l6-v2")
