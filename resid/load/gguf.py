"""Loading a GGUF file (llama.cpp's format): Llama/SmolLM, Qwen2, Qwen3 and Gemma 3 architectures.

The file becomes a Hugging Face checkpoint in all but storage (resid/load/gguf_arch.py): its metadata a
config.json dict, its tensor names Hugging Face's, its values un-permuted/un-shifted where llama.cpp's
converter changed them. That dict and those names then go through the same family module as a Hugging Face
folder (`family.read`, `family.keys`, `assign`), so an architecture has one key table, whatever the format.
Tensors are dequantized to float32 (resid/load/gguf_quants.py) one at a time, as `assign` asks for them.
The tokenizer is rebuilt from the GGUF vocabulary (resid/load/gguf_vocab.py).
"""

from pathlib import Path

import torch
from torch import Tensor

from resid.errors import ResidError
from resid.load.families.registry import family_for, supported_model_types
from resid.load.gguf_arch import arch_of, gguf_name, hf_config, hf_name, to_hf_layout
from resid.load.gguf_format import GGUFFile, read_gguf
from resid.load.gguf_quants import dequantize
from resid.load.gguf_vocab import tokenizer_from_gguf
from resid.load.weights import assign
from resid.model import Transformer
from resid.tokenizer import Tokenizer


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
    config = family.read(hf, f"the metadata of {path.name}")
    keys = family.keys(config)
    in_file = {hf_name(n, arch): n for n in gguf.tensors}  # Hugging Face name -> llama.cpp name
    missing = [key for key in keys if key.source not in in_file]
    if missing:
        key = missing[0]
        raise ResidError(
            f"The GGUF file {path.name} has no tensor {gguf_name(key.source, arch)!r} (Hugging Face's "
            f"{key.source}, needed for {key.target}){f' nor {len(missing) - 1} other(s)' if len(missing) > 1 else ''}"
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
