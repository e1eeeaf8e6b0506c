"""Loading a GGUF file (llama.cpp's format): Llama/SmolLM, Qwen2, Qwen3 and Gemma 3 architectures.

The file becomes a Hugging Face checkpoint in all but storage (resid/load/gguf_arch.py): its metadata a
config.json dict, its tensor names Hugging Face's, its values un-permuted/un-shifted where llama.cpp's
converter changed them. That dict and those names then go through the same family module as a Hugging Face
folder (`family.read`, `family.keys`, `assign`), so an architecture has one key table, whatever the format.
Tensors are dequantized to float32 (resid/load/gguf_quants.py) one at a time, as `assign` asks for them.
The tokenizer is rebuilt from the GGUF vocabulary (resid/load/gguf_vocab.py).
"""

import dataclasses
import math
from pathlib import Path

import torch
from torch import Tensor

from resid.config import ModelConfig, RopeScaling
from resid.errors import ResidError
from resid.load.families.model_types import family_for, supported_model_types
from resid.load.gguf_arch import arch_of, gguf_name, hf_config, hf_name, to_hf_layout
from resid.load.gguf_format import GGUFFile, read_gguf
from resid.load.gguf_quants import dequantize
from resid.load.gguf_vocab import tokenizer_from_gguf
from resid.load.weights import assign, check_size
from resid.model import Transformer
from resid.tokenizer import Tokenizer

ROPE_FREQS = "rope_freqs.weight"  # Llama 3.1+: the llama3 rope scaling, precomputed per frequency


def load_gguf(path: Path, name: str, device: torch.device | str | None, dtype: torch.dtype) -> Transformer:
    path = Path(path)
    gguf = read_gguf(path)
    _, arch = arch_of(gguf)
    hf = hf_config(gguf)
    if hf["model_type"] not in supported_model_types():
        raise ResidError(
            f"{path.name} is a GGUF of model type {hf['model_type']!r}, which this resid has no family module for "
            f"(it reads {', '.join(supported_model_types())}). Upgrade resid."
        )
    family = family_for(hf["model_type"], path)
    config = _with_rope_factors(family.read(hf, f"the metadata of {path.name}"), gguf)
    check_size([config], sum(math.prod(t.shape) for t in gguf.tensors.values()), f"the GGUF file {path.name}")
    keys = family.keys(config)
    # Hugging Face name -> llama.cpp name (rope_freqs is read into the config, not copied into a weight)
    in_file = {hf_name(n, arch): n for n in gguf.tensors if n != ROPE_FREQS}
    missing = [key for key in keys if key.checkpoint not in in_file]
    if missing:
        key = missing[0]
        raise ResidError(
            f"The GGUF file {path.name} has no tensor {gguf_name(key.checkpoint, arch)!r} (Hugging Face's "
            f"{key.checkpoint}, needed for {key.attribute})"
            f"{f' nor {len(missing) - 1} other(s)' if len(missing) > 1 else ''}"
            ". The file is incomplete or was not written by llama.cpp's converter; re-export it."
        )

    def get(name: str) -> Tensor | None:
        if name not in in_file:
            return None
        return to_hf_layout(name, dequantize(gguf.tensors[in_file[name]]), arch, hf)

    model = Transformer(config, name=name, weight_files=(path,))
    assign(model, keys, get, available=in_file, where=f"the GGUF file {path.name}")
    model.tokenizer = _tokenizer(gguf)
    return model.to(device=device or "cpu", dtype=dtype).eval()


def _with_rope_factors(config: ModelConfig, gguf: GGUFFile) -> ModelConfig:
    """Llama 3.1+ files: llama.cpp's converter precomputes the llama3 rope scaling as one divisor per rotary
    frequency (the rope_freqs tensor, inv_freq / factors), which resid applies as given."""
    if ROPE_FREQS not in gguf.tensors:
        return config
    if config.rope_scaling is not None:
        raise ResidError(
            f"{gguf.path.name} has both rope scaling metadata ({config.rope_scaling.kind}) and a rope_freqs tensor; "
            "llama.cpp uses one or the other. The file is inconsistent; re-export it."
        )
    factors = dequantize(gguf.tensors[ROPE_FREQS]).float().reshape(-1).tolist()
    if len(factors) * 2 != config.rotary_dims:
        raise ResidError(
            f"{gguf.path.name}'s rope_freqs has {len(factors)} factors, "
            f"but the model rotates {config.rotary_dims // 2} "
            "frequencies per head. The file is inconsistent; re-export it."
        )
    return dataclasses.replace(config, rope_scaling=RopeScaling("factors", 1.0, factors=tuple(factors)))


def _tokenizer(gguf: GGUFFile) -> Tokenizer:
    meta = gguf.metadata
    bos = meta.get("tokenizer.ggml.bos_token_id")
    # llama.cpp adds BOS to a SentencePiece ("llama") vocabulary whose file does not say; never to a BPE one.
    add_bos = meta.get("tokenizer.ggml.add_bos_token", meta.get("tokenizer.ggml.model") == "llama")
    return Tokenizer(
        tokenizer_from_gguf(meta),
        bos_token_id=None if bos is None else int(bos),
        prepend_bos=bool(add_bos) and bos is not None,
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
    )
