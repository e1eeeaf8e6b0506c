"""Parity with Hugging Face transformers on tiny random models of every supported variant: resid.load() of
the saved folder gives the same logits and the same residual stream, unpadded and left-padded."""

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from tiny_fixtures import N_POS, Tiny, random_ids

import resid

ATOL = 1e-4

# (n_heads, n_kv_heads, d_head) the loader must read from each tiny config.json.
EXPECTED_HEADS = {
    "gpt2": (4, 4, 12),
    "llama": (4, 4, 12),
    "llama_gqa_tied": (4, 2, 12),
    "llama_bias": (4, 2, 12),
    "mistral": (4, 2, 12),
    "qwen2": (4, 2, 12),
    "gpt_neox_parallel": (4, 4, 16),
    "gpt_neox_sequential": (4, 4, 16),
    "gemma": (4, 2, 16),  # head_dim 16 != d_model / n_heads = 12
    "llama3_scaled": (4, 2, 12),
    "llama_linear": (4, 2, 12),
    "llama_dynamic": (4, 2, 12),
    "qwen2_sliding": (4, 2, 12),
    "qwen3_yarn": (4, 2, 16),
    "gemma2": (4, 2, 16),
    "gemma3": (4, 2, 16),
    "phi3": (4, 2, 12),
    "olmo2": (4, 2, 12),
    "mixtral": (4, 2, 12),
    "deepseek_v2": (4, 4, 20),  # latent attention: qk_nope 12 + qk_rope 8 per head, every head its own keys
    "deepseek_v3": (4, 4, 20),
    "olmo3": (4, 2, 12),
    "seed_oss": (4, 2, 16),
    "smollm3": (4, 2, 12),
    "exaone4": (4, 2, 12),
    "granite": (4, 2, 12),
    "cohere": (4, 2, 12),
    "cohere2": (4, 2, 16),
    "ernie4_5": (4, 2, 16),
    "starcoder2": (4, 2, 12),
    "stablelm": (4, 2, 16),
    "phi": (4, 4, 16),
    "gptj": (4, 4, 16),
    "opt": (4, 4, 12),
    "helium": (4, 2, 12),
    "glm": (4, 2, 16),
    "glm4": (4, 2, 16),
    "arcee": (4, 2, 12),
    "ministral": (4, 2, 12),
    "olmo": (4, 2, 12),
    "nemotron": (4, 2, 8),
    "gpt_bigcode": (4, 1, 12),
    "gpt_neo": (4, 4, 12),
    "qwen3_moe": (4, 2, 16),
    "olmoe": (4, 2, 12),
    "glm4_moe": (4, 2, 16),
    "falcon": (4, 2, 12),
    "falcon_7b": (4, 1, 12),
    "hunyuan_v1_dense": (4, 2, 12),
    "apertus": (4, 2, 12),
    "qwen2_moe": (4, 2, 12),
    "gpt_oss": (4, 2, 12),
}


def _hf(tiny: Tiny, ids: torch.Tensor, **kwargs):
    with torch.no_grad():
        return tiny.hf(ids, output_hidden_states=True, **kwargs)


def test_logits_and_residual_stream_match_hf(tiny: Tiny):
    ids = random_ids()
    out = _hf(tiny, ids)
    run = tiny.model.run(ids)
    torch.testing.assert_close(run.logits, out.logits, atol=ATOL, rtol=0)
    n_layers = tiny.model.config.n_layers
    assert len(out.hidden_states) == n_layers + 1
    for layer in range(n_layers):
        torch.testing.assert_close(run.stream.resid_pre(layer), out.hidden_states[layer], atol=ATOL, rtol=0)
    # Hugging Face's last entry is taken after the final norm, so compare it with the normalized final() (without
    # the constant the logits are scaled by, which resid folds into that norm: Granite, Cohere).
    normalized, _ = tiny.model.ln_final(run.stream.final())
    normalized = normalized / tiny.model.config.final_norm_multiplier
    torch.testing.assert_close(normalized, out.hidden_states[n_layers], atol=ATOL, rtol=0)


def test_left_padded_batch_matches_hf(tiny: Tiny):
    ids = random_ids(seed=1)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, :5] = False  # the second prompt is 11 tokens, left-padded
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    out = _hf(tiny, ids, attention_mask=mask.long(), position_ids=positions)
    run = tiny.model.run(resid.Tokens(ids, mask, positions))
    if tiny.variant == "llama_dynamic":
        # transformers grows every row's dynamic base with the batch's longest row, resid with each row's own
        # length (a prompt's numbers never depend on its batch): they agree on the longest row only.
        mask = mask.clone()
        mask[1] = False
    torch.testing.assert_close(run.logits[mask], out.logits[mask], atol=ATOL, rtol=0)
    for layer in range(tiny.model.config.n_layers):
        resid_pre = run.stream.resid_pre(layer)
        torch.testing.assert_close(resid_pre[mask], out.hidden_states[layer][mask], atol=ATOL, rtol=0)
    # The padded prompt also equals itself alone, unpadded.
    alone = tiny.model.run(ids[1:, 5:]).logits[0]
    torch.testing.assert_close(run.logits[1, 5:], alone, atol=ATOL, rtol=0)


