"""llama.cpp's GGUF architectures as Hugging Face checkpoints: a config.json dict and tensor names.

A GGUF file has no config.json: its metadata (`{arch}.embedding_length`, ...) is the config, under llama.cpp's
key names, and its tensors have llama.cpp's names (`blk.3.attn_q.weight`). Each architecture here turns both
into what Hugging Face would have for that model, so the GGUF loader hands them to the same family module
(resid/load/families/) the folder loader uses: one key table per family, never a second forward path.

Glossary:
    arch        `general.architecture` of the file ("llama", "qwen2", "qwen3", "gemma3").
    model_type  the Hugging Face config.json model_type it becomes ("llama", "qwen2", "qwen3", "gemma3_text").
    {layer}     the block index in both name tables.

Traps, as llama.cpp's convert_hf_to_gguf.py writes the files (transformers' GGUF loader undoes the same):
- llama only: the converter permutes the rows of attn_q/attn_k per head so that rotary pairs are interleaved
  (x0, x1), (x2, x3), ...; Hugging Face pairs dims i and i + d_head/2. `unpermute_qk` undoes it. Qwen2/3 and
  Gemma 3 are converted without the permutation (their files run with llama.cpp's NEOX rope).
- gemma3: every `*norm.weight` is stored as 1 + w (Gemma3RMSNorm computes x * (1 + w)); Hugging Face's layout
  is w, so 1 is subtracted again, in float32 as transformers does.
- gemma3: the file states neither the sliding pattern, nor the local rope base, nor query_pre_attn_scalar.
  llama.cpp hard-codes them (llama-model.cpp, LLM_ARCH_GEMMA3): every 6th layer global, local base 10000 with no
  scaling, and scores scaled by 1/sqrt(key_length), except 1/sqrt(d_model / n_heads) for the 62-layer 27B.
- gemma3: the converter drops token_embd rows past the tokenizer's vocabulary (262,208 -> 262,144 for 4B), so
  vocab_size is read from the tensor, never from a config default.
- llama.cpp writes `output.weight` only when the unembedding is not the embedding: its absence means tied.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from resid.errors import ResidError
from resid.load.gguf_format import GGUFFile

_COMMON_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{layer}.attn_norm.weight": "model.layers.{layer}.input_layernorm.weight",
    "blk.{layer}.attn_q.weight": "model.layers.{layer}.self_attn.q_proj.weight",
    "blk.{layer}.attn_k.weight": "model.layers.{layer}.self_attn.k_proj.weight",
    "blk.{layer}.attn_v.weight": "model.layers.{layer}.self_attn.v_proj.weight",
    "blk.{layer}.attn_output.weight": "model.layers.{layer}.self_attn.o_proj.weight",
    "blk.{layer}.ffn_gate.weight": "model.layers.{layer}.mlp.gate_proj.weight",
    "blk.{layer}.ffn_up.weight": "model.layers.{layer}.mlp.up_proj.weight",
    "blk.{layer}.ffn_down.weight": "model.layers.{layer}.mlp.down_proj.weight",
}
_BIASES = {
    f"blk.{{layer}}.{gguf}.bias": f"model.layers.{{layer}}.{hf}.bias"
    for gguf, hf in [
        ("attn_q", "self_attn.q_proj"), ("attn_k", "self_attn.k_proj"), ("attn_v", "self_attn.v_proj"),
        ("attn_output", "self_attn.o_proj"), ("ffn_gate", "mlp.gate_proj"), ("ffn_up", "mlp.up_proj"),
        ("ffn_down", "mlp.down_proj"),
    ]
}
_PRE_NORM_MLP = {"blk.{layer}.ffn_norm.weight": "model.layers.{layer}.post_attention_layernorm.weight"}
_QK_NORMS = {
    "blk.{layer}.attn_q_norm.weight": "model.layers.{layer}.self_attn.q_norm.weight",
    "blk.{layer}.attn_k_norm.weight": "model.layers.{layer}.self_attn.k_norm.weight",
}
# Gemma 3's four norms per block: llama.cpp's ffn_norm is the pre-MLP norm, which Hugging Face calls
# pre_feedforward_layernorm (its post_attention_layernorm is the attention output's post-norm).
_GEMMA3_NORMS = {
    "blk.{layer}.post_attention_norm.weight": "model.layers.{layer}.post_attention_layernorm.weight",
    "blk.{layer}.ffn_norm.weight": "model.layers.{layer}.pre_feedforward_layernorm.weight",
    "blk.{layer}.post_ffw_norm.weight": "model.layers.{layer}.post_feedforward_layernorm.weight",
}


class _Meta:
    """`{arch}.{key}` metadata with errors naming the missing field."""

    def __init__(self, gguf: GGUFFile, arch: str):
        self.gguf, self.arch = gguf, arch

    def get(self, key: str, default: object = None) -> object:
        value = self.gguf.metadata.get(f"{self.arch}.{key}", default)
        if value is None:
            raise ResidError(
                f"{self.gguf.path.name} lacks the metadata field {self.arch}.{key}; the file is incomplete. "
                "Re-export it with llama.cpp's convert_hf_to_gguf.py."
            )
        return value

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self.gguf.tensors:
            raise ResidError(f"{self.gguf.path.name} has no tensor {name!r}; the file is incomplete. Re-export it.")
        return self.gguf.tensors[name].shape


def _rope(meta: _Meta) -> dict:
    """rope_parameters as transformers 5 writes them, from `{arch}.rope.*` (none or linear scaling)."""
    rope = {"rope_type": "default", "rope_theta": float(meta.get("rope.freq_base", 10000.0))}
    kind = meta.get("rope.scaling.type", "none")
    if kind == "linear":
        rope.update(rope_type="linear", factor=float(meta.get("rope.scaling.factor")))
    elif kind != "none":
        raise ResidError(
            f"{meta.gguf.path.name} uses rope scaling {kind!r}; resid reads GGUF files with no or linear rope "
            "scaling. Load the model from its Hugging Face folder instead."
        )
    return rope


def _common(meta: _Meta, model_type: str) -> dict:
    n_heads = int(meta.get("attention.head_count"))
    # key_length is written only when config.json has head_dim; else it is d_model / n_heads, which the
    # attn_q rows say as well (and for Qwen3 they differ from d_model / n_heads).
    d_head = int(meta.get("attention.key_length", meta.shape("blk.0.attn_q.weight")[0] // n_heads))
    return {
        "model_type": model_type,
        "hidden_size": int(meta.get("embedding_length")),
        "intermediate_size": int(meta.get("feed_forward_length")),
        "num_hidden_layers": int(meta.get("block_count")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(meta.get("attention.head_count_kv", n_heads)),
        "head_dim": d_head,
        "max_position_embeddings": int(meta.get("context_length")),
        "rms_norm_eps": float(meta.get("attention.layer_norm_rms_epsilon")),
        "vocab_size": meta.shape("token_embd.weight")[0],
        "tie_word_embeddings": "output.weight" not in meta.gguf.tensors,
    }


def _llama_config(meta: _Meta) -> dict:
    tensors = meta.gguf.tensors
    return _common(meta, "llama") | {
        "hidden_act": "silu",
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "mlp_bias": "blk.0.ffn_up.bias" in tensors,
        "rope_parameters": _rope(meta),
    }


def _qwen_config(model_type: str) -> Callable[[_Meta], dict]:
    def config(meta: _Meta) -> dict:
        return _common(meta, model_type) | {"hidden_act": "silu", "rope_parameters": _rope(meta)}

    return config


def _gemma3_config(meta: _Meta) -> dict:
    hf = _common(meta, "gemma3_text")
    n_layers = hf["num_hidden_layers"]
    big = n_layers == 62  # llama.cpp's LLM_TYPE_27B: its only Gemma 3 with query_pre_attn_scalar != head_dim
    return hf | {
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": hf["hidden_size"] // hf["num_attention_heads"] if big else hf["head_dim"],
        "sliding_window": int(meta.get("attention.sliding_window")),
        "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n_layers)],
        "final_logit_softcapping": meta.gguf.metadata.get("gemma3.final_logit_softcapping"),
        "rope_parameters": {
            "full_attention": _rope(meta),
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    }


def unpermute_qk(weight: Float[Tensor, "rows *rest"], n_heads: int) -> Float[Tensor, "rows *rest"]:
    """Undo llama.cpp's per-head row permutation of a weight or bias: rows (head, half, pair) -> (head, pair, half)."""
    rows = weight.shape[0]
    return weight.reshape(n_heads, rows // n_heads // 2, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


@dataclass(frozen=True)
class Arch:
    """One GGUF architecture: its config.json builder, its name table and the value fixes of its converter."""

    config: Callable[[_Meta], dict]  # metadata -> Hugging Face config.json dict
    names: dict[str, str]  # llama.cpp tensor name -> Hugging Face name ({layer} per block)
    permuted_qk: bool = False  # attn_q/attn_k rows interleaved for rotary (llama only)
    norm_shift: float = 0.0  # the converter stored norm gains as w + norm_shift


ARCHS: dict[str, Arch] = {
    "llama": Arch(_llama_config, _COMMON_NAMES | _PRE_NORM_MLP | _BIASES, permuted_qk=True),
    "qwen2": Arch(_qwen_config("qwen2"), _COMMON_NAMES | _PRE_NORM_MLP | _BIASES),
    "qwen3": Arch(_qwen_config("qwen3"), _COMMON_NAMES | _PRE_NORM_MLP | _QK_NORMS),
    "gemma3": Arch(_gemma3_config, _COMMON_NAMES | _GEMMA3_NORMS | _QK_NORMS, norm_shift=1.0),
}


def arch_of(gguf: GGUFFile) -> tuple[str, Arch]:
    arch = gguf.metadata.get("general.architecture")
    if arch not in ARCHS:
        raise ResidError(
            f"{gguf.path.name} is a GGUF of architecture {arch!r}; resid reads GGUF files of architecture "
            f"{', '.join(repr(a) for a in ARCHS)}. For other models pass a Hugging Face folder with safetensors."
        )
    return arch, ARCHS[arch]


def hf_config(gguf: GGUFFile) -> dict:
    """The config.json Hugging Face would have for this file's model (only fields config.json really has)."""
    arch, spec = arch_of(gguf)
    hf = spec.config(_Meta(gguf, arch))
    return {key: value for key, value in hf.items() if value is not None}


def hf_name(gguf_name: str, arch: Arch) -> str:
    """The Hugging Face name of a llama.cpp tensor (unknown names are kept, and then reported as unused)."""
    if gguf_name.startswith("blk."):
        _, layer, rest = gguf_name.split(".", 2)
        hf = arch.names.get(f"blk.{{layer}}.{rest}")
        return hf.format(layer=layer) if hf is not None and layer.isdigit() else gguf_name
    return arch.names.get(gguf_name, gguf_name)


def gguf_name(hf_tensor_name: str, arch: Arch) -> str:
    """The llama.cpp name of a Hugging Face tensor name (for messages; the name itself if it has none)."""
    prefix = "model.layers."
    if hf_tensor_name.startswith(prefix):
        layer, rest = hf_tensor_name[len(prefix) :].split(".", 1)
        pattern = f"{prefix}{{layer}}.{rest}"
    else:
        layer, pattern = "", hf_tensor_name
    found = next((g for g, h in arch.names.items() if h == pattern), None)
    return found.format(layer=layer) if found is not None else hf_tensor_name


def to_hf_layout(hf_tensor_name: str, weight: Tensor, arch: Arch, hf: dict) -> Tensor:
    """A dequantized tensor as Hugging Face stores it: Q/K rows un-permuted, norm gains un-shifted."""
    if arch.permuted_qk and hf_tensor_name.endswith(("q_proj.weight", "q_proj.bias")):
        return unpermute_qk(weight, hf["num_attention_heads"])
    if arch.permuted_qk and hf_tensor_name.endswith(("k_proj.weight", "k_proj.bias")):
        return unpermute_qk(weight, hf["num_key_value_heads"])
    if arch.norm_shift and hf_tensor_name.endswith("norm.weight"):
        return weight.to(torch.float32) - arch.norm_shift
    return weight
