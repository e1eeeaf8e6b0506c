"""resid.load(name_or_path): the embedded default, a local folder or GGUF file, or a Hugging Face Hub id.

The loaders (and torch) are imported at the first call, not with this package: `import resid` binds these two
functions, and `resid --help` must not pay for torch."""

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for readers and type checkers only; resid.load.registry.load checks its arguments itself
    import torch

    from resid.model import Transformer
    from resid.seq2seq import EncoderDecoder


def load(
    name_or_path: "str | os.PathLike",
    device: "torch.device | str | None" = None,
    dtype: "torch.dtype | str | None" = None,
) -> "Transformer | EncoderDecoder":
    """Load a model: a resid name (`known_models()`), a folder (config.json + *.safetensors + tokenizer.json), a
    .gguf file or a Hugging Face Hub id. An encoder-decoder family (Marian) gives a resid.EncoderDecoder. `dtype`
    is float32 (default), bfloat16 or float16; `device` e.g. "cuda" (default CPU)."""
    from resid.load import registry

    return registry.load(name_or_path, device=device, dtype=dtype)


def known_models() -> dict[str, str]:
    """resid's built-in model names and what each one is."""
    from resid.load import registry

    return registry.known_models()


__all__ = ["known_models", "load"]
