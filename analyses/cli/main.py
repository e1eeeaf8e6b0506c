"""The `resid` command.

    resid decompose "The Eiffel Tower is located in the city of" [--target T] [--baseline B] [--out DIR]
    resid attribute "prompt" | --prompts x.jsonl [--level head] [--out table.csv]
    resid lens "prompt" [--target T] [--positions all] [--every sublayer] [--norm frozen] [--out lens.csv]
                        [--lens tuned --translators DIR]
    resid lens train --out DIR [--corpus FILE] [--steps N --tokens-per-step N --seq-len N]
    resid lens fit-jacobian --out DIR [--corpus FILE] [--tokens N --seq-len N] [--layout transformer-lens]
    resid lens eval [--translators DIR] [--jlens DIR] [--tokens N] [--out eval.md]
    resid predict "The Eiffel Tower is located in the city of" [--model M] [--top K]
    resid info [--model M]
    resid ablate --prompts prompts.jsonl [--sites sublayer] [--method mean --reference corpus.txt]
                 --out results.parquet [--figure effects.html]
    resid patch --pairs pairs.jsonl [--sites resid_pre|sublayer|head] [--method exact|atp] --out results.parquet
    resid neurons values|top|explain|edit ...
    resid features values|top --dictionary DIR ...
    resid train-sae | train-transcoder --layers all --out DIR [--k 32 --expansion 8 --tokens N]
    resid train-clt --out DIR [--activation batchtopk|jumprelu --k 16 --expansion 2 --tokens N]
    resid eval-dictionaries [NAME=]DIR [[NAME=]DIR ...] --out DIR [--prompt P ...]
    resid graph "prompt" --transcoders DIR [--out graph.json] [--validate K]
    resid qk "prompt" --transcoders DIR [--layer L --head H] [--key K] [--versus K2 | mean] [--out table.csv]

Each subcommand is a module of analyses/cli/ with `add_parser(commands, common)`, `check(args)` (everything
that needs no model: run before `load`, so a typo costs no seconds of loading) and `run(model, args)`.
Bad input ends in one line `resid: error: ...` and exit status 2, never a traceback; an analysis's error is
named by its flags (resid.analyses.cli.errors: `--reference`, not `reference=`).

--out is a folder for the commands that write several files (decompose: tables and report.html; neurons and
features: a table and figures; lens train: the checkpoint and the lens), and a file whose suffix picks the format
for those that write one table (attribute, lens, lens eval, qk: .csv .parquet .tex .md; ablate: .parquet .csv), with
any figure written beside it (graph: the graph's .json, its viewer page .html beside it). Each --out help says
which. While a command computes and writes its --out it holds `<out>.lock` (resid.analyses.io.lock, the result
store's lock, taken once the model has loaded, so that a command refused before then makes no folder): a second
command into the same --out is refused, before its model loads when the first one already holds the lock.
Every HTML page embeds plotly.js and opens alone (4.8 MB each); --shared-js writes one plotly.min.js beside the
pages instead, which they load (smaller pages that open only beside it).

Building the parser imports no torch, pandas or plotly (the subcommand modules import what `run` needs inside
it), so `--help`, `--version` and argument errors answer in tens of milliseconds (tests/cli/test_startup.py).
"""

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

import resid
from resid.analyses.cli import arguments
from resid.analyses.cli.errors import render
from resid.errors import ResidError, param_style

DEFAULT_MODEL = "smollm2-135m"
# Commands in the order --help lists them; each is the module of resid.analyses.cli named like it ("lens train":
# lens_train.py; "lens fit-jacobian": lens_fit_jacobian.py). A two-word command is typed as two words
# (`resid lens train`): _route joins them.
COMMANDS = ("decompose", "attribute", "lens", "lens train", "lens fit-jacobian", "lens eval", "predict", "info",
            "ablate", "patch", "neurons", "features")
# `resid train-sae`, `train-transcoder` and `train-clt` (analyses/cli/train.py); `resid eval-dictionaries`
COMMANDS += ("train", "eval_dictionaries", "graph", "qk", "circuit")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="resid", description="Residual-stream interpretability toolkit.")
    parser.add_argument("--version", action="version", version=f"resid {resid.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--model", default=DEFAULT_MODEL,
                        help="resid name, folder, .gguf file or Hub id (default: %(default)s)")
    common.add_argument("--device", default=None, help="cpu (default), cuda, cuda:1, ...")
    common.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    for name in COMMANDS:
        _command(name).add_parser(commands, common)
    return parser


def _command(name: str):
    return importlib.import_module(f"resid.analyses.cli.{name.replace(' ', '_').replace('-', '_')}")


def _route(argv: Sequence[str]) -> list[str]:
    """`resid lens train ...` -> the command "lens train". A prompt that is one of those words is read as a prompt
    after `--`: `resid lens -- train`."""
    argv = list(argv)
    if len(argv) >= 2 and f"{argv[0]} {argv[1]}" in COMMANDS:
        return [f"{argv[0]} {argv[1]}", *argv[2:]]
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(_route(sys.argv[1:] if argv is None else argv))
    command = _command(args.command)
    try:
        with param_style(render):  # errors name flags, not Python parameters (resid.analyses.cli.errors)
            command.check(args)  # before load: a bad argument is reported in milliseconds, not after the weights
            from resid.load import load

            out = getattr(args, "out", None)
            if out is not None:  # refused before the model loads; the lock below closes the race after the look
                arguments.not_being_written(str(Path(out)))
            model = load(args.model, device=args.device, dtype=args.dtype)
            with arguments.one_writer(out):  # every --out: one writer at a time
                print(command.run(model, args))
    except ResidError as err:
        print(f"resid: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
