"""Loading a llama-architecture GGUF file (llama.cpp's format), e.g. the embedded SmolLM2-135M.

Tensors are dequantized to float32 (resid/load/gguf_quants.py), renamed to Hugging Face's names and copied
through the same key table as Hugging Face Llama checkpoints. Trap: llama.cpp's converter permutes the
rows of attn_q and attn_k so that each head's rotary pairs are interleaved (x0, x1), (x2, x3), ...;
Hugging Face (and resid) pair dims i and i + d_head/2 (`rotate_half`). `unpermute_qk` undoes it.
"""

from pathlib import Path

import torch
from jaxtyping import Float
from torch import Tensor

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.load.families import llama
from resid.load.gguf_format import GGUFFile, read_gguf
from resid.load.gguf_quants import dequantize
from resid.load.gguf_vocab import tokenizer_from_gguf
from resid.load.weights import assign
from resid.model import Transformer
from resid.tokenizer import Tokenizer

# llama.cpp name -> Hugging Face Llama name ({layer} per block)
GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{layer}.attn_norm.weight": "model.layers.{layer}.input_layernorm.weight",
    "blk.{layer}.attn_q.weight": "model.layers.{layer}.self_attn.q_proj.weight",
    "blk.{layer}.attn_k.weight": "model.layers.{layer}.self_attn.k_proj.weight",
    "blk.{layer}.attn_v.weight": "model.layers.{layer}.self_attn.v_proj.weight",
    "blk.{layer}.attn_output.weight": "model.layers.{layer}.self_attn.o_proj.weight",
    "blk.{layer}.ffn_norm.weight": "model.layers.{layer}.post_attention_layernorm.weight",
    "blk.{layer}.ffn_gate.weight": "model.layers.{layer}.mlp.gate_proj.weight",
    "blk.{layer}.ffn_up.weight": "model.layers.{layer}.mlp.up_proj.weight",
    "blk.{layer}.ffn_down.weight": "model.layers.{layer}.mlp.down_proj.weight",
}


def unpermute_qk(weight: Float[Tensor, "rows d_model"], n_heads: int) -> Float[Tensor, "rows d_model"]:
    """Undo llama.cpp's per-head row permutation: rows (head, half, pair) -> (head, pair, half)."""
    rows = weight.shape[0]
    return weight.reshape(n_heads, rows // n_heads // 2, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def config_from_gguf(gguf: GGUFFile) -> ModelConfig:
    meta = gguf.metadata
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ResidError(
            f"{gguf.path.name} is a GGUF of architecture {arch!r}; resid reads llama-architecture GGUF files "
            "(Llama, Mistral, SmolLM). For other models pass a Hugging Face folder with safetensors."
        )

    def field(name: str, default: object = None) -> object:
        value = meta.get(f"llama.{name}", default)
        if value is None:
            raise ResidError(f"{gguf.path.name} lacks the metadata field llama.{name}; the file is incomplete.")
        return value

    d_model, n_heads = int(field("embedding_length")), int(field("attention.head_count"))
    d_vocab = int(meta.get("llama.vocab_size") or len(meta.get("tokenizer.ggml.tokens", [])))
    if "llama.rope.scaling.type" in meta and meta["llama.rope.scaling.type"] not in ("none", "linear"):
        raise ResidError(f"{gguf.path.name} uses rope scaling {meta['llama.rope.scaling.type']!r}, not supported yet.")
    return ModelConfig(
        architecture="llama",
        d_model=d_model,
        n_layers=int(field("block_count")),
        n_heads=n_heads,
        n_kv_heads=int(field("attention.head_count_kv", n_heads)),
        d_head=int(field("attention.key_length", d_model // n_heads)),
        d_mlp=int(field("feed_forward_length")),
        d_vocab=d_vocab,
        n_ctx=int(field("context_length")),
        norm="rmsnorm",
        norm_eps=float(field("attention.layer_norm_rms_epsilon")),
        positions="rotary",
        rotary_dim=int(field("rope.dimension_count", d_model // n_heads)),
        rotary_base=float(field("rope.freq_base", 10000.0)),
        act="silu",
        gated_mlp=True,
        tie_embeddings="output.weight" not in gguf.tensors,
    )


def load_gguf(path: Path, name: str, device: torch.device | str | None, dtype: torch.dtype) -> Transformer:
    gguf = read_gguf(path)
    config = config_from_gguf(gguf)
    hf_names = {}
    for gguf_name in gguf.tensors:
        hf_names[_to_hf(gguf_name, config.n_layers)] = gguf_name

    def get(hf_name: str) -> Tensor | None:
        if hf_name not in hf_names:
            return None
        weight = dequantize(gguf.tensors[hf_names[hf_name]])
        if hf_name.endswith("q_proj.weight"):
            weight = unpermute_qk(weight, config.n_heads)
        elif hf_name.endswith("k_proj.weight"):
            weight = unpermute_qk(weight, config.n_kv_heads)
        return weight

    model = Transformer(config, name=name, weight_files=(Path(path),))
    assign(model, llama.keys(config), get, available=hf_names, where=f"the GGUF file {Path(path).name}")
    model.tokenizer = _tokenizer(gguf)
    return model.to(device=device or "cpu", dtype=dtype).eval()


def _to_hf(gguf_name: str, n_layers: int) -> str:
    """The Hugging Face name of a llama.cpp tensor (unknown names are kept, and then reported as unused)."""
    if gguf_name.startswith("blk."):
        _, layer, rest = gguf_name.split(".", 2)
        hf = GGUF_TO_HF.get(f"blk.{{layer}}.{rest}")
        return hf.format(layer=layer) if hf else gguf_name
    return GGUF_TO_HF.get(gguf_name, gguf_name)


def _tokenizer(gguf: GGUFFile) -> Tokenizer:
    meta = gguf.metadata
    bos = meta.get("tokenizer.ggml.bos_token_id")
    return Tokenizer(
        tokenizer_from_gguf(meta),
        bos_token_id=None if bos is None else int(bos),
        prepend_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)) and bos is not None,
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
    )
