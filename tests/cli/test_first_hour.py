"""Papercuts a new user hit, each through the CLI on a tiny random model: neuron values exported to every data
format, a prompts file whose lines leave the target out, and one rule for what an empty prompt is."""

import json
from pathlib import Path

import pytest
from tiny_models import build

from resid.analyses import tables
from resid.analyses.cli.main import main


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_llama_first_hour")
    build("llama", folder)
    return folder


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_neuron_values_export_and_read_back(folder, tmp_path, capsys, fmt):
    out = tmp_path / "vals"
    assert main(["neurons", "values", "--model", str(folder), "--layers", "1", "--neurons", "3", "--k", "2",
                 "--out", str(out), "--format", fmt]) == 0
    capsys.readouterr()
    table = tables.read(out / f"neuron_values.{fmt}")
    assert len(table) == 2 * 2 and set(table["direction"]) == {"top", "bottom"}
    assert str(table["direction"].dtype) == "category"  # the categorical column round-trips exactly


def test_attribute_prompts_without_a_target_use_each_top_prediction(folder, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    lines = [{"prompt": "When Mary and John went to the store, John gave a drink to", "target": " Mary"},
             {"prompt": "The capital of France is"}]
    prompts.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    out = tmp_path / "attr.csv"
    assert main(["attribute", "--model", str(folder), "--prompts", str(prompts), "--level", "sublayer",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    df = tables.read(out)
    assert set(df["prompt_idx"]) == {0, 1}
    assert (df[df["prompt_idx"] == 0]["target"] == " Mary").all()
    # the second prompt's target is its own top prediction, and its components still sum to that logit
    second = df[df["prompt_idx"] == 1]
    assert abs(second["value"].sum() - second["logit"].iloc[0]) < 1e-4 * max(1.0, abs(second["logit"].iloc[0]))


def test_ablate_still_needs_a_target_on_every_line(folder, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "The capital of France is"}) + "\n")
    assert main(["ablate", "--model", str(folder), "--prompts", str(prompts), "--out", str(tmp_path / "r.csv")]) == 2
    err = capsys.readouterr().err
    assert 'line 1 has no "target"' in err and "resid ablate" in err


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_gpt2_first_hour")
    build("gpt2", folder)  # no BOS is prepended, so "" really is empty
    return folder


@pytest.mark.parametrize("command", [["predict"], ["decompose"], ["lens"], ["attribute"]])
def test_whitespace_is_text_everywhere_and_empty_is_an_error_everywhere(gpt2_folder, capsys, command):
    assert main([*command, "   ", "--model", str(gpt2_folder)]) == 0  # spaces are tokens: one rule, as predict had
    capsys.readouterr()
    assert main([*command, "", "--model", str(gpt2_folder)]) == 2
    assert "tokenize to nothing" in capsys.readouterr().err


def test_patch_prints_the_effect_and_the_tables_score_labelled(folder, tmp_path, capsys):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"clean": "When Mary and John went to the store, John gave a drink to",
                                 "corrupt": "When Mary and John went to the store, Mary gave a drink to",
                                 "target": " Mary", "baseline": " John"}) + "\n")
    out = tmp_path / "patch.csv"
    assert main(["patch", "--model", str(folder), "--pairs", str(pairs), "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[1].startswith("largest mean effects on logit_diff (denoise): effect = patched - corrupt run's "
                                 "metric; score = the table's score column"), printed[1]
    table = tables.read(out)
    site, effect, score = printed[2].split()[0], float(printed[2].split()[2]), float(printed[2].split()[4])
    rows = table[table["site"] == site]
    assert effect == pytest.approx((rows["patched_metric"] - rows["corrupt_metric"]).mean(), abs=1e-4)
    assert score == pytest.approx(rows["score"].mean(), abs=1e-3)
