"""resid: a hooked Transformer whose every sublayer writes named, typed tensors into an explicit
residual-stream object. See README.md and DESIGN.md."""

from resid.capture import Capture
from resid.config import ModelConfig
from resid.errors import ResidError
from resid.interventions import Add, Intervention, Replace, Scale, Site, ZeroAblate
from resid.load import known_models, load
from resid.model import Run, Transformer
from resid.stream import AttnRecord, LayerRecord, MLPRecord, ResidualStream
from resid.tokenizer import Tokenizer, Tokens

__version__ = "0.1.0"

__all__ = [
    "Add",
    "AttnRecord",
    "Capture",
    "Intervention",
    "LayerRecord",
    "MLPRecord",
    "ModelConfig",
    "Replace",
    "ResidError",
    "ResidualStream",
    "Run",
    "Scale",
    "Site",
    "Tokenizer",
    "Tokens",
    "Transformer",
    "ZeroAblate",
    "known_models",
    "load",
]
