"""`--ray [ADDRESS]` and `--workers N` of `resid ablate`, `resid neurons top` and `resid graph` are checked before the
model loads: --workers without --ray, a bad count, and Ray not installed each fail at once with one clear line."""

import json
from pathlib import Path

import pytest

from resid.analyses.cli.main import main
from resid.analyses.distributed import ray_executor

NO_MODEL = ["--model", "no-such-model"]


@pytest.fixture
def prompts(tmp_path) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "When Mary and John went", "target": " Mary"}) + "\n")
    return str(path)


def _commands(prompts: str, *flags: str) -> list[list[str]]:
    return [["ablate", "--prompts", prompts, "--out", "r.parquet", *flags, *NO_MODEL],
            ["neurons", "top", "--layers", "1", *flags, *NO_MODEL],
            ["graph", "hi", "--transcoders", str(Path(prompts).parent), *flags, *NO_MODEL]]


@pytest.mark.parametrize("flags, message", [
    (["--workers", "2"], "--workers goes with --ray [ADDRESS]: add --ray"),
    (["--ray", "--workers", "0"], "--workers must be at least 1, got 0."),
])
def test_bad_executor_flags_fail_before_load(prompts, capsys, flags, message):
    if "--ray" in flags:
        pytest.importorskip("ray", reason="with Ray missing, --ray reports that first")
    for command in _commands(prompts, *flags):
        assert main(command) == 2
        assert message in capsys.readouterr().err


def test_ray_not_installed_fails_before_load(prompts, capsys, monkeypatch):
    monkeypatch.setattr(ray_executor, "RAY_MODULE", "ray_is_not_installed_here")
    for command in _commands(prompts, "--ray", "--workers", "2"):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "pip install 'resid-stream[distributed]'" in err and "Unknown model" not in err
