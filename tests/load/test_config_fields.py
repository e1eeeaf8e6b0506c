"""The config allow-list: every config.json field is read by its family or known to be harmless; anything else
(a new rope type, norm placement or attention variant) is refused with an error naming it, never loaded as a
silently wrong model. Every tiny model's own config.json (as transformers writes it) passes."""

import json
from pathlib import Path

import pytest
from tiny_models import VARIANTS, hf_config

import resid
from resid.load.families.model_types import family_for


def _folder_with(tmp_path: Path, variant: str, **changes) -> Path:
    hf_config(variant).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(changes)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_field_transformers_writes_is_known(tmp_path: Path, variant: str):
    """Reading the config needs no weights: check_model_fields runs before any tensor is read, so a missing-weights
    error (not a config error) shows the config was accepted."""
    folder = _folder_with(tmp_path, variant)
    with pytest.raises(resid.ResidError, match="no model.safetensors"):
        resid.load(folder)


@pytest.mark.parametrize("variant, field, value", [
    ("llama", "new_norm_placement", "sandwich"),
    ("gemma3", "attn_temperature_tuning", True),
    ("qwen3_yarn", "decoder_sparse_step", 1),
    ("gemma3", "use_bidirectional_attention", True),
    ("gpt2", "scale_attn_by_inverse_layer_idx_v2", True),
])
def test_an_unknown_field_is_refused_by_name(tmp_path: Path, variant: str, field: str, value: object):
    with pytest.raises(resid.ResidError, match=f"{field}={value!r}") as info:
        resid.load(_folder_with(tmp_path, variant, **{field: value}))
    assert "refuses" in str(info.value)


@pytest.mark.parametrize("variant, changes, message", [
    ("llama", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "factor": 2.0}},
     "'longrope' is not supported"),
    ("phi3", {"rope_parameters": {"rope_type": "su", "rope_theta": 1e4}}, "'su' is not supported"),
    ("gemma3", {"layer_types": ["chunked_attention", "full_attention"]}, "chunked_attention"),
    ("gemma3", {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                    "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}},
     "scales the sliding layers"),
])
def test_unsupported_values_are_refused(tmp_path: Path, variant: str, changes: dict, message: str):
    with pytest.raises(resid.ResidError, match=message):
        resid.load(_folder_with(tmp_path, variant, **changes))


# config.json files as published on the Hub (field names and kinds as released; sizes shrunk so the check
# runs on anything): each must pass the allow-list and map to the architecture it describes.
PUBLISHED = {
    "Llama-3.1": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id":
        128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 16, "hidden_act": "silu", "hidden_size": 64,
        "initializer_range": 0.02, "intermediate_size": 128, "max_position_embeddings": 131072, "mlp_bias": False,
        "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0,
        "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version":
        "4.43.0.dev0", "use_cache": True, "vocab_size": 128,
    },
    "Qwen2.5": {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id":
        151645, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128,
        "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2", "num_attention_heads": 4,
        "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version":
        "4.43.1", "use_cache": True, "use_sliding_window": False, "vocab_size": 128,
    },
    "Gemma-2": {
        "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 107],
        "final_logit_softcapping": 30.0, "head_dim": 16, "hidden_act": "gelu_pytorch_tanh", "hidden_activation":
        "gelu_pytorch_tanh", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128,
        "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 4, "num_hidden_layers": 2,
        "num_key_value_heads": 2, "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0, "sliding_window": 4096, "torch_dtype": "bfloat16", "transformers_version": "4.42.4",
        "use_cache": True, "vocab_size": 128,
    },
    "Gemma-3-270m": {
        "_sliding_window_pattern": 6, "architectures": ["Gemma3ForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "attn_logit_softcapping": None, "bos_token_id": 2, "eos_token_id": 1,
        "final_logit_softcapping": None, "head_dim": 16, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 64,
        "initializer_range": 0.02, "intermediate_size": 128, "layer_types": ["sliding_attention"] * 5
        + ["full_attention"], "max_position_embeddings": 32768, "model_type": "gemma3_text",
        "num_attention_heads": 4, "num_hidden_layers": 6, "num_key_value_heads": 1, "pad_token_id": 0,
        "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0, "rope_scaling": None,
        "rope_theta": 1000000.0, "sliding_window": 512, "torch_dtype": "bfloat16", "transformers_version": "4.55.0",
        "use_bidirectional_attention": False, "use_cache": True, "vocab_size": 128,
    },
    "Phi-3-mini-4k": {
        "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "auto_map": {
        "AutoConfig": "configuration_phi3.Phi3Config", "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"},
        "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 64,
        "initializer_range": 0.02, "intermediate_size": 128, "max_position_embeddings": 4096, "model_type": "phi3",
        "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 4, "original_max_position_embeddings":
        4096, "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": None,
        "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.40.2", "use_cache": True, "vocab_size": 128,
    },
    "Mixtral": {
        "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128,
        "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 4, "num_experts_per_tok": 2,
        "num_hidden_layers": 2, "num_key_value_heads": 2, "num_local_experts": 8, "output_router_logits": False,
        "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.36.0.dev0",
        "use_cache": True, "vocab_size": 128,
    },
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_configs_are_understood(name: str):
    hf = PUBLISHED[name]
    config = family_for(hf["model_type"], Path(name)).read(hf)
    assert config.architecture == hf["model_type"] and config.d_model == 64
    if name == "Llama-3.1":
        assert config.rope_scaling == resid.RopeScaling("llama3", 8.0, 8192, low_freq_factor=1.0, high_freq_factor=4.0)
    if name == "Qwen2.5":  # a window is given, but use_sliding_window is false: full attention everywhere
        assert config.sliding_window is None and config.layer_types is None
    if name == "Gemma-2":  # no layer_types: transformers alternates, the first layer sliding
        assert config.layer_types == ("sliding", "full") and config.attn_softcap == 50.0
    if name == "Gemma-3-270m":
        assert config.rotary_base == 1e6 and config.rotary_base_local == 1e4 and config.layer_types[-1] == "full"
    if name == "Phi-3-mini-4k":
        assert config.sliding_window == 2047 and config.layer_types is None
    if name == "Mixtral":
        assert (config.n_experts, config.experts_per_token) == (8, 2)
