"""What the subcommands print: per-position lens targets, a predict target's rank, an analysis's notes, the
compact `neurons explain`, --out help, and analysis errors reworded for the command line."""

import importlib
import re

import pytest
import torch
from test_cli import _subparsers
from tiny_models import build

import resid.analyses.cli.main as cli_main
from resid.analyses import attribution, logit_lens
from resid.analyses.cli.errors import render
from resid.analyses.cli.main import _parser, main
from resid.errors import ResidError, param_style

PROMPT = "The Eiffel Tower is located in the city of"
TOKEN = r"('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")"  # a token as repr() prints it
LENS_ROW = re.compile(rf"^\s+(\d+) (L\d+ post|embed)\s+{TOKEN}\s+(\S+) {TOKEN}\s+(\S+)\s+(\d+)$")


@pytest.fixture
def loaded(monkeypatch, smollm2):
    """main() loads the default model once per call; these tests reuse the session's copy (the CLI only reads
    it), which saves seconds per call."""
    package = importlib.import_module("resid.load")  # `resid.load` the attribute is the function, not the package
    monkeypatch.setattr(package, "load", lambda name, device=None, dtype=None: smollm2)


def test_lens_without_target_shows_each_positions_target(loaded, capsys):
    assert main(["lens", PROMPT, "--positions", "0,-1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "top prediction at each position" in lines[0] and "target" in lines[1].split()
    rows = [LENS_ROW.match(line) for line in lines[2:]]
    assert len(rows) == 2 * 31 and all(rows), [line for line, row in zip(lines[2:], rows) if not row][:3]
    by_pos = {pos: {row[5] for row in rows if int(row[1]) == pos} for pos in (0, 9)}
    assert by_pos[9] == {"' Paris'"} and len(by_pos[0]) == 1 and by_pos[0] != by_pos[9]
    for row in rows:  # the lens's top token is never less likely than the target (no 0.0000 beside 3.3e-05)
        p_top, p_target = float(row[4]), float(row[6])
        assert p_top >= p_target and row[4] == f"{p_top:.3g}" and row[6] == f"{p_target:.3g}"


def test_lens_with_target_names_it_once(loaded, capsys):
    assert main(["lens", PROMPT, "--target", " Paris", "--positions", "all"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("target ' Paris':") and "target" not in lines[1].split()
    assert "0.0000" not in "\n".join(lines)


def test_predict_target_prints_rank_probability_and_logit(loaded, capsys):
    text = "When Mary and John went to the store, John gave a drink to"
    assert main(["predict", text, "--top", "3", "--target", " Mary"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + 3 + 1 and "' Mary'" in lines[2]
    assert re.fullmatch(r"target ' Mary' \(id 5099\): rank 1, prob 0\.92\d, logit 11\.0\d+", lines[-1])
    assert main(["predict", text, "--top", "3", "--target", " John"]) == 0
    rank = int(re.search(r"rank (\d+),", capsys.readouterr().out.splitlines()[-1])[1])
    assert rank > 3
    assert main(["predict", text, "--target", " Maryland x"]) == 2
    assert capsys.readouterr().err.startswith("resid: error: The target ' Maryland x' is 2 tokens")


def test_neurons_explain_is_compact_unless_all(loaded, capsys):
    args = ["neurons", "explain", "The capital of France is", "--target", " Paris"]
    assert main(args) == 0
    compact = capsys.readouterr().out.splitlines()
    # header 2 + 3 layers x 2 rankings x 5 rows + 1 + 3 x 2 shares + "... 27 more layers"
    assert len(compact) == 2 + 30 + 1 + 6 + 1 and compact[-1].startswith("... 27 more layers (--all")
    assert main(args + ["--all"]) == 0
    full = capsys.readouterr().out.splitlines()
    assert len(full) == 2 + 300 + 1 + 60 and "every layer" in full[0]
    assert set(compact[2:32]) <= set(full)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_llama_notes")
    build("llama", folder)
    return folder


def _noting(monkeypatch, module, name: str, note: str) -> None:
    original = getattr(module, name)

    def with_note(*args, **kwargs):
        df = original(*args, **kwargs)
        df.attrs["notes"] = [note]
        return df

    monkeypatch.setattr(module, name, with_note)


def test_notes_of_an_analysis_are_printed(folder, monkeypatch, capsys):
    lens_note, attr_note = "the lens says hello", "' Paris' is far more likely than 'Paris'"
    _noting(monkeypatch, logit_lens, "run", lens_note)
    _noting(monkeypatch, attribution, "direct", attr_note)
    model = ["--model", str(folder)]
    for argv, expected in ((["lens", "When Mary"], [lens_note]), (["attribute", "When Mary"], [attr_note]),
                           (["decompose", "When Mary", "--level", "sublayer"], [lens_note, attr_note])):
        assert main(argv + model) == 0
        lines = capsys.readouterr().out.splitlines()
        assert [line for line in lines if line.startswith("note: ")] == [f"note: {n}" for n in expected], argv


def test_every_out_says_folder_or_file():
    commands = dict(_subparsers(_parser()))
    kinds = {}
    for name, sub in commands.items():
        out = next((a for a in sub._actions if "--out" in a.option_strings), None)
        if out is not None:
            kinds[name] = "folder" if out.help.startswith("a folder") else "file" if out.help.startswith("a file (.") \
                else None
    assert kinds == {"decompose": "folder", "attribute": "file", "lens": "file", "lens train": "folder",
                     "lens eval": "file", "ablate": "file", "patch": "file", "neurons values": "folder",
                     "neurons top": "folder", "neurons explain": "folder", "neurons edit": "folder",
                     "features values": "folder", "features top": "folder", "train-sae": "folder",
                     "train-transcoder": "folder", "train-clt": "folder", "eval-dictionaries": "folder",
                     "graph": "file", "qk": "file", "circuit": "file", "lens fit-jacobian": "folder"}
    assert "--out is a folder" in cli_main.__doc__


def _raised(call) -> str:
    try:
        call()
    except ResidError as error:
        return str(error)
    raise AssertionError("no ResidError")


def _mean_without_reference(model):
    from resid.analyses import ablation

    ablation.sweep(model, ["a b"], [" c"], method="mean")


def _logit_diff_without_baselines(model):
    from resid.analyses.metrics import check_metric

    check_metric("logit_diff", False)


def _empty_prompt(model):
    model.to_tokens([""], prepend_bos=False)


@pytest.mark.parametrize("call, python, cli", [
    (_mean_without_reference, "method='mean' needs reference texts to average over: give reference (a list of texts, "
     "or a .txt or .jsonl file).", "--method mean needs reference texts to average over: give --reference FILE (a "
     ".txt or .jsonl file)."),
    (_logit_diff_without_baselines, "metric='logit_diff' needs baselines (one per prompt); or use "
     "metric='target_prob'.", '--metric logit_diff needs a "baseline" on every line of --prompts (one per prompt); '
     "or use --metric target_prob."),
    (_empty_prompt, "Prompt(s) [0] tokenize to nothing: give non-empty text (or prepend_bos=True).",
     "Prompt(s) [0] tokenize to nothing: give non-empty text."),
])
def test_errors_name_parameters_in_python_and_flags_on_the_command_line(gpt2_tokenizer, call, python, cli):
    """One message, written once with resid.errors.param: Python spelling by default, the flags under the CLI's
    renderer (no rewriting of message text afterwards)."""
    from random_models import make_random_model

    model = make_random_model("gpt2_like", gpt2_tokenizer)
    assert _raised(lambda: call(model)) == python
    with param_style(render):
        assert _raised(lambda: call(model)) == cli


def test_a_parameter_without_a_flag_keeps_its_python_spelling():
    from resid.errors import param

    with param_style(render):
        assert param("method", "mean") == "--method mean" and param("dtype", torch.float32) == "--dtype float32"
        assert param("check_finite", False) == "check_finite=False"
        # a switch: the flag alone, for the one value it stands for
        assert param("check_unembedding", False) == "--skip-unembedding-check"
        assert param("check_unembedding", True) == "check_unembedding=True"
    assert param("method", "mean") == "method='mean'" and param("dtype", torch.float32) == "dtype=torch.float32"
