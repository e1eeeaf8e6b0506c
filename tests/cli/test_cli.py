"""The `resid` command: predictions, config, and one-line errors."""

import argparse
import subprocess
import sys

import pytest

from resid.analyses.cli.main import DEFAULT_MODEL, _parser, main


@pytest.mark.slow
def test_predict_prints_paris(capsys):
    assert main(["predict", "The Eiffel Tower is located in the city of", "--top", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "' Paris'" in out[2] and "0.70" in out[2]
    assert len(out) == 2 + 3


@pytest.mark.slow
def test_info_prints_config(capsys):
    assert main(["info", "--model", "smollm2-135m"]) == 0
    out = capsys.readouterr().out
    assert "n_layers           30" in out and "parameters: 134,515,008" in out


def test_errors_are_one_line_with_exit_status_2():
    result = subprocess.run(
        [sys.executable, "-m", "resid.analyses.cli.main", "predict", "hi", "--model", "no-such-model"],
        capture_output=True, text=True, env={"HF_HUB_OFFLINE": "1", "PATH": ""},
    )
    assert result.returncode == 2
    assert result.stderr.startswith("resid: error: Unknown model 'no-such-model'")
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                yield from ((f"{name} {inner}", p) for inner, p in _subparsers(sub))


def test_every_positional_and_the_model_option_have_help(capsys):
    commands = dict(_subparsers(_parser()))
    assert {"decompose", "lens", "predict", "neurons explain", "neurons edit"} <= set(commands)
    for name, sub in commands.items():
        for action in sub._actions:
            if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
                assert action.help, f"resid {name}: positional {action.dest!r} has no help"
    for option in ("--every", "--norm"):
        assert next(a for a in commands["lens"]._actions if option in a.option_strings).help
    with pytest.raises(SystemExit):
        main(["predict", "--help"])
    assert f"(default: {DEFAULT_MODEL})" in " ".join(capsys.readouterr().out.split())
