"""Tiny random T5 models, saved as Hugging Face folders, and their transformers references. Not a test file.

`t5(folder, version)`: version "1.0" is the original T5 (ReLU MLP, head tied to the shared embedding, the
decoder's output rescaled by d_model^-0.5); "1.1" is T5 v1.1 / Flan-T5 / mT5 as their checkpoints are written
(gated GELU, `tie_word_embeddings: false` and a head of its own, no rescaling); "1.1-saved" is a v1.1 model as
transformers >= 5 saves it (its head tied, `scale_decoder_outputs: false`); "umt5" is umT5 (v1.1 with a bias table
in every layer), written as its checkpoints are. Different encoder and decoder
depths, d_kv * heads != d_model, few buckets and a short max distance, so that lengths of a few dozen tokens
reach the log-spaced and the last buckets.
"""

import json
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file
from torch import nn

PAD, EOS, VOCAB = 0, 1, 70


def t5_config(version: str, **overrides) -> transformers.T5Config:
    gated = version.startswith("1.1") or version == "umt5"
    options = dict(
        vocab_size=VOCAB, d_model=32, d_kv=6, d_ff=48, num_layers=2, num_decoder_layers=3, num_heads=4,
        relative_attention_num_buckets=10, relative_attention_max_distance=24, dropout_rate=0.0,
        feed_forward_proj="gated-gelu" if gated else "relu", pad_token_id=PAD, eos_token_id=EOS,
        decoder_start_token_id=PAD, tie_word_embeddings=not gated, n_positions=512,
    )
    options.update(overrides)
    return (transformers.UMT5Config if version == "umt5" else transformers.T5Config)(**options)


def t5(folder: Path, version: str = "1.0", seed: int = 1, std: float = 0.2,
       **overrides) -> transformers.T5ForConditionalGeneration:
    """Save a random T5 of `version` ("1.0", "1.1" or "1.1-saved"; tiny unless `overrides` say otherwise) in
    `folder`, weights N(0, std^2) (norm gains 1 + that); return the reference (eval, fp32, eager attention) whose
    numbers that folder means."""
    torch.manual_seed(seed)
    config = t5_config(version, **overrides)
    model = (transformers.UMT5ForConditionalGeneration if version == "umt5" else
             transformers.T5ForConditionalGeneration)(config)
    own_head = version in ("1.1", "umt5")
    if own_head:  # what a v1.1 checkpoint holds: lm_head.weight, not a copy of shared.weight
        model.lm_head.weight = nn.Parameter(torch.empty(config.vocab_size, config.d_model))
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            gain = "layer_norm.weight" in name
            param.copy_((1.0 if gain else 0.0) + std * torch.randn(param.shape, generator=generator))
    model.set_attn_implementation("eager")
    folder.mkdir(parents=True, exist_ok=True)
    transformers.utils.logging.disable_progress_bar()
    if own_head:
        tensors = {name: t.detach().clone().contiguous() for name, t in model.state_dict().items()
                   if not name.endswith("embed_tokens.weight")}
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        saved = model.config.to_dict()
        saved["tie_word_embeddings"] = False  # as the v1.1 checkpoints' config.json says
        saved.pop("scale_decoder_outputs", None)
        (folder / "config.json").write_text(json.dumps(saved, indent=2))
    else:
        model.save_pretrained(folder, safe_serialization=True)
    return model.eval()


def references(hf: transformers.T5ForConditionalGeneration, source, target, source_mask=None, target_mask=None):
    """transformers' encoder and decoder hidden states (every layer's input and the final normed output) and
    its logits."""
    with torch.no_grad():
        out = hf(input_ids=source, attention_mask=source_mask, decoder_input_ids=target,
                 decoder_attention_mask=target_mask, output_hidden_states=True)
    return out
