"""`resid lens train`, `resid lens eval` and `resid lens --lens tuned` on a tiny random model and a small corpus
file: train writes a lens that a rerun resumes (and does not retrain), and refuses a folder another process is
training into; eval prints both lenses per site and writes the table and figure, the lens command reads the lens in
either layout; bad arguments fail before the model loads."""

import subprocess
import sys
from pathlib import Path

import pytest
from tiny_models import build

from resid.analyses import tuned_lens
from resid.analyses.cli.main import main
from resid.analyses.lenses import formats

WORDS = "the nation budget congress people peace economy world freedom work health school future".split()


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("lens_cli")
    build("llama", root / "model")
    paragraphs = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(12 + i % 5)) + "." for i in range(60)]
    (root / "corpus.txt").write_text("\n\n".join(paragraphs) + "\n")
    return {"model": str(root / "model"), "corpus": str(root / "corpus.txt"), "root": str(root)}


def run(argv: list[str], capsys) -> str:
    code = main(argv)
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


def test_train_eval_and_read_through_the_lens(setup, capsys):
    out = Path(setup["root"]) / "lens"
    train = ["lens", "train", "--model", setup["model"], "--corpus", setup["corpus"], "--out", str(out), "--steps", "3",
             "--tokens-per-step", "32", "--seq-len", "16", "--checkpoint-every", "1", "--quiet"]
    printed = run(train, capsys)
    assert "trained a tuned lens" in printed and "2 translators" in printed
    assert (out / "translators.safetensors").is_file() and (out / "checkpoint.safetensors").is_file()
    first = formats.read_translators(out)
    assert first.info["tokens"] == 96 and len(first.info["losses"]) == 3
    run(train, capsys)  # a finished checkpoint: nothing left to train, the same lens again
    assert formats.read_translators(out).weight.equal(first.weight)

    table = Path(setup["root"]) / "eval.md"
    printed = run(["lens", "eval", "--model", setup["model"], "--corpus", setup["corpus"], "--translators", str(out),
                   "--tokens", "64", "--seq-len", "16", "--out", str(table), "--quiet"], capsys)
    assert "logit KL" in printed and "tuned KL" in printed and "L1 post" in printed
    assert table.is_file() and table.with_suffix(".html").is_file()

    printed = run(["lens", "The nation and the people", "--model", setup["model"], "--translators", str(out),
                   "--every", "layer"], capsys)
    assert printed.startswith("tuned lens (recompute final norm)")


# Another process training a lens into a folder: it holds the folder's checkpoint store (its lock) until told to go.
HOLDER = """
import sys
from resid.analyses.io.checkpoints import StateStore
store = StateStore(sys.argv[1], "resid.tuned_lens.checkpoint", "tuned-lens", {})
print("ready", flush=True)
sys.stdin.readline()
"""


