"""Tiny random-weight Hugging Face models, one per architecture variant resid reads, saved as local folders.

Not a test file: the parity, exactness and bad-weights tests build their folders with `build(variant, folder)`.
Every model has the GPT-2 vocabulary (50257) so the GPT-2 tokenizer.json can sit next to it, a small width
(48-64), 2 layers and 128 positions. All parameters are re-drawn with a fixed seed and a large spread
(norm gains around 1, biases around 0), so that a mis-mapped bias, gain or transposed matrix shows in the logits.
"""

import shutil
from pathlib import Path

import torch
import transformers
from torch import nn

TOKENIZER = Path(__file__).resolve().parent / "data" / "gpt2-tokenizer" / "tokenizer.json"
D_VOCAB = 50257
N_CTX = 128

VARIANTS: list[str] = [
    "gpt2",
    "llama",
    "llama_gqa_tied",
    "llama_bias",
    "mistral",
    "qwen2",
    "gpt_neox_parallel",
    "gpt_neox_sequential",
    "gemma",
    "llama3_scaled",
    "llama_linear",
    "llama_dynamic",
    "qwen2_sliding",
    "qwen3_yarn",
    "gemma2",
    "gemma3",
    "phi3",
    "olmo2",
    "mixtral",
    "deepseek_v3",
    *(FAMILIES := [  # issue 58: one tiny model per added model_type (tests/conftest.py: the fast tests it runs)
        "olmo3", "seed_oss", "smollm3", "exaone4", "granite", "cohere", "cohere2", "ernie4_5", "starcoder2",
        "stablelm", "phi", "gptj", "opt", "helium", "glm", "glm4", "arcee", "ministral", "olmo", "nemotron",
        "gpt_bigcode", "gpt_neo", "qwen3_moe", "olmoe", "glm4_moe",
        "falcon", "falcon_7b", "hunyuan_v1_dense", "apertus", "qwen2_moe",
        "gpt_oss",
    ]),
]
# Built on request only (tests/load/test_deepseek.py: parity, routing, latent KV), not by every test parametrized
# over VARIANTS: DeepSeek V2 shares V3's blocks and differs in routing and rotary layout, which those tests cover,
# and a second MoE variant in every architecture test costs the suite about 40 s.
ON_REQUEST: list[str] = ["deepseek_v2"]

_COMMON = dict(vocab_size=D_VOCAB, max_position_embeddings=N_CTX, num_hidden_layers=2, intermediate_size=96)
_LLAMA = dict(_COMMON, hidden_size=48, num_attention_heads=4, rms_norm_eps=1e-6)


def hf_config(variant: str) -> transformers.PretrainedConfig:
    """The Hugging Face config of the tiny `variant`."""
    if variant == "gpt2":
        return transformers.GPT2Config(
            vocab_size=D_VOCAB, n_positions=N_CTX, n_embd=48, n_layer=2, n_head=4, activation_function="gelu_new"
        )
    if variant == "llama":
        return transformers.LlamaConfig(
            **_LLAMA,
            num_key_value_heads=4,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        )
    if variant == "llama_gqa_tied":
        return transformers.LlamaConfig(**_LLAMA, num_key_value_heads=2, tie_word_embeddings=True)
    if variant == "llama_bias":
        return transformers.LlamaConfig(
            **_LLAMA, num_key_value_heads=2, tie_word_embeddings=False, attention_bias=True, mlp_bias=True
        )
    if variant == "mistral":
        # A window of 4 keys, far shorter than the 16-token test sequences, so the window changes the logits.
        return transformers.MistralConfig(**_LLAMA, num_key_value_heads=2, tie_word_embeddings=False, sliding_window=4)
    if variant == "qwen2":
        return transformers.Qwen2Config(
            **_LLAMA, num_key_value_heads=2, tie_word_embeddings=False, use_sliding_window=False
        )
    if variant in ("gpt_neox_parallel", "gpt_neox_sequential"):
        # d_head = 16, so both partial rotary fractions give an even number of rotating dims (4 and 8).
        parallel = variant == "gpt_neox_parallel"
        return transformers.GPTNeoXConfig(
            **_COMMON,
            hidden_size=64,
            num_attention_heads=4,
            hidden_act="gelu",
            use_parallel_residual=parallel,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0 if parallel else 1000.0,
                "partial_rotary_factor": 0.25 if parallel else 0.5,
            },
        )
    if variant == "gemma":
        # head_dim 16 != hidden_size / heads = 12, as in the real Gemmas.
        return transformers.GemmaConfig(
            **_LLAMA, num_key_value_heads=2, head_dim=16, hidden_act="gelu_pytorch_tanh", tie_word_embeddings=True
        )
    return _modern_config(variant)


