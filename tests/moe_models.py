"""Small random mixture-of-experts models built straight from a ModelConfig (no transformers needed): one with
sandwich post-norms if asked (the MoE tests' complement to the tiny Mixtral, which has no post-norms), and a
DeepSeek-like one (latent attention, a dense first layer, shared experts, grouped sigmoid routing)."""

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


def make_deepseek_model(tokenizer: resid.Tokenizer | None = None, seed: int = 0) -> resid.Transformer:
    """DeepSeek V3-like: latent attention (a query latent, values narrower than keys, interleaved rotary pairs), a
    dense first layer, then 4 routed experts in 2 groups (sigmoid scores, a selection bias) and 1 shared expert."""
    config = resid.ModelConfig(
        architecture="deepseek_random", d_model=32, n_layers=3, n_heads=4, n_kv_heads=4, d_head=10, d_mlp=16,
        d_vocab=50257 if tokenizer is not None else 97, n_ctx=64, norm="rmsnorm", norm_eps=1e-5, rotary_dim=4,
        kv_rank=12, q_rank=10, d_head_v=6, rotary_pairs="interleaved", attn_scale=0.4, n_experts=5,
        n_shared_experts=1, experts_per_token=2, n_dense_layers=1, d_mlp_dense=48, router="sigmoid", router_groups=2,
        router_topk_groups=1, router_group_score="top2", router_bias=True, router_scale=2.0,
    )
    return randomize(resid.Transformer(config, tokenizer=tokenizer, name="random-deepseek"), seed)
