"""Llama 3.1+ GGUF files: llama.cpp's converter stores the llama3 rope scaling precomputed, as one divisor per
rotary frequency (the rope_freqs tensor). A tiny Llama with llama3 scaling, written that way, loads to
transformers' logits for the same model; an inconsistent file is refused."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from test_gguf_arch import _BASE, ATOL, write_gguf

import resid

# original context 64: of the 6 frequencies of a 12-dim head, one is kept, one smoothed, four scaled
ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def _llama3_model() -> transformers.PreTrainedModel:
    torch.manual_seed(7)
    config = transformers.LlamaConfig(**_BASE, vocab_size=50257, rms_norm_eps=1e-6, num_key_value_heads=2,
                                      tie_word_embeddings=False, rope_parameters=ROPE)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=torch.Generator().manual_seed(len(name))))
    return model.eval()


def rope_factors(head_dim: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py writes for llama3 scaling: 1 for short wavelengths, `factor` for
    long ones, 1 / ((1 - s) / factor + s) between."""
    freqs = 1.0 / (ROPE["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    old, factor = ROPE["original_max_position_embeddings"], ROPE["factor"]
    low, high = old / ROPE["low_freq_factor"], old / ROPE["high_freq_factor"]
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high:
            out.append(1.0)
        elif wavelen > low:
            out.append(factor)
        else:
            smooth = (old / wavelen - ROPE["low_freq_factor"]) / (ROPE["high_freq_factor"] - ROPE["low_freq_factor"])
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def test_rope_freqs_reproduce_llama3_scaling(tmp_path: Path):
    hf = _llama3_model()
    head_dim = hf.config.hidden_size // hf.config.num_attention_heads
    factors = rope_factors(head_dim)
    assert len(set(factors.tolist())) > 2  # kept, scaled and smoothed frequencies all occur
    path = write_gguf(hf, "llama", tmp_path / "llama31.gguf", extra={"rope_freqs.weight": factors})
    model = resid.load(path)
    assert model.config.rope_scaling.kind == "factors"
    ids = torch.randint(0, 50257, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids).logits
    torch.testing.assert_close(model.run(ids).logits, expected, atol=ATOL, rtol=0)
    # the factors matter: without them the logits differ
    plain = resid.load(write_gguf(hf, "llama", tmp_path / "plain.gguf"))
    assert not torch.allclose(plain.run(ids).logits, expected, atol=1e-2)


def test_rope_freqs_of_the_wrong_length_are_refused(tmp_path: Path):
    hf = _llama3_model()
    path = write_gguf(hf, "llama", tmp_path / "bad.gguf", extra={"rope_freqs.weight": np.ones(3, np.float32)})
    with pytest.raises(resid.ResidError, match="rope_freqs has 3 factors"):
        resid.load(path)
