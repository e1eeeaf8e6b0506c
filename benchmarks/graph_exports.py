"""What bench_graphs.py hands circuit-tracer: the model as a Hugging Face Llama folder (config.json +
model.safetensors, the tensors resid holds under Hugging Face's names) and the transcoders as a circuit-tracer
transcoder set (config.yaml + layer_{l}.safetensors in the layout resid.dictionaries.formats.circuit_tracer reads).
"""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_llama(model, folder: Path) -> Path:
    """A Llama-architecture resid model (SmolLM2) as a Hugging Face folder."""
    cfg = model.config
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {"model.embed_tokens.weight": model.embed.W_E, "model.norm.weight": model.readout.norm.w}
    for layer, block in enumerate(model.blocks):
        prefix = f"model.layers.{layer}."
        attn, mlp = block.attn, block.mlp
        tensors.update({
            prefix + "self_attn.q_proj.weight": attn._w_q, prefix + "self_attn.k_proj.weight": attn._w_k,
            prefix + "self_attn.v_proj.weight": attn._w_v, prefix + "self_attn.o_proj.weight": attn._w_o,
            prefix + "mlp.gate_proj.weight": mlp._w_gate, prefix + "mlp.up_proj.weight": mlp._w_in,
            prefix + "mlp.down_proj.weight": mlp._w_out, prefix + "input_layernorm.weight": block.ln_attn.w,
            prefix + "post_attention_layernorm.weight": block.ln_mlp.w,
        })
    if not cfg.tie_embeddings:
        tensors["lm_head.weight"] = model.readout.unembed.weight
    save_file({k: v.detach().float().contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": cfg.d_model,
              "intermediate_size": cfg.d_mlp, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
              "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.d_head, "vocab_size": cfg.d_vocab,
              "max_position_embeddings": cfg.n_ctx, "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rotary_base,
              "tie_word_embeddings": cfg.tie_embeddings, "hidden_act": "silu", "torch_dtype": "float32"}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def write_circuit_tracer_set(transcoders, folder: Path, input_hook: str = "ln2.hook_normalized",
                             output_hook: str = "hook_mlp_out") -> Path:
    """Per-layer transcoders (layer order) as circuit-tracer's files: W_enc as an nn.Linear weight [d_sae d_model],
    W_dec [d_sae d_model], b_enc, b_dec and the JumpReLU threshold."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["model_kind: transcoder_set", f"feature_input_hook: {input_hook}", f"feature_output_hook: {output_hook}",
             "model_name: smollm2-135m", "transcoders:"]
    for layer, d in enumerate(transcoders):
        tensors = {"W_enc": d.W_enc.detach().T, "W_dec": d.W_dec.detach(), "b_enc": d.b_enc.detach(),
                   "b_dec": d.b_dec.detach()}
        if d.activation == "jumprelu":
            tensors["activation_function.threshold"] = d.threshold.detach()
        elif d.activation != "relu":
            raise ValueError(f"{d.name}: circuit-tracer's set holds relu or jumprelu transcoders, not {d.activation}")
        save_file({k: v.float().contiguous() for k, v in tensors.items()}, str(folder / f"layer_{layer}.safetensors"))
        lines.append(f"  - layer_{layer}.safetensors")
    (folder / "config.yaml").write_text("\n".join(lines) + "\n")
    return folder


def check_roundtrip(model, transcoders, folder: Path) -> float:
    """The largest difference between the transcoders and what resid reads back from the written set."""
    import resid.dictionaries

    back = resid.dictionaries.load(folder, model)
    with torch.no_grad():
        return max(float((a.W_enc - b.W_enc).abs().max()) for a, b in zip(transcoders, back, strict=True)) \
            if back else float(torch.nan)