def test_config_is_read_correctly(tiny: Tiny):
    config, hf = tiny.model.config, tiny.hf.config
    assert (config.n_heads, config.n_kv_heads, config.d_head) == EXPECTED_HEADS[tiny.variant]
    assert config.d_model == hf.hidden_size
    assert config.n_layers == hf.num_hidden_layers
    assert config.d_vocab == 50257 and config.n_ctx == 128
    assert config.architecture == hf.model_type
    assert (tiny.model.unembed.weight is tiny.model.embed.W_E) == hf.tie_word_embeddings
    if not config.kv_rank:  # latent attention's keys (and V3's queries) have no single matrix
        assert tiny.model.blocks[0].attn.W_Q.shape == (config.n_heads, config.d_model, config.d_head)
        assert tiny.model.blocks[0].attn.W_K.shape == (config.n_kv_heads, config.d_model, config.d_head)
    expected = {
        "gpt2": dict(positions="learned", norm="layernorm", block="sequential", act="gelu_new", attn_qkv_bias=True),
        "llama_bias": dict(attn_qkv_bias=True, attn_out_bias=True, mlp_bias=True),
        "mistral": dict(sliding_window=4),
        "qwen2": dict(attn_qkv_bias=True, attn_out_bias=False, sliding_window=None),
        "gpt_neox_parallel": dict(block="parallel", rotary_dim=4, rotary_base=10000.0, act="gelu", gated_mlp=False),
        "gpt_neox_sequential": dict(block="sequential", rotary_dim=8, rotary_base=1000.0, norm="layernorm"),
        "gemma": dict(norm_gain_offset=1.0, embed_scale=48**0.5, act="gelu_new", tie_embeddings=True),
        "llama": dict(rotary_base=500.0, tie_embeddings=False),
        "llama3_scaled": dict(rope_scaling=resid.RopeScaling("llama3", 8.0, 16, low_freq_factor=1.0,
                                                             high_freq_factor=4.0)),
        "llama_dynamic": dict(rope_scaling=resid.RopeScaling("dynamic", 16.0, 8)),  # n_ctx 8 * 16: the base grows
        "qwen2_sliding": dict(sliding_window=4, layer_types=("full", "sliding"), attn_qkv_bias=True),
        "qwen3_yarn": dict(qk_norm="head", attn_qkv_bias=False, layer_types=None, sliding_window=None),
        "gemma2": dict(post_norms=True, attn_softcap=5.0, final_softcap=3.0, attn_scale=24**-0.5,
                       layer_types=("sliding", "full"), qk_norm="none"),
        "gemma3": dict(post_norms=True, qk_norm="head", rotary_base=100000.0, rotary_base_local=1000.0,
                       rope_scaling=resid.RopeScaling("linear", 4.0, None), attn_softcap=None, final_softcap=None),
        "phi3": dict(rotary_dim=6, sliding_window=None),
        "olmo2": dict(pre_norms=False, post_norms=True, qk_norm="all"),
        # yarn factor 4 with mscale_all_dim 1: the scale is 20^-0.5 (0.1 ln 4 + 1)^2
        "deepseek_v2": dict(kv_rank=16, q_rank=0, d_head_v=10, rotary_dim=8, rotary_pairs="interleaved",
                            n_experts=6, n_shared_experts=2, n_dense_layers=1, d_mlp=24, d_mlp_dense=96,
                            router="softmax", router_groups=2, router_topk_groups=1, router_group_score="max",
                            router_renormalize=False, router_scale=1.5, router_bias=False),
        "deepseek_v3": dict(kv_rank=16, q_rank=24, rotary_pairs="halves", n_experts=5, n_shared_experts=1,
                            n_dense_layers=0, router="sigmoid", router_group_score="top2", router_renormalize=True,
                            router_scale=2.5, router_bias=True, attn_scale=20**-0.5),
        "olmo3": dict(pre_norms=False, post_norms=True, qk_norm="all", layer_types=("sliding", "full"),
                      sliding_window=4),
        "seed_oss": dict(attn_qkv_bias=True, attn_out_bias=True),
        "smollm3": dict(nope_layers=(1,)),
        "exaone4": dict(pre_norms=False, post_norms=True, qk_norm="head", layer_types=("sliding", "full"),
                        nope_layers=(1,)),
        "granite": dict(embed_scale=3.0, attn_scale=0.2, final_norm_multiplier=0.25),
        "cohere": dict(block="parallel", norm="layernorm", final_norm_multiplier=0.5, nope_layers=()),
        "cohere2": dict(block="parallel", layer_types=("sliding", "full"), nope_layers=(1,)),
        "ernie4_5": dict(attn_qkv_bias=True, attn_out_bias=True, mlp_bias=True),
        "starcoder2": dict(norm="layernorm", gated_mlp=False, mlp_bias=True, sliding_window=4),
        "stablelm": dict(block="parallel", rotary_dim=4, attn_qkv_bias=True, attn_out_bias=False),
        "phi": dict(block="parallel", rotary_dim=8, unembed_bias=True, gated_mlp=False),
        "gptj": dict(block="parallel", rotary_dim=8, unembed_bias=True, attn_qkv_bias=False),
        "opt": dict(positions="learned", act="relu", gated_mlp=False),
        "helium": dict(attn_qkv_bias=True, attn_out_bias=False),
        "glm": dict(rotary_dim=8, attn_qkv_bias=True, attn_out_bias=False, post_norms=False),
        "glm4": dict(rotary_dim=8, post_norms=True, pre_norms=True),
        "arcee": dict(act="relu2", gated_mlp=False),
        "ministral": dict(sliding_window=4, layer_types=("sliding", "full")),
        "olmo": dict(norm="layernorm", norm_eps=1e-5),
        "nemotron": dict(norm="layernorm", norm_gain_offset=1.0, act="relu2", gated_mlp=False, rotary_dim=4),
        "gpt_bigcode": dict(positions="learned", n_kv_heads=1, attn_qkv_bias=True),
        "gpt_neo": dict(positions="learned", attn_scale=1.0, sliding_window=4, layer_types=("sliding", "full")),
        "qwen3_moe": dict(qk_norm="head", n_experts=4, experts_per_token=2, d_mlp=24, n_dense_layers=1,
                          d_mlp_dense=96, router_renormalize=True),
        "olmoe": dict(qk_norm="all", n_experts=4, n_dense_layers=0, router_renormalize=False),
        "glm4_moe": dict(qk_norm="head", attn_qkv_bias=True, rotary_dim=8, n_experts=5, n_shared_experts=1,
                         n_dense_layers=1, router="sigmoid", router_bias=True, router_groups=2,
                         router_group_score="top2", router_scale=1.5),
        "falcon": dict(block="parallel", norm="layernorm", attn_qkv_bias=True, mlp_bias=True, gated_mlp=False),
        "falcon_7b": dict(block="parallel", n_kv_heads=1, attn_qkv_bias=False, tie_embeddings=True),
        "hunyuan_v1_dense": dict(qk_norm="head", qk_norm_after_rotary=True),
        "apertus": dict(act="xielu", gated_mlp=False, qk_norm="head"),
        "qwen2_moe": dict(attn_qkv_bias=True, n_experts=6, n_shared_experts=2, shared_expert_gate=True, d_mlp=24),
        "gpt_oss": dict(attn_sinks=True, act="clamped_swiglu", glu_limit=0.5, expert_bias=True, router_logit_bias=True,
                        layer_types=("sliding", "full"), attn_out_bias=True),
    }.get(tiny.variant, {})
    assert {name: getattr(config, name) for name in expected} == expected


