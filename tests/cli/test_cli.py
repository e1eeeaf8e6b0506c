"""The `resid` command: predictions, config, and one-line errors."""

import subprocess
import sys

from analyses.cli.main import main


def test_predict_prints_paris(capsys):
    assert main(["predict", "The Eiffel Tower is located in the city of", "--top", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "' Paris'" in out[2] and "0.70" in out[2]
    assert len(out) == 2 + 3


def test_info_prints_config(capsys):
    assert main(["info", "--model", "smollm2-135m"]) == 0
    out = capsys.readouterr().out
    assert "n_layers           30" in out and "parameters: 134,515,008" in out


def test_errors_are_one_line_with_exit_status_2():
    result = subprocess.run(
        [sys.executable, "-m", "analyses.cli.main", "predict", "hi", "--model", "no-such-model"],
        capture_output=True, text=True, env={"HF_HUB_OFFLINE": "1", "PATH": ""},
    )
    assert result.returncode == 2
    assert result.stderr.startswith("resid: error: Unknown model 'no-such-model'")
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
