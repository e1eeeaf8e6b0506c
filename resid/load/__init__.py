"""resid.load(name_or_path): the embedded default, a local folder or GGUF file, or a Hugging Face Hub id."""

from resid.load.registry import known_models, load

__all__ = ["known_models", "load"]
