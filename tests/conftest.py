"""Shared fixtures: the real SmolLM2 (loaded once), the shared reference data, and small random models
built directly from a ModelConfig (no transformers needed)."""

import json
import os
from pathlib import Path

import pytest
import tokenizers
import torch

import resid

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
MODELS = SHARED / "models"

# Tests never reach the network: a Hub id must fail fast and clearly.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def smollm2() -> resid.Transformer:
    return resid.load("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_reference() -> dict:
    path = MODELS / "smollm2-135m-reference" / "reference_outputs.json"
    assert path.exists(), f"{path} is missing: CI needs ../shared beside the checkout"
    return json.loads(path.read_text())


@pytest.fixture(scope="session")
def gpt2_tokenizer() -> resid.Tokenizer:
    raw = tokenizers.Tokenizer.from_file(str(MODELS / "gpt2-tokenizer" / "tokenizer.json"))
    return resid.Tokenizer(raw, bos_token_id=50256, prepend_bos=False, eos_token_id=50256)


RANDOM_CONFIGS = {
    "llama_gqa": dict(norm="rmsnorm", n_heads=4, n_kv_heads=2, act="silu", gated_mlp=True, tie_embeddings=True),
    "gpt2_like": dict(
        norm="layernorm", positions="learned", act="gelu_new", gated_mlp=False, attn_qkv_bias=True,
        attn_out_bias=True, mlp_bias=True, unembed_bias=True,
    ),
    "neox_parallel": dict(norm="layernorm", block="parallel", rotary_dim=4, act="gelu", gated_mlp=False),
    "gemma_like": dict(norm="rmsnorm", norm_gain_offset=1.0, embed_scale=4.0, d_head=12, act="gelu_new"),
}


def make_random_model(kind: str, tokenizer: resid.Tokenizer | None = None, seed: int = 0) -> resid.Transformer:
    """A small model of the given kind with every parameter random (gains and biases included)."""
    base = dict(
        architecture=kind, d_model=32, n_layers=3, n_heads=4, n_kv_heads=4, d_head=8, d_mlp=64,
        d_vocab=50257 if tokenizer is not None else 97, n_ctx=64, norm_eps=1e-5,
    )
    config = resid.ModelConfig(**{**base, **RANDOM_CONFIGS[kind]})
    model = resid.Transformer(config, tokenizer=tokenizer, name=f"random-{kind}")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.2 * noise if name.endswith(".w") else 0.3 * noise)
    return model.eval()


@pytest.fixture(params=sorted(RANDOM_CONFIGS))
def random_model(request, gpt2_tokenizer) -> resid.Transformer:
    return make_random_model(request.param, gpt2_tokenizer)