def _modern_config(variant: str) -> transformers.PretrainedConfig:
    """The families of issue 10: rope scaling, per-layer windows, q/k norms, post-norms, soft caps, fused weights."""
    gqa = dict(_LLAMA, num_key_value_heads=2, tie_word_embeddings=False)
    if variant == "llama3_scaled":
        # original context 16 of 128 positions, so the long wavelengths are divided by the factor
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
        return transformers.LlamaConfig(**gqa, rope_parameters=rope)
    if variant == "llama_linear":
        rope = {"rope_type": "linear", "rope_theta": 1000.0, "factor": 4.0}
        return transformers.LlamaConfig(**gqa, rope_parameters=rope)
    if variant == "llama_dynamic":
        # max_position_embeddings 8 < the 16-token test sequences, so the dynamic base grows with the length
        return transformers.LlamaConfig(
            **{**gqa, "max_position_embeddings": 8},
            rope_parameters={"rope_type": "dynamic", "rope_theta": 1000.0, "factor": 16.0},
        )
    if variant == "qwen2_sliding":
        # layer 0 attends globally, layer 1 within a window of 4 keys (layers >= max_window_layers slide)
        return transformers.Qwen2Config(**gqa, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    if variant == "qwen3_yarn":
        rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32}
        return transformers.Qwen3Config(**gqa, head_dim=16, rope_parameters=rope)
    if variant == "gemma2":
        # small caps, so that both soft caps bend the numbers; a window of 4 on the sliding layer
        return transformers.Gemma2Config(
            **{**gqa, "tie_word_embeddings": True}, head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
            attn_logit_softcapping=5.0, final_logit_softcapping=3.0, hidden_activation="gelu_pytorch_tanh",
        )
    if variant == "gemma3":
        rope = {"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 100000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}}
        return transformers.Gemma3TextConfig(
            **{**gqa, "tie_word_embeddings": True}, head_dim=16, query_pre_attn_scalar=16, sliding_window=4,
            layer_types=["sliding_attention", "full_attention"], rope_parameters=rope,
        )
    if variant == "phi3":
        return transformers.Phi3Config(
            **gqa, partial_rotary_factor=0.5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            pad_token_id=0,
        )
    if variant == "olmo2":
        return transformers.Olmo2Config(**gqa, eos_token_id=50256, pad_token_id=50256)
    if variant == "mixtral":
        return transformers.MixtralConfig(**gqa, num_local_experts=4, num_experts_per_tok=2)
    if variant.startswith("deepseek"):
        return deepseek_config(variant)
    if variant in FAMILIES:
        return family_config(variant)
    raise ValueError(f"unknown tiny variant {variant!r}; choose from {VARIANTS + ON_REQUEST}")


def deepseek_config(variant: str, **changes) -> transformers.PretrainedConfig:
    """DeepSeek V2: queries projected directly, a yarn rotary with both mscales (so the softmax scale carries
    mscale_all_dim), softmax routing limited to 1 of 2 groups, 2 shared experts, a dense first layer, DeepSeek's
    interleaved rotary pairs. V3: a query latent, sigmoid routing with the selection bias, groups scored by their two
    best experts, renormalized and scaled weights, rotate_half pairs (rope_interleave false), experts in both
    layers. Both: per-head values narrower than the keys, every head's keys and values from a 16-wide latent."""
    mla = dict(_COMMON, hidden_size=48, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16,
               qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10, moe_intermediate_size=24, n_routed_experts=4,
               num_experts_per_tok=2, n_group=2, topk_group=1, tie_word_embeddings=False, rms_norm_eps=1e-5)
    if variant == "deepseek_v2":
        rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
                "mscale": 0.707, "mscale_all_dim": 1.0}
        fields = dict(mla, q_lora_rank=None, topk_method="group_limited_greedy", n_shared_experts=2,
                      first_k_dense_replace=1, routed_scaling_factor=1.5, rope_parameters=rope)
        return transformers.DeepseekV2Config(**{**fields, **changes})
    fields = dict(mla, q_lora_rank=24, n_shared_experts=1, first_k_dense_replace=0, norm_topk_prob=True,
                  routed_scaling_factor=2.5, rope_interleave=False)
    return transformers.DeepseekV3Config(**{**fields, **changes})


