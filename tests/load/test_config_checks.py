"""config.json is checked before anything of its size is allocated (issue 27, findings 3, 4 and 8): a size far
beyond the weight files, a size of the wrong type or zero, and a weight stored as integers are each one clear
ResidError naming what is wrong, in milliseconds, not a ZeroDivisionError, a TypeError or an allocation of
gigabytes. The oversized configs load in a subprocess whose memory is capped, so the old behaviour (allocating
first) fails the test instead of exhausting the machine."""

import json
import resource
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from seq2seq_models import marian
from tiny_models import build

import resid

CAP = 3 << 30  # bytes of data a loading subprocess may allocate: far above a tiny model, far below the probes'


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_llama_checks")
    build("llama", folder)
    return folder


def _with_config(good: Path, folder: Path, **changes) -> Path:
    shutil.copytree(good, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _capped_loads(folders: list[Path]) -> list[str]:
    """The ResidError message of resid.load of each folder, in one subprocess (one torch import) whose data
    allocations are capped at CAP."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (CAP, CAP))

    code = ("import json, sys, resid\nfound = []\nfor folder in sys.argv[1:]:\n    try:\n        resid.load(folder)\n"
            "        found.append('loaded')\n    except resid.ResidError as e:\n        found.append(str(e))\n"
            "print(json.dumps(found))\n")
    result = subprocess.run([sys.executable, "-c", code, *map(str, folders)], capture_output=True, text=True,
                            timeout=300, preexec_fn=cap)
    assert result.returncode == 0, result.stderr[-3000:]  # no MemoryError, no traceback
    return json.loads(result.stdout)


def test_a_size_far_beyond_the_weights_is_refused_before_allocating(llama_folder, tmp_path):
    probes = {"num_hidden_layers": (10_000_000, "n_layers=10000000"), "vocab_size": (10**12, "d_vocab=1000000000000"),
              "intermediate_size": (10**9, "d_mlp=1000000000")}
    folders = [_with_config(llama_folder, tmp_path / field, **{field: value}) for field, (value, _) in probes.items()]
    # Marian's sinusoid table is computed, not read: max_position_embeddings sizes it.
    marian(tmp_path / "marian")
    folders.append(_with_config(tmp_path / "marian", tmp_path / "marian_big", max_position_embeddings=10**9))
    # The control: a plausible size passes the bound and meets the exact shape check, under the same cap.
    folders.append(_with_config(llama_folder, tmp_path / "control", num_hidden_layers=3))
    *refused, sinusoids, control = _capped_loads(folders)
    for message, (_, shown) in zip(refused, probes.values()):
        assert "describes a model of about" in message and shown in message, message
        assert "the weight files hold 4,870,992" in message and "refuses before allocating" in message
    assert "n_ctx=1000000000" in sinusoids and "refuses before allocating" in sinusoids, sinusoids
    assert "has no tensor 'model.layers.2." in control, control


@pytest.mark.parametrize("field, value, shown", [
    ("num_attention_heads", 0, "num_attention_heads must be a whole number of at least 1, written without quotes or "
                               "a decimal point (e.g. 576), but it is 0."),
    ("hidden_size", "576", "hidden_size must be a whole number of at least 1, written without quotes or a decimal "
                           "point (e.g. 576), but it is '576' (a string)."),
    ("hidden_size", 576.0, "hidden_size must be a whole number of at least 1, written without quotes or a decimal "
                           "point (e.g. 576), but it is 576.0 (float)."),
    ("num_key_value_heads", True, "num_key_value_heads must be a whole number of at least 1"),
    ("rms_norm_eps", "1e-6", "rms_norm_eps must be a finite positive number, but it is '1e-6' (a string)."),
    ("rms_norm_eps", -1e-6, "rms_norm_eps must be a finite positive number"),
])
def test_config_types_and_zeros_name_the_field(llama_folder, tmp_path, field, value, shown):
    with pytest.raises(resid.ResidError) as info:
        resid.load(_with_config(llama_folder, tmp_path / "m", **{field: value}))
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'm'}/config.json: {field} must be ") and shown in message
    assert message.endswith("Fix that field of config.json.") and len(message.splitlines()) == 1


def test_a_missing_size_is_named(llama_folder, tmp_path):
    folder = _with_config(llama_folder, tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    del config["hidden_size"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(resid.ResidError, match="config.json has no 'hidden_size', which model_type 'llama' needs"):
        resid.load(folder)


def _relabel(path: Path, tensor: str, dtype: str) -> None:
    """Change one tensor's dtype in a safetensors header, keeping its bytes (F32 -> I32 keeps the byte count)."""
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    header[tensor]["dtype"] = dtype
    text = json.dumps(header, separators=(",", ":")).encode().ljust(size)  # same length: the offsets stay valid
    assert len(text) == size
    path.write_bytes(data[:8] + text + data[8 + size:])


def test_an_integer_weight_is_refused_by_name(llama_folder, tmp_path):
    folder = _with_config(llama_folder, tmp_path / "m")
    name = "model.layers.1.mlp.up_proj.weight"
    _relabel(folder / "model.safetensors", name, "I32")
    with pytest.raises(resid.ResidError) as info:
        resid.load(folder)
    message = str(info.value)
    assert f"Tensor {name!r}" in message and "has dtype I32, not a floating-point type" in message
    _relabel(folder / "model.safetensors", name, "F32")
    resid.load(folder)  # the control: the same bytes labelled F32 load
