"""Small resid models built straight from a ModelConfig, every parameter random (no transformers needed):
one per structural kind (GQA + gated, GPT-2-like biases + learned positions, parallel + partial rotary,
Gemma-like gains and embedding scale, Gemma-3-like sandwich norms and local/global layers, OLMo-2-like
post-norms)."""

import torch

import resid

RANDOM_CONFIGS = {
    "llama_gqa": dict(norm="rmsnorm", n_heads=4, n_kv_heads=2, act="silu", gated_mlp=True, tie_embeddings=True),
    "gpt2_like": dict(
        norm="layernorm", positions="learned", act="gelu_new", gated_mlp=False, attn_qkv_bias=True,
        attn_out_bias=True, mlp_bias=True, unembed_bias=True,
    ),
    "neox_parallel": dict(norm="layernorm", block="parallel", rotary_dim=4, act="gelu", gated_mlp=False),
    "gemma_like": dict(norm="rmsnorm", norm_gain_offset=1.0, embed_scale=4.0, d_head=12, act="gelu_new"),
    # sandwich norms, q/k norms per head, both soft caps, sliding and full layers with two rope bases
    "gemma3_like": dict(
        norm="rmsnorm", norm_gain_offset=1.0, n_kv_heads=2, act="gelu_new", post_norms=True, qk_norm="head",
        attn_softcap=3.0, final_softcap=5.0, sliding_window=4, layer_types=("sliding", "full", "sliding"),
        rotary_base_local=100.0, rope_scaling=resid.RopeScaling("linear", 2.0),
    ),
    # post-norms only, q/k norms over all heads, yarn rotary
    "olmo2_like": dict(
        norm="rmsnorm", pre_norms=False, post_norms=True, qk_norm="all", act="silu",
        rope_scaling=resid.RopeScaling("yarn", 4.0, 16),
    ),
}


def make_random_model(kind: str, tokenizer: resid.Tokenizer | None = None, seed: int = 0,
                      **sizes) -> resid.Transformer:
    """A small model of the given kind with every parameter random (gains and biases included); `sizes`
    override the config's fields (e.g. d_mlp=8192 for a model whose forward needs much memory)."""
    base = dict(
        architecture=kind, d_model=32, n_layers=3, n_heads=4, n_kv_heads=4, d_head=8, d_mlp=64,
        d_vocab=50257 if tokenizer is not None else 97, n_ctx=64, norm_eps=1e-5,
    )
    config = resid.ModelConfig(**{**base, **RANDOM_CONFIGS[kind], **sizes})
    return randomize(resid.Transformer(config, tokenizer=tokenizer, name=f"random-{kind}"), seed)


def randomize(model: resid.Transformer, seed: int) -> resid.Transformer:
    """Redraw every parameter with a fixed seed: norm gains ~ 1 + N(0, 0.2), everything else ~ N(0, 0.3)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.2 * noise if name.endswith(".w") else 0.3 * noise)
    return model.eval()