def family_config(variant: str) -> transformers.PretrainedConfig:
    """The model types of issue 58, each small and with what distinguishes it switched on: windows of 4 keys on
    sliding layers (16-token tests), NoPE layers, multipliers far from 1, biases, partial and interleaved rotary."""
    gqa = dict(_LLAMA, num_key_value_heads=2, tie_word_embeddings=False)
    layernorm = {k: v for k, v in gqa.items() if k != "rms_norm_eps"}
    hybrid = dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"])
    neox = dict(_COMMON, hidden_size=64, num_attention_heads=4)  # d_head 16: partial rotary of 4 or 8 dims
    if variant == "olmo3":
        return transformers.Olmo3Config(**gqa, **hybrid)
    if variant == "seed_oss":
        return transformers.SeedOssConfig(**gqa, head_dim=16, attention_bias=True, attention_out_bias=True)
    if variant == "smollm3":
        return transformers.SmolLM3Config(**gqa, no_rope_layers=[1, 0], pad_token_id=None, bos_token_id=None,
                                          eos_token_id=None)
    if variant == "exaone4":
        return transformers.Exaone4Config(**gqa, **hybrid)
    if variant == "granite":
        return transformers.GraniteConfig(**gqa, embedding_multiplier=3.0, attention_multiplier=0.2,
                                          residual_multiplier=0.5, logits_scaling=4.0)
    if variant == "cohere":
        return transformers.CohereConfig(**{**layernorm, "tie_word_embeddings": True}, logit_scale=0.5)
    if variant == "cohere2":
        return transformers.Cohere2Config(**{**layernorm, "tie_word_embeddings": True}, logit_scale=0.5, head_dim=16,
                                          **hybrid)
    if variant == "ernie4_5":
        return transformers.Ernie4_5Config(**gqa, head_dim=16, use_bias=True)
    if variant == "starcoder2":
        return transformers.Starcoder2Config(**{**layernorm, "tie_word_embeddings": True}, sliding_window=4)
    if variant == "stablelm":
        return transformers.StableLmConfig(**neox, num_key_value_heads=2, use_qkv_bias=True,
                                           use_parallel_residual=True, partial_rotary_factor=0.25)
    if variant == "phi":
        return transformers.PhiConfig(**neox, partial_rotary_factor=0.5)
    if variant == "gptj":
        return transformers.GPTJConfig(vocab_size=D_VOCAB, n_positions=N_CTX, n_embd=64, n_layer=2, n_head=4,
                                       rotary_dim=8, n_inner=96)
    if variant == "opt":
        return transformers.OPTConfig(vocab_size=D_VOCAB, max_position_embeddings=N_CTX, hidden_size=48,
                                      num_hidden_layers=2, num_attention_heads=4, ffn_dim=96,
                                      word_embed_proj_dim=48)
    if variant == "helium":
        return transformers.HeliumConfig(**gqa, head_dim=12, attention_bias=True)
    if variant in ("glm", "glm4"):
        config = transformers.GlmConfig if variant == "glm" else transformers.Glm4Config
        return config(**gqa, head_dim=16, partial_rotary_factor=0.5, attention_bias=True, pad_token_id=None,
                      eos_token_id=50256)  # GLM's default is a list of ids past the GPT-2 vocabulary
    if variant == "arcee":
        # bos and eos default to 128000 and 128001, past a tiny vocabulary
        return transformers.ArceeConfig(**gqa, head_dim=12, bos_token_id=None, eos_token_id=None)
    if variant == "ministral":
        return transformers.MinistralConfig(**gqa, head_dim=12, **hybrid)
    if variant == "olmo":
        return transformers.OlmoConfig(**{k: v for k, v in layernorm.items()}, pad_token_id=None, bos_token_id=None,
                                       eos_token_id=None)
    if variant == "nemotron":
        # d_model 32: squared-ReLU activations grow fast, and the tests compare logits within 1e-5
        return transformers.NemotronConfig(**{**neox, "hidden_size": 32}, num_key_value_heads=2, head_dim=8,
                                           partial_rotary_factor=0.5, tie_word_embeddings=False, bos_token_id=None,
                                           eos_token_id=None)
    if variant == "gpt_bigcode":
        return transformers.GPTBigCodeConfig(vocab_size=D_VOCAB, n_positions=N_CTX, n_embd=48, n_layer=2, n_head=4,
                                             n_inner=96, multi_query=True)
    if variant == "gpt_neo":
        return transformers.GPTNeoConfig(vocab_size=D_VOCAB, max_position_embeddings=N_CTX, hidden_size=48,
                                         num_layers=2, num_heads=4, intermediate_size=96, window_size=4,
                                         attention_types=[[["local", "global"], 1]])
    if variant == "qwen3_moe":  # a dense first layer (mlp_only_layers), experts narrower than it
        return transformers.Qwen3MoeConfig(**gqa, head_dim=16, moe_intermediate_size=24, num_experts=4,
                                           num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[0])
    if variant == "olmoe":
        return transformers.OlmoeConfig(**gqa, num_experts=4, num_experts_per_tok=2, pad_token_id=None,
                                        eos_token_id=None)
    if variant == "glm4_moe":  # a dense first layer, a shared expert, 2 groups of 2 routed experts
        return transformers.Glm4MoeConfig(**gqa, head_dim=16, moe_intermediate_size=24, n_routed_experts=4,
                                          num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                                          n_group=2, topk_group=1, routed_scaling_factor=1.5, use_qk_norm=True,
                                          attention_bias=True, partial_rotary_factor=0.5, pad_token_id=None)
    if variant in ("falcon", "falcon_7b"):  # the new decoder (GQA, two norms, biases), and Falcon-7B's multi-query
        new = variant == "falcon"
        return transformers.FalconConfig(vocab_size=D_VOCAB, max_position_embeddings=N_CTX, hidden_size=48,
                                         num_hidden_layers=2, num_attention_heads=4, ffn_hidden_size=96,
                                         new_decoder_architecture=new, num_kv_heads=2 if new else None,
                                         multi_query=not new, bias=new, parallel_attn=True)
    if variant == "hunyuan_v1_dense":
        return transformers.HunYuanDenseV1Config(**gqa, head_dim=12, pad_token_id=None, eos_token_id=None,
                                                 bos_token_id=None)
    if variant == "qwen2_moe":  # a shared MLP twice the routed width: two shared experts under one gate
        return transformers.Qwen2MoeConfig(**gqa, moe_intermediate_size=24, shared_expert_intermediate_size=48,
                                           num_experts=4, num_experts_per_tok=2, pad_token_id=None, eos_token_id=None,
                                           bos_token_id=None)
    if variant == "gpt_oss":  # sinks, a sliding layer of 4 keys, yarn, clamped SwiGLU experts (a low clamp: it acts)
        rope = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 32, "rope_theta": 10000.0}
        return transformers.GptOssConfig(**{**gqa, "intermediate_size": 24}, head_dim=12, num_local_experts=4,
                                         num_experts_per_tok=2, sliding_window=4, rope_parameters=rope,
                                         swiglu_limit=0.5, layer_types=["sliding_attention", "full_attention"])
    if variant == "apertus":
        rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
        return transformers.ApertusConfig(**gqa, rope_parameters=rope, pad_token_id=None, eos_token_id=None,
                                          bos_token_id=None, dtype=torch.float32)
    raise ValueError(f"unknown family variant {variant!r}")