def test_a_second_lens_train_into_the_same_folder_is_refused(setup, capsys, tmp_path):
    out = tmp_path / "busy"
    first = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert first.stdout.readline().strip() == "ready"
        argv = ["lens", "train", "--model", setup["model"], "--corpus", setup["corpus"], "--out", str(out),
                "--steps", "1", "--tokens-per-step", "16", "--seq-len", "16", "--quiet"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"Another process (pid {first.pid}" in err and f"to {out}" in err, err
    finally:
        first.communicate("done\n", timeout=60)
    run(argv, capsys)  # once the first one has gone, the folder is free
    assert (out / "checkpoint.safetensors").is_file()


def test_a_lens_in_tuned_lens_layout_is_read_by_the_lens_command(setup, capsys, tmp_path):
    import resid

    model = resid.load(setup["model"])
    formats.write(tuned_lens.zeros(model).translators.with_info(unembed_hash=formats.unembed_hash(model)), tmp_path,
                  layout="tuned-lens")
    assert (tmp_path / "params.pt").is_file()
    tuned = run(["lens", "The people", "--model", setup["model"], "--lens", "tuned", "--translators", str(tmp_path),
                 "--every", "layer"], capsys)
    plain = run(["lens", "The people", "--model", setup["model"], "--every", "layer"], capsys)
    assert tuned.splitlines()[1:] == plain.splitlines()[1:]  # zero translators: the logit lens's table


def test_a_lens_of_other_weights_names_the_flag_that_reads_it_anyway(setup, capsys, tmp_path):
    import resid

    model = resid.load(setup["model"])
    formats.write(tuned_lens.zeros(model).translators.with_info(unembed_hash="0" * 64), tmp_path)
    argv = ["lens", "The people", "--model", setup["model"], "--translators", str(tmp_path), "--every", "layer"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "another unembedding" in err and "Pass --skip-unembedding-check to read it" in err, err
    assert "check_unembedding" not in err
    assert run([*argv, "--skip-unembedding-check"], capsys).startswith("tuned lens")


def test_fit_a_jlens_evaluate_it_and_read_through_it(setup, capsys):
    out = Path(setup["root"]) / "jlens"
    fit = ["lens", "fit-jacobian", "--model", setup["model"], "--corpus", setup["corpus"], "--out", str(out),
           "--tokens", "32", "--seq-len", "16", "--skip-first", "2", "--block", "8", "--quiet"]
    printed = run(fit, capsys)
    assert "fitted a J-lens" in printed and "2 windows of 16 tokens" in printed
    assert (out / "jacobians.safetensors").is_file() and (out / "checkpoint.safetensors").is_file()
    printed = run(["lens", "eval", "--model", setup["model"], "--corpus", setup["corpus"], "--lens", "jacobian",
                   "--jlens", str(out), "--tokens", "32", "--seq-len", "16", "--quiet"], capsys)
    assert "logit KL" in printed and "jacobian KL" in printed and "tuned KL" not in printed
    printed = run(["lens", "The nation and the people", "--model", setup["model"], "--jlens", str(out), "--every",
                   "layer", "--norm", "frozen"], capsys)
    assert printed.startswith("jacobian lens (frozen final norm)")


NO_MODEL = ["--model", "no-such-model"]
BAD = [
    (["lens", "hi", "--lens", "tuned"], "--lens tuned needs --translators DIR"),
    (["lens", "hi", "--lens", "logit", "--translators", "x"], "--translators is for the tuned lens"),
    (["lens", "hi", "--translators", "no-such-folder"], "No tuned lens in no-such-folder"),
    (["lens", "train", "--out", "o", "--tokens-per-step", "30", "--seq-len", "16"],
     "--tokens-per-step 30 must be a multiple of --seq-len 16"),
    (["lens", "train", "--out", "o", "--steps", "0"], "--steps must be at least 1"),
    (["lens", "train", "--out", "o", "--held-out", "1.5"], "--held-out must be a fraction"),
    (["lens", "train", "--out", "o", "--corpus", "missing.txt"], "missing.txt"),
    (["lens", "eval", "--translators", "no-such-folder"], "No tuned lens in no-such-folder"),
    (["lens", "eval", "--out", "eval.png"], "--out 'eval.png' must end in one of"),
    (["lens", "eval", "--lens", "jacobian"], "--lens jacobian needs --jlens"),
    (["lens", "eval", "--jlens", "no-such-folder"], "no J-lens there"),
    (["lens", "hi", "--lens", "jacobian"], "--lens jacobian needs --jlens"),
    (["lens", "fit-jacobian", "--out", "o", "--tokens", "0"], "--tokens must be at least 1"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[f"{argv[1]} #{i}" for i, (argv, _) in enumerate(BAD)])
def test_bad_arguments_fail_before_the_model_loads(argv, message, capsys):
    assert main([*argv, *NO_MODEL]) == 2
    err = capsys.readouterr().err
    assert err.startswith("resid: error: ") and message in err and "Unknown model" not in err, err


def test_a_prompt_named_like_a_subcommand_is_read_after_a_double_dash(capsys):
    assert main(["lens", *NO_MODEL, "--", "train"]) == 2  # the lens command, which reaches the loader
    assert "Unknown model 'no-such-model'" in capsys.readouterr().err
