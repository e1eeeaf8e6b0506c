"""A small random mixture-of-experts model built straight from a ModelConfig (no transformers needed), with
sandwich post-norms if asked: the MoE tests' complement to the tiny Mixtral (which has no post-norms)."""

from random_models import randomize

import resid


def make_moe_model(
    post_norms: bool = False, tokenizer: resid.Tokenizer | None = None, seed: int = 0
) -> resid.Transformer:
    config = resid.ModelConfig(
        architecture="moe_random", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_head=8, d_mlp=24,
        d_vocab=50257 if tokenizer is not None else 97, n_ctx=64, norm="rmsnorm", norm_eps=1e-5,
        post_norms=post_norms, n_experts=4, experts_per_token=2,
    )
    return randomize(resid.Transformer(config, tokenizer=tokenizer, name="random-moe"), seed)