def _reinit(model: nn.Module, seed: int) -> None:
    """Redraw every parameter: norm gains ~ 1 + N(0, 0.2) (Gemma stores gain - 1, so ~ N(0, 0.2)), everything
    else ~ N(0, 0.15), biases included."""
    generator = torch.Generator().manual_seed(seed)
    gemma_gain = type(model).__name__.startswith("Gemma")  # Gemma 1-3 store gain - 1
    with torch.no_grad():
        for module in model.modules():
            is_norm = "Norm" in type(module).__name__
            for name, param in module.named_parameters(recurse=False):
                noise = torch.randn(param.shape, generator=generator)
                if is_norm and name == "weight":
                    param.copy_((0.0 if gemma_gain else 1.0) + 0.2 * noise)
                else:
                    param.copy_(0.15 * noise)
            for name, buffer in module.named_buffers(recurse=False):
                if name == "e_score_correction_bias":  # DeepSeek V3's selection bias, a buffer: make it choose
                    buffer.copy_(0.3 * torch.randn(buffer.shape, generator=generator))


def build(variant: str, folder: Path, config: transformers.PretrainedConfig | None = None
          ) -> transformers.PreTrainedModel:
    """Build the tiny `variant` (or `config`, another config of it: benchmarks/bench_families.py widens them),
    save it (safetensors + the GPT-2 tokenizer.json) into `folder`, and return the Hugging Face model in eval
    mode, float32, with eager attention."""
    config = hf_config(variant) if config is None else config
    seed = (VARIANTS + ON_REQUEST).index(variant)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    _reinit(model, seed=1000 + seed)
    model.eval()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    transformers.utils.logging.disable_progress_bar()
    model.save_pretrained(folder, safe_serialization=True)
    shutil.copy(TOKENIZER, folder / "tokenizer.json")
    return model


