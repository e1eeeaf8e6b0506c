"""A folder of dictionary folders, as `resid train-sae` / `resid train-transcoder` write into --out (one SAELens
folder per dictionary, beside checkpoint.safetensors and evaluation.md): resid.dictionaries.load gives a list in
natural order, `resid features --dictionary OUT` reads it, and `resid graph` shares the same reader."""

import shutil
from pathlib import Path

import pytest
from tiny_models import build

import resid
import resid.dictionaries
from resid.analyses.cli.main import main
from resid.errors import ResidError

DATA = Path(__file__).resolve().parents[1] / "data" / "dictionaries"


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """Like a training --out: two SAELens folders (layer_10 sorts after layer_2 naturally, before it as text)."""
    out = tmp_path / "out"
    shutil.copytree(DATA / "saelens" / "standard", out / "layer_10")
    shutil.copytree(DATA / "saelens" / "topk", out / "layer_2")
    (out / "checkpoint.safetensors").write_bytes(b"not read")
    (out / "evaluation.md").write_text("| d_sae |\n")
    return out


def test_a_folder_of_dictionaries_loads_as_a_list_in_natural_order(out: Path) -> None:
    assert resid.dictionaries.detect(out) == "folders"
    loaded = resid.dictionaries.load(out)
    assert [(d.name, d.activation) for d in loaded] == [("layer_2", "topk"), ("layer_10", "relu")]
    one = resid.dictionaries.load(out / "layer_10")
    assert (loaded[1].W_enc == one.W_enc).all()


@pytest.mark.parametrize("change, message", [
    (lambda out: (out / "notes").mkdir(), r"holds dictionary folders \(layer_2, layer_10\) and subfolders that are "
                                          r"not dictionaries \(notes\)"),
    (lambda out: shutil.copytree(DATA / "circuit_tracer" / "clt", out / "clt"), r"clt is a cross-layer transcoder "
                                                                                 r"inside the folder of dictionaries"),
])
def test_a_folder_of_dictionaries_with_something_else_is_refused(out: Path, change, message) -> None:
    change(out)
    with pytest.raises(ResidError, match=message):
        resid.dictionaries.load(out)


def test_one_dictionarys_settings_are_refused_for_a_folder_of_them(out: Path) -> None:
    with pytest.raises(ResidError, match="hook=, hook_out= and norm_scaling_factor= are settings of one dictionary"):
        resid.dictionaries.load(out, hook="blocks.0.hook_resid_post")


def test_a_folder_that_holds_no_dictionary_says_what_it_needs(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ResidError, match=r"not a dictionary folder .* or subfolders that each hold one"):
        resid.dictionaries.load(tmp_path)


def test_features_values_reads_a_folder_of_dictionaries(out: Path, tmp_path: Path, capsys) -> None:
    folder = tmp_path / "model"
    build("llama", folder)
    assert main(["features", "values", "--model", str(folder), "--dictionary", str(out), "--features", "0",
                 "--k", "2"]) == 0
    printed = capsys.readouterr().out
    assert "2 features" in printed
    assert "layers[1].resid_pre.feature[0]  top:" in printed and "layers[1].resid_post.feature[0]  top:" in printed
