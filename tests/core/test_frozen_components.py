"""The frozen replacement model is the components' own: with its patterns and norm scales frozen from a run, a
block's frozen forward (the real MLP in place of a replacement) reproduces the block, the frozen attention its
write and the frozen readout the uncapped logits, for every family (pre-norm, GPT-2 biases and learned positions,
parallel, Gemma gains, sandwich norms with soft caps, post-norms only, GQA, mixture of experts, DeepSeek's latent
attention and shared experts, post-LN); and every
adjoint is the transpose of its map: <map(x), g> == <x, adjoint(g)> on random x and g (random patterns that are
not causal, so a missing transpose shows)."""

import dataclasses

import pytest
import torch
from numerics import TINY
from random_models import make_random_model

import resid
from resid.capture import Capture
from resid.components.block import Block

IDS = [11, 5, 7, 2, 9, 31, 3]
N = len(IDS)
FAMILIES = ["llama_gqa", "gpt2_like", "neox_parallel", "gemma_like", "gemma3_like", "olmo2_like"]


def _post_ln_model() -> resid.Transformer:
    """BERT-like: post-LN blocks (the residual normed after each write), bidirectional, learned positions."""
    return make_random_model("gpt2_like", pre_norms=False, post_ln=True, causal=False, final_norm=False,
                             embed_norm=True)


def _issue_58_moe() -> resid.Transformer:
    """gpt-oss's parts (sinks, clamped SwiGLU experts with biases, a biased router) with Qwen2 MoE's gated shared
    expert and Hunyuan's q/k norms after a rotary that SmolLM3's NoPE layer skips."""
    from random_models import randomize
    config = resid.ModelConfig(
        architecture="issue58_random", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_head=8, d_mlp=24,
        d_vocab=97, n_ctx=64, norm="rmsnorm", norm_eps=1e-5, attn_sinks=True, attn_qkv_bias=True, qk_norm="head",
        qk_norm_after_rotary=True, nope_layers=(1,), n_experts=5, n_shared_experts=1, shared_expert_gate=True,
        experts_per_token=2, act="clamped_swiglu", glu_limit=0.5, expert_bias=True, router_logit_bias=True,
    )
    return randomize(resid.Transformer(config, name="random-issue58"), 0)


def _model(kind: str) -> resid.Transformer:
    if kind == "issue58":
        return _issue_58_moe()
    if kind == "moe":
        from moe_models import make_moe_model
        return make_moe_model(post_norms=True)
    if kind == "deepseek":
        from moe_models import make_deepseek_model
        return make_deepseek_model()
    return _post_ln_model() if kind == "post_ln" else make_random_model(kind)


def _frozen_run(model: resid.Transformer):
    """The run with every block's frozen sites captured (and the residual writes), and its frozen values."""
    fields: dict[str, set[str]] = {"attn": {"out"}, "mlp": {"out"}}
    for block in model.blocks:
        for site in block.frozen_sites():
            fields[site.part].add(site.what)
    ids = torch.tensor([IDS]) % model.config.d_vocab
    run = model.run(ids, capture=Capture(attn=fields["attn"], mlp=fields["mlp"]))
    frozen = {site: run.read(site)[0].float() for block in model.blocks for site in block.frozen_sites()}
    return run, frozen


def _real_mlp(block, frozen):
    """The block's own MLP sublayer as the replacement: pre-norm (frozen), the MLP, post-norm (frozen)."""
    def write(resid: torch.Tensor) -> torch.Tensor:
        normalized = block.frozen_pre("mlp", resid, frozen)
        out = block.mlp(normalized[None], frozenset(), ())[0][0]
        return block.frozen_post("mlp", out, frozen)
    return write


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.double() * b.double()).sum()


def _assert_adjoint(forward: torch.Tensor, g: torch.Tensor, x: torch.Tensor, pulled: torch.Tensor) -> None:
    """<forward, g> == <x, pulled>, to float32 rounding relative to the size of the terms summed."""
    left, right = _dot(forward, g), _dot(x, pulled)
    size = (forward.double().abs() * g.double().abs()).sum()
    assert abs(float(left - right)) <= 1e-5 * float(size), (float(left), float(right))


@pytest.mark.parametrize("kind", [*FAMILIES, "moe", "deepseek", "post_ln", "issue58"])
def test_the_frozen_block_is_the_block(kind) -> None:
    """Each block's frozen forward with the real MLP gives resid_post, its frozen attention the attention's write,
    and the frozen readout (final norm, unembedding before any soft cap) the uncapped logits."""
    with torch.no_grad():
        model = _model(kind)
        run, frozen = _frozen_run(model)
        stream = run.stream
        for layer, block in enumerate(model.blocks):
            resid_pre = stream.resid_pre(layer)[0]
            torch.testing.assert_close(block.frozen_attn(resid_pre, frozen), stream.layers[layer].attn.out[0], **TINY)
            resid_post = block.frozen(resid_pre, frozen, _real_mlp(block, frozen))
            torch.testing.assert_close(resid_post, stream.resid_post(layer)[0], **TINY)
        if model.config.head != "lm":
            return
        normalized = model.readout.frozen(stream.final()[0], stream.final_norm_scale[0])
        uncapped = run.uncapped_logits if run.uncapped_logits is not None else run.logits
        torch.testing.assert_close(model.readout.unembed.frozen(normalized), uncapped[0].float(), **TINY)


