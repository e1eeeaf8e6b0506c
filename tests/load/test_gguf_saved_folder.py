"""The Hugging Face folder transformers saves from a GGUF (from_pretrained(gguf_file=...) then save_pretrained) has
two inert fields besides the model's own: `_model_name_or_path` (provenance) and `quantization_config: null` (the
weights were dequantized). They load; a quantization_config that is not null is still refused, saying why."""

from pathlib import Path

import pytest

import resid
from resid.load.families.model_types import family_for

# Gemma 3 270M's text config as transformers 5 saves it from the GGUF (sizes shrunk)
SAVED_FROM_GGUF = {
    "_model_name_or_path": "/models/gemma-3-270m-it-Q8_0.gguf", "quantization_config": None,
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": None, "bos_token_id": 2, "eos_token_id": 1, "final_logit_softcapping": None,
    "head_dim": 16, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 64, "initializer_range": 0.02,
    "intermediate_size": 128, "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
    "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 6,
    "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000.0, "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": 512,
    "dtype": "float32", "transformers_version": "5.0.0", "use_cache": True, "vocab_size": 128,
}


def test_the_folder_saved_from_a_gguf_is_read():
    config = family_for("gemma3_text", Path("saved")).read(SAVED_FROM_GGUF)
    assert config.architecture == "gemma3_text" and config.d_model == 64 and config.n_layers == 6


@pytest.mark.parametrize("quantization", [{"quant_method": "bitsandbytes", "load_in_4bit": True},
                                          {"quant_method": "fp8", "weight_block_size": [128, 128]}])
def test_a_quantization_config_that_is_not_null_is_refused_saying_why(quantization):
    hf = {**SAVED_FROM_GGUF, "quantization_config": quantization}
    with pytest.raises(resid.ResidError, match=r"quantization_config=\{.*resid reads floating-point weights only, "
                       r"and a quantized checkpoint's tensors are packed integers and scales; save the model "
                       r"dequantized"):
        family_for("gemma3_text", Path("saved")).read(hf)
