"""Every subcommand checks the arguments that need no model before main loads one: a bad argument given
together with `--model no-such-model` reports the argument, which proves the loader never ran (it would have
said "Unknown model" first)."""

import json
from pathlib import Path

import pytest

from resid.analyses.cli.main import _parser, main

NO_MODEL = ["--model", "no-such-model"]


def _jsonl(path: Path, lines: list) -> str:
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return str(path)


@pytest.fixture
def files(tmp_path) -> dict[str, str]:
    return {
        "good": _jsonl(tmp_path / "good.jsonl", [{"prompt": "When Mary and John went", "target": " Mary"}]),
        "broken": _jsonl(tmp_path / "broken.jsonl", [{"prompt": "a", "target": " b"}, '{"prompt": "x"']),
        "corpus": _jsonl(tmp_path / "corpus.csv", ["some text"]),
        "pairs": _jsonl(tmp_path / "pairs.jsonl", [{"clean": "a b", "corrupt": "a c", "target": " d"}]),
        "list_target": _jsonl(tmp_path / "list_target.jsonl", [{"prompt": "a b", "target": [" Mary"]}]),
        "null_pair": _jsonl(tmp_path / "null_pair.jsonl", [{"clean": "a b", "corrupt": "a c", "target": None}]),
        "utf16": str(tmp_path / "utf16.jsonl"),
    }


BAD = [
    (["predict", "hi", "--top", "0"], "--top must be at least 1, got 0."),
    (["decompose", "hi", "--top", "-2"], "--top must be at least 1, got -2."),
    (["lens", "hi", "--positions", "last"], "--positions must be 'all' or comma-separated integers"),
    (["lens", "hi", "--k", "0"], "--k must be at least 1"),
    (["lens", "hi", "--out", "lens.html"], "--out 'lens.html' must end in one of .csv, .parquet, .tex, .md"),
    (["attribute"], "Give either one prompt or --prompts"),
    (["attribute", "hi", "--prompts", "{good}"], "Give either one prompt or --prompts"),
    (["attribute", "--prompts", "{good}", "--target", " Mary"], "targets and baselines come from the JSONL"),
    (["attribute", "--prompts", "{broken}"], "broken.jsonl, line 2: not valid JSON"),
    (["attribute", "hi", "--top", "0"], "--top must be at least 1"),
    (["attribute", "hi", "--out", "heads.xlsx"], "--out 'heads.xlsx' must end in one of"),
    (["ablate", "--prompts", "missing.jsonl", "--out", "r.parquet"], "Prompts file missing.jsonl does not exist"),
    (["ablate", "--prompts", "{broken}", "--out", "r.parquet"], "broken.jsonl, line 2: not valid JSON"),
    (["ablate", "--prompts", "{good}", "--out", "r.tex"], "--out 'r.tex' must end in one of .parquet, .csv"),
    (["ablate", "--prompts", "{good}", "--out", "r.csv", "--figure", "r.png"], "--figure 'r.png' must end in"),
    (["ablate", "--prompts", "{good}", "--out", "r.csv", "--batch-size", "0"], "--batch-size must be a positive"),
    (["ablate", "--prompts", "{good}", "--out", "r.csv", "--method", "mean"], "--method mean needs --reference"),
    (["ablate", "--prompts", "{good}", "--out", "r.csv", "--reference", "{good}"], "not used by --method zero"),
    (["ablate", "--prompts", "{good}", "--out", "r.csv", "--method", "mean", "--reference", "nope.txt"],
     "--reference nope.txt does not exist"),
    (["ablate", "--prompts", "{good}", "--out", "r.csv", "--metric", "logit_diff"],
     '--metric logit_diff needs a "baseline"'),
    (["patch", "--pairs", "{good}", "--out", "p.csv"], 'line 1 has no string field "clean"'),
    (["patch", "--pairs", "{pairs}", "--out", "p.tex"], "--out 'p.tex' must end in one of .parquet, .csv"),
    (["patch", "--pairs", "{pairs}", "--out", "p.csv", "--metric", "logit_diff"], '--metric logit_diff needs a'),
    # issue 27: wrong-typed targets and other encodings are refused with the file, before the model loads
    (["ablate", "--prompts", "{list_target}", "--out", "r.csv"], 'line 1: "target" must be a token'),
    (["attribute", "--prompts", "{list_target}"], 'line 1: "target" must be a token'),
    (["patch", "--pairs", "{null_pair}", "--out", "p.csv"], 'line 1: "target" must be a token'),
    (["ablate", "--prompts", "{utf16}", "--out", "r.csv"], "is encoded as UTF-16"),
    (["neurons", "values", "--layers", "x"], "--layers must be integers separated by commas"),
    (["neurons", "values", "--layers", "1", "--neurons", "5;7"], "--neurons must be integers separated by commas"),
    (["neurons", "values", "--layers", "1", "--k", "0"], "--k must be at least 1"),
    (["neurons", "top", "--layers", "1", "--max-docs", "0"], "--max-docs must be at least 1"),
    (["neurons", "top", "--layers", "1", "--batch-size", "many"], "--batch-size must be a positive integer"),
    (["neurons", "top", "--layers", "1", "--corpus", "{corpus}"], "Cannot read a corpus from 'corpus.csv'"),
    (["neurons", "explain", "hi", "--layers", "last"], "--layers must be integers separated by commas"),
    (["neurons", "edit", "hi", "--neurons", "20", "--set", "1"], "--neurons must be layer:neuron pairs"),
    (["patch", "--pairs", "{pairs}", "--out", "p.csv", "--batch-size", "0"], "--batch-size must be a positive"),
    (["graph", "hi", "--transcoders", ".", "--batch-size", "0"], "--batch-size must be a positive integer or 'auto'"),
]