@pytest.mark.parametrize("tiny", ["mistral"], indirect=True)
def test_sliding_window_matters_in_the_mistral_test(tiny: Tiny):
    """Guard for the parity tests above: with a window of 4 over 16 tokens, the window changes the logits,
    so matching Hugging Face means resid applies it."""
    ids = random_ids()
    windowed = _hf(tiny, ids).logits
    tiny.hf.config.sliding_window = None
    try:
        full = _hf(tiny, ids).logits
    finally:
        tiny.hf.config.sliding_window = 4
    assert N_POS > 4
    assert (windowed - full).abs().max() > 1e-2


def _rewrite_config(tiny: Tiny, folder: Path, edit) -> Path:
    shutil.copytree(tiny.folder, folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


LEGACY_CONFIGS = {
    # Pythia's config.json predates rope_parameters.
    "gpt_neox_sequential": lambda c: c.update(rotary_pct=0.5, rotary_emb_base=1000, rope_parameters=None),
    # Released Gemma configs say "gelu" and mean the tanh approximation.
    "gemma": lambda c: c.update(hidden_act="gelu"),
    # The original GPT-2 config.json also has n_ctx and no tie_word_embeddings.
    "gpt2": lambda c: (c.update(n_ctx=c["n_positions"]), c.pop("tie_word_embeddings")),
}


@pytest.mark.parametrize("tiny", sorted(LEGACY_CONFIGS), indirect=True)
def test_legacy_config_names_read_as_hf_reads_them(tiny: Tiny, tmp_path: Path):
    folder = _rewrite_config(tiny, tmp_path / "legacy", LEGACY_CONFIGS[tiny.variant])
    assert resid.load(folder).config == tiny.model.config
    # transformers reads the legacy file as the modern one, so the parity tests above cover it too.
    legacy, modern = transformers.AutoConfig.from_pretrained(folder), tiny.hf.config
    for name in ("rope_parameters", "hidden_act", "tie_word_embeddings", "n_positions"):
        assert getattr(legacy, name, None) == getattr(modern, name, None), name