# Where each family keeps its blocks and sublayers, for hooks in the tests.


def hf_layers(model: transformers.PreTrainedModel) -> nn.ModuleList:
    base = model.base_model
    base = base.decoder if hasattr(base, "decoder") else base  # OPT
    return base.h if hasattr(base, "h") else base.layers


def hf_attn(model: transformers.PreTrainedModel, layer: int) -> nn.Module:
    block = hf_layers(model)[layer]
    for name in ("self_attn", "attn", "attention", "self_attention"):
        if hasattr(block, name):
            return getattr(block, name)
    raise AttributeError(f"no attention module in {type(block).__name__}")


def hf_mlp(model: transformers.PreTrainedModel, layer: int) -> nn.Module:
    """The MLP module (OPT has none: its fc2, whose output is the MLP's whole write)."""
    block = hf_layers(model)[layer]
    return block.mlp if hasattr(block, "mlp") else block.fc2


def hf_final_norm(model: transformers.PreTrainedModel) -> nn.Module:
    base = model.base_model
    base = base.decoder if hasattr(base, "decoder") else base  # OPT
    for name in ("norm", "ln_f", "final_layer_norm", "final_layernorm"):
        if hasattr(base, name):
            return getattr(base, name)
    raise AttributeError(f"no final norm in {type(base).__name__}")