@pytest.fixture(autouse=True)
def _utf16_file(tmp_path):
    (tmp_path / "utf16.jsonl").write_bytes('{"prompt": "a", "target": " b"}\n'.encode("utf-16"))


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(argv[:2]) + f" #{i}" for i, (argv, _) in enumerate(BAD)])
def test_bad_argument_is_reported_before_the_model_loads(argv, message, files, capsys):
    argv = [arg.format(**files) for arg in argv]
    assert main([*argv, *NO_MODEL]) == 2
    err = capsys.readouterr().err
    assert err.startswith("resid: error: ") and message in err, err
    assert "Unknown model" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv", [
    ["predict", "hi", "--top", "1"],
    ["lens", "hi", "--positions", "0,-1", "--out", "lens.md"],
    ["attribute", "--prompts", "{good}", "--out", "t.csv"],
    ["ablate", "--prompts", "{good}", "--out", "r.csv", "--batch-size", "4"],
    ["patch", "--pairs", "{pairs}", "--out", "p.csv", "--method", "atp"],
    ["neurons", "edit", "hi", "--neurons", "20:5", "--scale", "0"],
    ["info"],
])
def test_good_arguments_reach_the_loader(argv, files, capsys):
    # The control: the same commands with valid arguments get as far as loading, and fail there.
    assert main([arg.format(**files) for arg in argv] + NO_MODEL) == 2
    assert capsys.readouterr().err.startswith("resid: error: Unknown model 'no-such-model'")


def test_check_normalizes_the_arguments_run_reads(files):
    from resid.analyses.cli import ablate, lens, neurons

    args = _parser().parse_args(["lens", "hi", "--positions", "0,-1"])
    lens.check(args)
    assert args.positions == [0, -1]
    args = _parser().parse_args(["ablate", "--prompts", files["good"], "--out", "r.csv", "--batch-size", "8"])
    ablate.check(args)
    assert args.batch_size == 8 and args.prompt_set.prompts == ["When Mary and John went"]
    args = _parser().parse_args(["neurons", "top", "--layers", "all", "--neurons", "5,-1"])
    neurons.check(args)
    assert args.layers is None and args.neurons == [5, -1] and args.batch_size == "auto" and args.texts is None
    args = _parser().parse_args(["neurons", "edit", "hi", "--neurons", "20:5,-1:7", "--set", "2"])
    neurons.check(args)
    assert args.neurons == [(20, 5), (-1, 7)]


def test_the_long_jobs_build_one_execution_from_their_flags(files, tmp_path):
    """--batch-size, --quiet, --ray / --workers and, where --out is a result store (resid ablate), --out: one
    Execution; without --quiet a bar is drawn on a terminal (progress=None), resid patch's too."""
    from resid.analyses import Execution
    from resid.analyses.cli import ablate, arguments, graph, patch

    args = _parser().parse_args(["ablate", "--prompts", files["good"], "--out", "r.csv", "--batch-size", "8"])
    ablate.check(args)
    store = arguments.execution(args.batch_size, args.quiet, args.executor, out=args.out)
    assert store == Execution(batch_size=8, out="r.csv")
    args = _parser().parse_args(["patch", "--pairs", files["pairs"], "--out", "p.csv"])
    patch.check(args)
    assert arguments.execution(args.batch_size, args.quiet, args.executor) == Execution()
    args = _parser().parse_args(["patch", "--pairs", files["pairs"], "--out", "p.csv", "--quiet", "--batch-size", "2"])
    patch.check(args)
    assert arguments.execution(args.batch_size, args.quiet, args.executor) == Execution(batch_size=2, progress=False)
    args = _parser().parse_args(["graph", "hi", "--transcoders", str(tmp_path)])
    graph.check(args)
    assert arguments.execution(args.batch_size) == Execution()
