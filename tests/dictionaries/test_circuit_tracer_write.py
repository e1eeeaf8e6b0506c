"""resid.dictionaries.formats.circuit_tracer.write: a cross-layer transcoder written into a folder reads back as
itself, even where a longer one was written before (its later layers' files are removed, not read as this one's); a
transcoder with a NaN or infinite weight is refused, naming the tensor, before any file is written; a path that is a
file is one clear error."""

from pathlib import Path

import pytest
import torch
from random_models import make_random_model
from random_transcoders import cross_layer

import resid.dictionaries
from resid.dictionaries.formats import circuit_tracer
from resid.errors import ResidError


def test_a_shorter_clt_written_over_a_longer_one_reads_back_as_itself(tmp_path: Path) -> None:
    folder = tmp_path / "clt"
    circuit_tracer.write(cross_layer(make_random_model("llama_gqa", n_layers=4)), folder)
    short = cross_layer(make_random_model("llama_gqa", n_layers=2), seed=1)
    circuit_tracer.write(short, folder)
    assert sorted(p.name for p in folder.glob("W_*")) == [f"W_{kind}_{layer}.safetensors" for kind in ("dec", "enc")
                                                          for layer in range(2)]
    found = resid.dictionaries.load(folder)
    assert found.n_layers == 2 and torch.equal(found.W_enc, short.W_enc)
    assert all(torch.equal(a, b) for a, b in zip(found.W_dec, short.W_dec, strict=True))


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_clt_with_a_non_finite_weight_is_refused_naming_the_tensor(value: float, tmp_path: Path) -> None:
    clt = cross_layer(make_random_model("llama_gqa"))
    with torch.no_grad():
        clt.W_dec[2][0, 0, 0] = value
    with pytest.raises(ResidError, match=r"Cross-layer transcoder 'clt': W_dec_2 holds 1 non-finite value\(s\) "
                                         r"\(NaN or infinite\) of 768, so it is not written"):
        circuit_tracer.write(clt, tmp_path / "clt")
    assert not (tmp_path / "clt").exists()  # checked before anything is written


def test_writing_to_a_file_path_is_one_clear_error(tmp_path: Path) -> None:
    clt = cross_layer(make_random_model("llama_gqa"))
    (tmp_path / "taken").write_text("x")
    with pytest.raises(ResidError, match=r"taken is a file, but a circuit-tracer cross-layer transcoder .* is "
                                         r"written as a folder of files: give a folder path"):
        circuit_tracer.write(clt, tmp_path / "taken")
    with pytest.raises(ResidError, match=r"Cannot make the folder .*taken/clt to write a circuit-tracer"):
        circuit_tracer.write(clt, tmp_path / "taken" / "clt")
    assert (tmp_path / "taken").read_text() == "x"
