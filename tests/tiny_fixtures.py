"""What the `tiny` fixture (tests/conftest.py) gives: one tiny random model per variant, as a Hugging Face model
and as resid.load() of its saved folder, built, saved and loaded once per session; and random token ids."""

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import transformers
from tiny_models import D_VOCAB, build

import resid

N_BATCH, N_POS = 2, 16


@dataclass(frozen=True)
class Tiny:
    variant: str
    folder: Path
    hf: transformers.PreTrainedModel  # the oracle: eval mode, float32, eager attention
    model: resid.Transformer  # resid.load(folder)


def build_tiny(variant: str, tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    folder = tmp_path_factory.mktemp(f"tiny_{variant}")
    hf = build(variant, folder)
    return Tiny(variant, folder, hf, resid.load(folder))


def random_ids(seed: int = 0) -> torch.Tensor:
    """[N_BATCH N_POS] token ids, the same for every call with the same seed."""
    return torch.randint(0, D_VOCAB, (N_BATCH, N_POS), generator=torch.Generator().manual_seed(seed))