def test_the_frozen_values_are_keyed_by_site() -> None:
    """A sandwich-norm block freezes its pattern and all four norm scales, by Site; a post-norm-only block has no
    pre-norm scales; cross-attention is refused with what the frozen block covers."""
    gemma = make_random_model("gemma3_like").blocks[1]
    assert {s.label for s in gemma.frozen_sites()} == {
        "layers[1].attn.pattern", "layers[1].attn.norm_scale", "layers[1].attn.post_norm_scale",
        "layers[1].mlp.norm_scale", "layers[1].mlp.post_norm_scale"}
    olmo = make_random_model("olmo2_like").blocks[0]
    assert {s.what for s in olmo.frozen_sites()} == {"pattern", "post_norm_scale"}


def test_a_block_with_cross_attention_is_refused() -> None:
    config = dataclasses.replace(make_random_model("gpt2_like").config, cross_attention=True)
    with pytest.raises(resid.ResidError, match=r"Layer 0 has cross-attention.*the frozen block covers decoder-only "
                                               r"and encoder stacks"):
        Block(config, 0).frozen_sites()


def _random_frozen(block, n: int, generator: torch.Generator) -> dict:
    """Random frozen values for `block`: positive scales, and patterns whose rows are distributions over every
    position (not causal, so that P and its transpose differ everywhere)."""
    values = {}
    for site in block.frozen_sites():
        if site.what == "pattern":
            values[site] = torch.softmax(torch.randn(block.attn.n_heads, n, n, generator=generator), -1)
        else:
            values[site] = torch.rand(n, 1, generator=generator) + 0.5
    return values


@pytest.mark.parametrize("kind", [*FAMILIES, "deepseek", "post_ln"])
def test_every_adjoint_is_the_transpose_of_its_map(kind) -> None:
    """Norms (frozen, standardized, centred, linear), attention's value path, each block's pieces and its whole
    walk (with a random linear replacement of the MLP), the final norm and the uncapped unembedding."""
    generator = torch.Generator().manual_seed(1)
    model = _model(kind)
    d = model.config.d_model

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    with torch.no_grad():
        for block in model.blocks:
            frozen = _random_frozen(block, N, generator)
            x, g = randn(N, d), randn(3, N, d)
            # attention's value path alone (the pattern frozen)
            pattern = frozen[resid.Site(block.layer, "attn", field="pattern")]
            extra = {field: frozen[resid.Site(block.layer, "attn", field=field)] for field in block.attn.frozen_fields}
            _assert_adjoint(block.attn.frozen(x, pattern, constants=False, **extra)[None].expand_as(g), g, x,
                            block.attn.frozen_adjoint(g, pattern, **extra).sum(0))
            for norm in (block.ln_attn, block.ln_attn_post, block.ln_mlp, block.ln_attn_resid):
                if norm is None:
                    continue
                scale = torch.rand(N, 1, generator=generator) + 0.5
                _assert_adjoint(norm.frozen(x, scale, constants=False), g[0], x, norm.pull_back(g[0], scale))
                _assert_adjoint(norm.standardized(x, scale), g[0], x, norm.standardized_adjoint(g[0], scale))
                _assert_adjoint(norm.centred(x), g[0], x, norm.centred(g[0]))
                _assert_adjoint(norm.linear(x), g[0], x, norm.fold(g[0]))
            # the block's pieces
            _assert_adjoint(block.frozen_attn(x, frozen, constants=False)[None].expand_as(g), g, x,
                            block.frozen_attn_adjoint(g, frozen).sum(0))
            for part in ("attn", "mlp"):
                _assert_adjoint(block.frozen_pre(part, x, frozen, constants=False), g[0], x,
                                block.frozen_pre_adjoint(part, g[0], frozen))
                _assert_adjoint(block.frozen_post(part, x, frozen, constants=False), g[0], x,
                                block.frozen_post_adjoint(part, g[0], frozen))
                if getattr(block, f"ln_{part}") is not None:  # a pre-norm: its standardized form, and rows
                    _assert_adjoint(block.frozen_pre(part, x, frozen, standardized=True), g[0], x,
                                    block.frozen_pre_adjoint(part, g[0], frozen, standardized=True))
                    positions = torch.tensor([3, 0, 3])  # one row per position, as a feature target reads
                    rows = randn(3, d)
                    reads = block.frozen_pre(part, x, frozen, constants=False)[positions]
                    on_x = torch.zeros(N, d).index_add_(0, positions, block.frozen_pre_adjoint(part, rows, frozen,
                                                                                               positions))
                    _assert_adjoint(reads, rows, x, on_x)
            # the whole block, its MLP replaced by a random linear map of what the MLP reads
            w = randn(d, d) / d**0.5

            def mlp(resid, block=block, frozen=frozen, w=w):
                return block.frozen_pre("mlp", resid, frozen, constants=False) @ w

            def mlp_adjoint(g_write, g_read, block=block, frozen=frozen, w=w):
                return g_read + block.frozen_pre_adjoint("mlp", g_write @ w.T, frozen)

            _assert_adjoint(block.frozen(x, frozen, mlp, constants=False)[None].expand_as(g), g, x,
                            block.frozen_adjoint(g, frozen, mlp_adjoint).sum(0))
        readout, scale = model.readout, torch.rand(N, 1, generator=generator) + 0.5
        x, u = randn(N, d), randn(N, d)
        _assert_adjoint(readout.frozen(x, scale, constants=False), u, x, readout.frozen_adjoint(u, scale))
        if model.config.head == "lm":
            logits = randn(N, model.config.d_vocab)
            _assert_adjoint(readout.unembed.frozen(x, constants=False), logits, x,
                            readout.unembed.frozen_adjoint(logits))
