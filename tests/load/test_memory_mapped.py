"""Loading takes about the weights' memory (issue 41): a safetensors tensor already in the model's dtype and layout
is the parameter itself, a page of its memory-mapped file (copy-on-write: editing the model never edits the
file); any other is copied; and a model or a batch that cannot fit is refused before it starts, naming the size."""

from pathlib import Path

import pytest
import tiny_models
import torch

import resid
from resid.load.weights import check_fits


def _mapped_files() -> list[tuple[int, int, str]]:
    """(start, end, path) of every file mapping of this process."""
    found = []
    with open("/proc/self/maps") as handle:
        for line in handle:
            fields = line.split()
            if len(fields) >= 6 and fields[5].startswith("/"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                found.append((start, end, fields[5]))
    return found


def _in_file(tensor: torch.Tensor, folder: Path, maps: list[tuple[int, int, str]]) -> bool:
    pointer = tensor.data_ptr()
    return any(start <= pointer < end and Path(path).parent == folder for start, end, path in maps)


@pytest.fixture(scope="module")
def bf16_folder(tmp_path_factory) -> Path:
    """The tiny grouped-query, tied Llama saved by transformers in bfloat16."""
    folder = tmp_path_factory.mktemp("bf16")
    hf = tiny_models.build("llama_gqa_tied", folder)
    hf.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads Linux's /proc/self/maps")
def test_same_dtype_parameters_are_the_files_pages(bf16_folder: Path):
    model = resid.load(bf16_folder, dtype="bfloat16")
    maps = _mapped_files()
    parameters = dict(model.named_parameters())
    assert parameters and all(_in_file(p, bf16_folder, maps) for p in parameters.values()), [
        name for name, p in parameters.items() if not _in_file(p, bf16_folder, maps)]
    assert model.unembed.weight is model.embed.W_E  # the tie survives the replacement of the parameter
    # the same values as a float32 load rounded to bfloat16 (which copies every tensor)
    copied = resid.load(bf16_folder).to(torch.bfloat16)
    maps = _mapped_files()
    assert not any(_in_file(p, bf16_folder, maps) for p in copied.parameters())
    for name, value in copied.state_dict().items():
        assert torch.equal(value, model.state_dict()[name]), name
    ids = torch.randint(0, model.config.d_vocab, (2, 9), generator=torch.Generator().manual_seed(0))
    assert torch.equal(model.run(ids).logits, copied.run(ids).logits)


def test_editing_a_mapped_weight_leaves_the_file(bf16_folder: Path):
    model = resid.load(bf16_folder, dtype="bfloat16")
    before = model.blocks[0].mlp.W_out.clone()
    with torch.no_grad():
        model.blocks[0].mlp.W_out.mul_(0)
    assert not model.blocks[0].mlp.W_out.any()
    assert torch.equal(resid.load(bf16_folder, dtype="bfloat16").blocks[0].mlp.W_out, before)


def test_a_model_too_large_is_refused_naming_its_size():
    values = 2**50  # 4 PiB of float32 weights: more than any host has
    with pytest.raises(resid.ResidError) as err:
        check_fits(values, torch.float32, torch.device("cpu"), "the model in /models/huge")
    message = str(err.value)
    assert "The model in /models/huge needs 4194304.0 GiB for its weights in float32" in message
    assert "In bfloat16 it would take 2097152.0 GiB" in message and "dtype='bfloat16'" in message
    check_fits(1000, torch.float32, torch.device("cpu"), "a tiny model")  # what fits passes
