"""A small random mixture-of-experts model built straight from a ModelConfig (no transformers needed), with
sandwich post-norms if asked: the MoE tests' complement to the tiny Mixtral (which has no post-norms)."""

import torch

import resid


def make_moe_model(
    post_norms: bool = False, tokenizer: resid.Tokenizer | None = None, seed: int = 0
) -> resid.Transformer:
    config = resid.ModelConfig(
        architecture="moe_random", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_head=8, d_mlp=24,
        d_vocab=50257 if tokenizer is not None else 97, n_ctx=64, norm="rmsnorm", norm_eps=1e-5,
        post_norms=post_norms, n_experts=4, experts_per_token=2,
    )
    model = resid.Transformer(config, tokenizer=tokenizer, name="random-moe")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.2 * noise if name.endswith(".w") else 0.3 * noise)
    return model.eval()
