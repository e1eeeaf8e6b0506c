"""The CLI on the families of issue 10 (post-norms, soft caps, q/k norms, local/global layers, fused weights,
rope scaling): every subcommand runs on a tiny model folder of each, and the attribution table it writes still
sums to the logit."""

import json
from pathlib import Path

import pandas as pd
import pytest
from tiny_models import build

from resid.analyses.cli.main import main

# make test runs the CLI on soft caps and local/global layers (gemma2), q/k norms (gemma3) and a mixture (mixtral);
# make test-slow on the rest (post-norms without pre-norms, yarn, fused weights, llama3 scaling)
FAMILIES = ["gemma2", "gemma3", "mixtral",
            *(pytest.param(f, marks=pytest.mark.slow) for f in ("olmo2", "qwen3_yarn", "phi3", "llama3_scaled"))]
PROMPT = "The quick brown fox jumps over the"


@pytest.fixture(scope="module", params=FAMILIES)
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp(f"cli_{request.param}")
    build(request.param, path)
    return path


def test_attribute_writes_a_table_that_sums_to_the_logit(folder: Path, tmp_path: Path):
    out = tmp_path / "attr.csv"
    assert main(["attribute", PROMPT, "--model", str(folder), "--level", "neuron", "--out", str(out)]) == 0
    df = pd.read_csv(out)
    assert df["value"].sum() == pytest.approx(df["logit"].iloc[0], rel=1e-5, abs=1e-5)
    capped = "gemma2" in folder.name
    assert ("logit_capped" in df) == capped


def test_lens_predict_decompose_and_neurons_run(folder: Path, tmp_path: Path, capsys):
    model = ["--model", str(folder)]
    assert main(["predict", PROMPT, *model, "--top", "3"]) == 0
    assert main(["lens", PROMPT, *model, "--out", str(tmp_path / "lens.csv")]) == 0
    assert len(pd.read_csv(tmp_path / "lens.csv")) > 0
    assert main(["decompose", PROMPT, *model, "--level", "head", "--out", str(tmp_path / "report")]) == 0
    expert = ["--expert", "1"] if "mixtral" in folder.name else []  # a mixture: one expert's neurons
    assert main(["neurons", "values", *model, "--layers", "1", "--neurons", "0,1", *expert, "--out",
                 str(tmp_path / "values"), "--format", "csv"]) == 0
    assert main(["neurons", "explain", PROMPT, *model, "--layers", "1"]) == 0
    capsys.readouterr()


def test_neurons_on_a_mixture_need_an_expert(tmp_path: Path, capsys):
    folder = tmp_path / "mixtral"
    build("mixtral", folder)
    assert main(["neurons", "values", "--model", str(folder), "--layers", "1"]) == 2
    assert "--expert E (0..3)" in capsys.readouterr().err


def test_ablate_sweeps_heads(folder: Path, tmp_path: Path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": PROMPT, "target": " the", "baseline": " a"}) + "\n")
    out = tmp_path / "sweep.parquet"
    assert main(["ablate", "--model", str(folder), "--prompts", str(prompts), "--sites", "head",
                 "--out", str(out), "--quiet"]) == 0
    df = pd.read_parquet(out)
    assert len(df) == 2 * 4 and df["delta"].abs().sum() > 0  # 2 layers x 4 heads
