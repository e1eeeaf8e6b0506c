"""Bad model folders fail with a ResidError that says what is wrong: a missing, mis-shaped or unexpected
tensor, an unsupported model_type, an unsupported config option, or pickled weights only."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import build, hf_config

import resid
from resid.load.families.model_types import supported_model_types


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_llama_good")
    build("llama", folder)
    return folder


def _copy_with_tensors(good: Path, folder: Path, edit) -> Path:
    """A copy of `good` whose model.safetensors went through `edit(tensors)`."""
    shutil.copytree(good, folder)
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def _load_error(folder: Path) -> str:
    with pytest.raises(resid.ResidError) as info:
        resid.load(folder)
    return str(info.value)


def test_the_good_folder_loads(llama_folder: Path):
    assert resid.load(llama_folder).config.architecture == "llama"


def test_missing_tensor_is_named(llama_folder: Path, tmp_path: Path):
    name = "model.layers.1.mlp.up_proj.weight"
    folder = _copy_with_tensors(llama_folder, tmp_path / "m", lambda t: t.pop(name))
    message = _load_error(folder)
    assert f"no tensor {name!r}" in message
    assert "blocks.1.mlp.W_in" in message


def test_wrong_shape_names_the_tensor_and_both_shapes(llama_folder: Path, tmp_path: Path):
    name = "model.norm.weight"
    folder = _copy_with_tensors(llama_folder, tmp_path / "m", lambda t: t.update({name: torch.ones(50)}))
    message = _load_error(folder)
    assert name in message and "(50,)" in message and "(48,)" in message


def test_wrong_shape_of_a_rearranged_tensor(llama_folder: Path, tmp_path: Path):
    name = "model.layers.0.mlp.up_proj.weight"  # [d_mlp d_model] = (96, 48) in the checkpoint
    folder = _copy_with_tensors(llama_folder, tmp_path / "m", lambda t: t.update({name: torch.ones(100, 48)}))
    message = _load_error(folder)
    assert name in message and "(100, 48)" in message and "96" in message


def test_wrong_head_layout_is_named(llama_folder: Path, tmp_path: Path):
    name = "model.layers.0.self_attn.q_proj.weight"  # (head d_head) = 48 rows; 50 do not split into 4 heads
    folder = _copy_with_tensors(llama_folder, tmp_path / "m", lambda t: t.update({name: torch.ones(50, 48)}))
    message = _load_error(folder)
    assert name in message and "(50, 48)" in message and "'head': 4" in message


def test_unexpected_tensor_is_an_error(llama_folder: Path, tmp_path: Path):
    name = "model.layers.0.self_attn.q_norm.weight"
    folder = _copy_with_tensors(llama_folder, tmp_path / "m", lambda t: t.update({name: torch.ones(12)}))
    message = _load_error(folder)
    assert "does not use" in message and name in message


def test_unsupported_model_type_lists_the_supported_ones(llama_folder: Path, tmp_path: Path):
    folder = tmp_path / "xlnet"
    shutil.copytree(llama_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, model_type="xlnet")))
    message = _load_error(folder)
    assert "'xlnet'" in message
    assert ", ".join(supported_model_types()) in message
    assert {"gemma2", "gemma3_text", "olmo2", "phi3", "qwen3"} <= set(supported_model_types())


@pytest.mark.parametrize(("model_type", "part"), [("gemma4_text", "per-layer input embeddings"), ("bloom", "ALiBi"),
                                                  ("llama4_text", "chunked local attention"),
                                                  ("qwen3_next", "DeltaNet")])
def test_a_known_unsupported_model_type_names_the_missing_part(llama_folder: Path, tmp_path: Path, model_type: str,
                                                                part: str):
    folder = tmp_path / model_type
    shutil.copytree(llama_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, model_type=model_type)))
    message = _load_error(folder)
    assert f"{model_type!r}" in message and part in message and "Supported model types" in message


def test_pickled_weights_are_never_loaded(llama_folder: Path, tmp_path: Path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    shutil.copy(llama_folder / "config.json", folder / "config.json")
    # Not even a valid pickle: resid must refuse before reading it.
    (folder / "pytorch_model.bin").write_bytes(b"not a pickle")
    message = _load_error(folder)
    assert "pytorch_model.bin" in message
    assert "never loads pickled weights" in message and "safetensors" in message


@pytest.mark.parametrize("flag", ["scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"])
def test_unsupported_gpt2_attention_options(tmp_path: Path, flag: str):
    hf_config("gpt2").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(config, **{flag: True})))
    message = _load_error(tmp_path)
    assert flag in message and "not support" in message


def test_a_fused_tensor_of_the_wrong_size_is_refused(tmp_path: Path):
    """Phi-3's qkv_proj is cut by row ranges: a checkpoint with more rows than the config (e.g. more KV heads)
    must not load its first rows silently."""
    good = tmp_path / "good"
    build("phi3", good)

    def grow(tensors):
        name = "model.layers.0.self_attn.qkv_proj.weight"
        tensors[name] = torch.cat([tensors[name], tensors[name][:12]])

    message = _load_error(_copy_with_tensors(good, tmp_path / "bad", grow))
    assert "qkv_proj" in message and "rows" in message
